"""Foreign load on an instance's pinned CPUs, their SMT siblings and its threads, around the timed window.

The verdict is the worst of: one pinned CPU's busy time beyond the instance's own share (per CPU, never averaged
over the instance: one stolen CPU of 16 counts), an unused SMT sibling's busy time, and the run-queue wait of any
of its working threads (/proc/self/task/*/schedstat). Steal time (the hypervisor's) is reported apart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

CONTAMINATION_THRESHOLD = 0.10  # foreign CPU time as a fraction of the pinned CPUs' window capacity
_TICK = os.sysconf("SC_CLK_TCK")


class CpuTimes(NamedTuple):
    busy: float  # seconds running anything (steal not included)
    total: float
    steal: float  # seconds the hypervisor gave this virtual CPU's time to someone else


def read_cpu_times(cpus, path: str = "/proc/stat") -> dict[int, CpuTimes]:
    """Per CPU: busy, total and steal seconds since boot."""
    wanted = set(cpus)
    times: dict[int, CpuTimes] = {}
    with open(path) as handle:
        for line in handle:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            cpu = int(name[3:])
            if cpu in wanted:
                values = [int(v) for v in fields[:8]] + [0] * (8 - len(fields[:8]))
                idle, steal = values[3] + values[4], values[7]  # idle + iowait; steal
                total = sum(values)
                times[cpu] = CpuTimes((total - idle - steal) / _TICK, total / _TICK, steal / _TICK)
    return times


def read_thread_waits(task_dir: str = "/proc/self/task") -> dict[int, tuple[int, int]]:
    """Per thread of this process: (ns run on a CPU, ns spent runnable but waiting for one) since it started."""
    waits = {}
    for tid in os.listdir(task_dir):
        try:
            run, wait, _ = (int(v) for v in Path(task_dir, tid, "schedstat").read_text().split())
        except (OSError, ValueError):
            continue  # the thread ended, or no schedstats in this kernel
        waits[int(tid)] = (run, wait)
    return waits


def smt_siblings(cpus, exclude=(), root: str = "/sys/devices/system/cpu") -> list[int]:
    """The hyperthread siblings of `cpus` that no instance of the trial is pinned to: work there competes for
    the same cores."""
    from corescale.machine.cpulist import parse_cpulist
    from corescale.machine.topology import read_text

    found: set[int] = set()
    for cpu in cpus:
        found.update(parse_cpulist(read_text(f"{root}/cpu{cpu}/topology/thread_siblings_list") or str(cpu)))
    return sorted(found - set(cpus) - set(exclude))


class Watch:
    """Everything that can steal an instance's window, read before and after it: per pinned CPU busy time
    beyond the instance's own share, SMT siblings' busy time, run-queue waits of its threads, steal time."""

    def __init__(self, cpus, siblings=()):
        self.cpus, self.siblings = list(cpus), list(siblings)

    def start(self) -> None:
        self.cpu_before = read_cpu_times([*self.cpus, *self.siblings])
        self.waits_before = read_thread_waits()

    def stop(self, own_cpu_seconds: float, wall_seconds: float) -> dict:
        from corescale.machine.instance_env import thread_affinities

        after = read_cpu_times([*self.cpus, *self.siblings])
        waits = read_thread_waits()
        ran = {t: (run - self.waits_before.get(t, (0, 0))[0]) / 1e9 for t, (run, _) in waits.items()}
        share = own_share_by_cpu(ran, thread_affinities(), self.cpus, own_cpu_seconds)
        per_cpu = {c: max(after[c].busy - self.cpu_before[c].busy - share[c], 0.0) / wall_seconds
                   for c in self.cpus if c in after and c in self.cpu_before} if wall_seconds > 0 else {}
        siblings = {c: (after[c].busy - self.cpu_before[c].busy) / wall_seconds
                    for c in self.siblings if c in after and c in self.cpu_before} if wall_seconds > 0 else {}
        waited = [(waits[t][1] - self.waits_before[t][1]) / 1e9 / wall_seconds
                  for t in waits if t in self.waits_before and wall_seconds > 0
                  and (waits[t][0] - self.waits_before[t][0]) / 1e9 > 0.1 * wall_seconds]  # threads that worked
        stolen = {c: after[c].steal - self.cpu_before[c].steal for c in self.cpus
                  if c in after and c in self.cpu_before}
        steal = sum(stolen.values())
        parts = {"cpu": max(per_cpu.values(), default=0.0), "smt_sibling": max(siblings.values(), default=0.0),
                 "runqueue_wait": max(waited, default=0.0)}
        return {
            "foreign_cpu_seconds": foreign_seconds(self.cpu_before, after, own_cpu_seconds, self.cpus),
            "foreign_load": min(max(parts.values()), 1.0),  # the worst CPU, sibling or thread: never averaged
            "foreign_parts": parts,
            "foreign_by_cpu": {str(c): v for c, v in per_cpu.items()},
            "sibling_busy": {str(c): v for c, v in siblings.items()},
            "steal_fraction": steal / (wall_seconds * len(self.cpus)) if wall_seconds > 0 else 0.0,
            "steal_by_cpu": {str(c): v / wall_seconds for c, v in stolen.items()} if wall_seconds > 0 else {},
        }


def own_share_by_cpu(ran: dict[int, float], allowed: dict[int, list[int]], cpus, own_cpu_seconds: float
                     ) -> dict[int, float]:
    """This process's CPU seconds on each pinned CPU: each thread's run time over the pinned CPUs it may run on
    (a thread an OpenMP runtime bound to one CPU loads that CPU alone), and what no live thread accounts for (threads
    that ended) spread evenly. Spreading it all evenly would count own threads crowding one CPU as foreign load."""
    cpus = list(cpus)
    share = dict.fromkeys(cpus, 0.0)
    counted = 0.0
    for thread, seconds in ran.items():
        where = [c for c in allowed.get(thread, cpus) if c in share] or cpus
        for cpu in where:
            share[cpu] += seconds / len(where)
        counted += seconds
    rest = max(own_cpu_seconds - counted, 0.0) / max(len(cpus), 1)
    return {cpu: value + rest for cpu, value in share.items()}


def foreign_seconds(before, after, own_cpu_seconds: float, cpus=None) -> float:
    """CPU time the pinned CPUs spent busy on anything but this process (never below zero)."""
    busy = sum(after[c][0] - before[c][0] for c in (cpus or before) if c in after and c in before)
    return max(busy - own_cpu_seconds, 0.0)


def foreign_fraction(foreign_seconds: float, wall_seconds: float, cpus: int) -> float:
    capacity = wall_seconds * cpus
    return foreign_seconds / capacity if capacity > 0 else 0.0


def contamination_message(metrics) -> str:
    """One line for the console about a run whose pinned CPUs were shared with other work."""
    ids = ", ".join(map(str, metrics.contaminated_instances))
    return (f"result contaminated: other processes used {metrics.foreign_load:.0%} of the pinned CPUs of "
            f"instance(s) {ids} during the timed window (threshold {CONTAMINATION_THRESHOLD:.0%})")
