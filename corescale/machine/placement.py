"""Deterministic placement of inference instances onto physical cores and NUMA nodes.

Units are physical cores. Cores are handed out NUMA node by node (ascending), within a node
by lowest CPU id; an instance stays inside one NUMA node whenever one has room for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corescale.errors import UserError
from corescale.machine.cgroup import quota_cpus, read_limits
from corescale.machine.cpulist import format_cpulist
from corescale.machine.topology import Topology, plural

LAYOUTS = ("latency", "throughput", "max")  # the named layouts (config.LAYOUTS adds none: the sizes as given)
LATENCY_CORES = 4  # cores per instance in latency layout, as Intel's launcher


@dataclass(frozen=True)
class InstancePlacement:
    id: int
    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]  # memory is bound to these
    threads: int  # == len(cpus)

    def __post_init__(self) -> None:
        if self.threads != len(self.cpus):
            raise ValueError(f"instance {self.id}: threads={self.threads} but {len(self.cpus)} CPUs")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cpus": list(self.cpus),
            "cpulist": format_cpulist(self.cpus),
            "numa_nodes": list(self.numa_nodes),
            "threads": self.threads,
        }


@dataclass(frozen=True)
class InstanceSpec:
    """One instance as it runs: where it is placed, the threads it really uses (the `threads` override applied
    once, here), its batch, where it writes its samples, and the machine's GEMM peak on its CPUs (peak.py)."""

    placement: InstancePlacement
    threads: int
    batch_size: int
    samples_path: str = ""
    peak: dict | None = None  # peak.gemm_peak()'s entry for these CPUs, threads and precision; None = not known

    @property
    def id(self) -> int:
        return self.placement.id

    @property
    def cpus(self) -> tuple[int, ...]:
        return self.placement.cpus

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return self.placement.numa_nodes

    def to_json(self) -> dict[str, Any]:
        return {**self.placement.to_dict(), "threads": self.threads, "batch_size": self.batch_size,
                "samples_path": self.samples_path, "peak": self.peak}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstanceSpec:
        cpus = tuple(data["cpus"])
        placement = InstancePlacement(data["id"], cpus, tuple(data.get("numa_nodes") or ()), len(cpus))
        return cls(placement, data["threads"], data["batch_size"], data.get("samples_path", ""), data.get("peak"))


def instance_specs(plan: Plan, threads: int | None, batch_size: int, work_dir=None) -> list[InstanceSpec]:
    """The plan's instances as they run: the `threads` override (None = one per CPU) is applied here and
    nowhere else; samples go to work_dir."""
    specs = []
    for inst in plan.instances:
        n = inst.threads if threads is None else threads
        path = str(Path(work_dir) / f"samples-{inst.id}.npz") if work_dir else ""
        specs.append(InstanceSpec(inst, n, batch_size, path))
    return specs


@dataclass(frozen=True)
class Plan:
    instances: tuple[InstancePlacement, ...]
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for inst in self.instances:  # instances must never share a CPU
            if seen & set(inst.cpus):
                raise ValueError(f"instance {inst.id} overlaps CPUs {format_cpulist(seen & set(inst.cpus))}")
            seen |= set(inst.cpus)

    def to_dict(self) -> dict[str, Any]:
        return {"instances": [i.to_dict() for i in self.instances], "warnings": list(self.warnings)}


