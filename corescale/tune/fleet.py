"""Tunes on a Ray cluster: `executor=ray executor.node_type=a,b` tunes each node type on its own nodes (trials
fan out, one per node at a time) and ranks the types by cost per 1M inferences at the objective: which machine
to buy, measured.

Before any trial, each node of each type is probed (a Ray task pinned to it): its usable topology and ISA give
that type's search space and placements, and the nodes of one type must agree on them (a type is one machine
kind). The types are tuned side by side, unless two of them have nodes on the same CPUs of one host (a test
cluster on one machine): then one after the other, so no two types' trials share cores.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

from corescale.config import RayExecutorConfig
from corescale.errors import UserError
from corescale.record.files import write_json_atomic
from corescale.tune.document import TuneDocument
from corescale.tune.settings import TuneSettings

RANKING_FILE = "node-types.json"


@dataclass(frozen=True)
class NodeKind:
    """What the probe found on the nodes of one type."""

    node_type: str | None
    nodes: int  # alive benchmark nodes of the type: the tune's trials in flight at once
    topology: object  # machine.topology.Topology of one node (every node of the type has the same shape)
    isa: dict
    cpu_model: str
    cpus: frozenset = frozenset()  # (host, CPU id) of every node's usable CPUs


def host_id() -> str:
    """What tells hosts apart: the kernel's boot id (containers on one host share it), else the hostname."""
    import socket
    from pathlib import Path

    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def probe_node() -> dict:
    """The Ray task: this node's usable topology (its affinity and cgroup included) and CPU."""
    from corescale.machine import environment
    from corescale.machine.topology import Topology
    from corescale.trials.ray import restore_thread_env

    restore_thread_env()
    cpu = environment.cpuinfo()
    return {"topology": Topology.from_sysfs(), "isa": cpu.isa, "cpu_model": cpu.model or "?",
            "host": host_id()}


@contextmanager
def connected(settings: TuneSettings):
    """Ray for a tune with executor=ray (connected here, disconnected after), else None."""
    from corescale.overrides import compose
    from corescale.tune.settings import scenario_overrides

    cfg = compose([*settings.overrides, *scenario_overrides(settings)])
    if not isinstance(cfg.executor, RayExecutorConfig):
        if settings.node_types != [None]:
            raise UserError("executor.node_type needs executor=ray (node types are Ray nodes' labels)")
        yield None
        return
    from corescale.trials.ray import RayExecutor, _ray_initialized, import_ray, is_loopback

    ray = import_ray(loopback=is_loopback(cfg.executor.address) and not _ray_initialized())
    started = RayExecutor(cfg.executor)._connect(ray)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def probe(ray, node_type: str | None) -> NodeKind:
    """Every alive benchmark node of the type, probed at once; one clear line when there is none or they differ."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from corescale.trials.ray import benchmark_nodes, no_node_error

    every = benchmark_nodes(ray)
    nodes = [n for n in every if n.matches(node_type)]
    if not nodes:
        raise no_node_error(node_type, every)
    remote = ray.remote(num_cpus=0, max_retries=1)(probe_node)
    found = ray.get([remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False)).remote()
                     for n in nodes])
    shapes = {(len(f["topology"].physical_cores), len(f["topology"].cpu_ids), f["cpu_model"]) for f in found}
    if len(shapes) > 1:
        described = "; ".join(f"{c} cores / {lc} CPUs ({m})" for c, lc, m in sorted(shapes))
        raise UserError(f"the nodes of type {node_type or '(any)'} differ ({described}): a node type must be "
                        "one machine kind; label them with different corescale_type:<type> resources")
    cpus = frozenset((f["host"], cpu) for f in found for cpu in f["topology"].cpu_ids)
    return NodeKind(node_type, len(nodes), found[0]["topology"], found[0]["isa"], found[0]["cpu_model"], cpus)


def sharing(tunes: list) -> list[tuple[str, str]]:
    """Pairs of node types whose nodes use some same CPU of one host: those cannot tune side by side."""
    return [(str(a.node_type), str(b.node_type)) for i, a in enumerate(tunes) for b in tunes[i + 1:]
            if a.cpus & b.cpus]


def plan(settings: TuneSettings, ray) -> list:
    """One Tune per node type (or the local one), every check made before any trial runs."""
    from corescale.tune.plan import plan_tune, tune_name

    if ray is None:
        return [plan_tune(settings)]
    name = tune_name(settings)  # one folder for the fleet, a subfolder and a study per type
    return [plan_tune(settings.for_node_type(t), kind=probe(ray, t), name=name) for t in settings.node_types]


def rank(entries: list[dict]) -> list[dict]:
    """Node types, cheapest per 1M inferences first (at each type's recommended deployment); a type without a
    recommendation or a price last."""
    def key(entry):
        cost = entry.get("cost_per_1m")
        return (cost is None or not math.isfinite(cost), cost if cost is not None else math.inf)

    ranked = sorted(entries, key=key)
    best = ranked[0].get("cost_per_1m") if ranked else None
    for place, entry in enumerate(ranked, 1):
        entry["rank"] = place
        cost = entry.get("cost_per_1m")
        entry["vs_cheapest"] = cost / best if cost is not None and best else None
    return ranked


def entry(tune, doc: TuneDocument) -> dict:
    """One node type's line of the ranking, from its tune document."""
    winner = doc.winning

    def figure(name: str) -> float | None:
        return None if winner is None else winner.figure(name).mean

    return {"node_type": tune.node_type, "nodes": tune.nodes, "physical_cores": tune.physical_cores,
            "cpu_model": tune.cpu_model, "price_per_hour": None if tune.machine is None else
            tune.machine.price_per_hour, "winner": None if winner is None else winner.label,
            "objective": doc.objective.name, "value": figure(doc.objective.metric),
            "throughput": figure("throughput"), "throughput_ci": None if winner is None else
            [winner.throughput.low, winner.throughput.high],
            "throughput_ci_usable": winner is not None and winner.throughput.usable,  # else the repeats say more
            "throughput_repeats": None if winner is None else list(winner.throughput.values),
            "p99_ms": figure("p99_ms"),
            "cost_per_1m": figure("cost_per_1m"), "speedup": None if doc.speedup is None else doc.speedup.to_dict(),
            "tune_dir": doc.tune_dir}


def fleet_headline(ranked: list[dict]) -> list[str]:
    priced = [e for e in ranked if e.get("cost_per_1m") is not None and math.isfinite(e["cost_per_1m"])]
    if not priced:
        return ["no node type has a recommended deployment with a cost: see each type's tune"]
    best = priced[0]
    lines = [f"cheapest per 1M inferences: node type {best['node_type']} — US$ {best['cost_per_1m']:.4f} with "
             f"{best['winner']} ({best['throughput']:.2f} samples/s on {best['physical_cores']} cores)"]
    lines += [f"node type {e['node_type']}: US$ {e['cost_per_1m']:.4f} per 1M, {e['vs_cheapest']:.2f}× the "
              f"cheapest ({e['winner']}, {e['throughput']:.2f} samples/s on {e['physical_cores']} cores)"
              for e in priced[1:]]
    return lines


def write_ranking(folder, ranked: list[dict]) -> dict:
    doc = {"node_types": ranked, "headline": fleet_headline(ranked)}
    write_json_atomic(folder / RANKING_FILE, doc)
    return doc