def plan(
    topology: Topology,
    instances: int | None = None,
    cores_per_instance: int | None = None,
    layout: str | None = None,
    use_logical_cores: bool = False,
) -> Plan:
    """Place `instances` x `cores_per_instance` physical cores, or follow a named `layout`."""
    _check_count("instances", instances)
    _check_count("cores_per_instance", cores_per_instance)
    if layout is not None and layout not in LAYOUTS:
        raise UserError(f"unknown layout '{layout}': expected one of {', '.join(LAYOUTS)}")
    free = {node: list(topology.cores_in_node(node)) for node in topology.numa_nodes}
    total = len(topology.physical_cores)
    warnings: list[str] = []

    if layout == "throughput":  # one instance per NUMA node, all of its cores
        if instances is not None or cores_per_instance is not None:
            raise UserError(
                "layout 'throughput' runs one instance per NUMA node on all its cores: "
                "do not also set instances or cores_per_instance"
            )
        sizes = [len(cores) for cores in free.values()]
    else:
        if layout is not None:  # latency / max fix the cores per instance
            per = LATENCY_CORES if layout == "latency" else 1
            if cores_per_instance is not None:
                raise UserError(
                    f"layout '{layout}' uses {plural(per, 'core')} per instance: do not also set cores_per_instance"
                )
            if per > total:
                warnings.append(f"layout '{layout}' wants {per} cores per instance; only {total} usable, using {total}")
                per = total
            if instances is None:  # as many as fit without spanning nodes, else as many as fit at all
                instances = sum(len(cores) // per for cores in free.values()) or total // per
        else:
            instances = 1 if instances is None else instances
            per = cores_per_instance if cores_per_instance is not None else total // instances
        if per < 1 or instances * per > total:
            raise UserError(_cannot_place(topology, instances, per if per >= 1 else None))
        sizes = [per] * instances

    placed = []
    for i, need in enumerate(sizes):
        largest = max(len(cores) for cores in free.values())
        cores, nodes = _take(free, need)
        if len(nodes) > 1:
            warnings.append(
                f"instance {i} spans NUMA nodes {','.join(map(str, nodes))} "
                f"(needs {need} cores; largest free node has {largest})"
            )
        cpus = tuple(sorted(cpu for core in cores for cpu in (core if use_logical_cores else core[:1])))
        placed.append(InstancePlacement(id=i, cpus=cpus, numa_nodes=nodes, threads=len(cpus)))
    return Plan(instances=tuple(placed), warnings=tuple(warnings))


def within_quota(topology: Topology, quota: float | None, use_logical_cores: bool = False) -> Topology:
    """The topology a layout sized from the machine is placed on under a CPU quota: its first physical cores (in
    the order plan() hands them out) holding at most the quota's whole CPUs of busy threads (one per core, or one
    per sibling with use_logical_cores; at least one core); the whole topology without a quota."""
    most = quota_cpus(quota)
    if most is None:
        return topology
    kept: list[int] = []
    used = 0
    for core in (core for node in topology.numa_nodes for core in topology.cores_in_node(node)):
        cost = len(core) if use_logical_cores else 1
        if kept and used + cost > most:
            break
        kept += core
        used += cost
    if len(kept) == len(topology.cpus):
        return topology
    return Topology(tuple(cpu for cpu in topology.cpus if cpu.id in set(kept)))


def topology_here(use_logical_cores: bool = False, sized_by_machine: bool = True) -> Topology:
    """This machine's usable CPUs (online, in this process's affinity and cgroup cpuset); a layout sized from the
    machine (sized_by_machine: no cores_per_instance given) also within the cgroup's CPU quota."""
    topology = Topology.from_sysfs()
    return within_quota(topology, read_limits().quota, use_logical_cores) if sized_by_machine else topology


def _take(free: dict[int, list[tuple[int, ...]]], need: int) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """Remove `need` cores from `free`: first node that holds them all, else fewest (largest) nodes."""
    fit = next((node for node, cores in free.items() if len(cores) >= need), None)
    if fit is not None:
        chosen = [fit]
    else:
        chosen, got = [], 0
        for node in sorted(free, key=lambda n: (-len(free[n]), n)):
            if got >= need:
                break
            chosen.append(node)
            got += len(free[node])
    taken: list[tuple[int, ...]] = []
    for node in chosen:
        k = min(need - len(taken), len(free[node]))
        taken += free[node][:k]
        del free[node][:k]
    assert len(taken) == need, "caller checked capacity"
    return taken, tuple(sorted(chosen))


def _cannot_place(topology: Topology, instances: int, per: int | None) -> str:
    total = len(topology.physical_cores)
    sizes = [len(topology.cores_in_node(n)) for n in topology.numa_nodes]
    node_sizes = str(sizes[0]) if len(set(sizes)) == 1 else "+".join(map(str, sizes))
    what = f"{plural(instances, 'instance')} x {plural(per, 'core')}" if per else plural(instances, "instance")
    per = per or 1
    most = total // per
    fit = f"at most {plural(most, 'instance')} of {plural(per, 'core')} {'fits' if most == 1 else 'fit'}"
    if most == 0:
        fit = f"no instance of {plural(per, 'core')} fits"
    return (
        f"cannot place {what}: {plural(total, 'physical core')} usable "
        f"({plural(len(topology.sockets), 'socket')}, {plural(len(sizes), 'NUMA node')} of {node_sizes}); {fit}"
    )


def _check_count(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserError(f"{name} must be a whole number >= 1 (got {value!r})")


