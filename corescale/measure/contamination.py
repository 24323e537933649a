"""Foreign load on an instance's pinned CPUs, from /proc/stat around the timed window."""

from __future__ import annotations

import os

CONTAMINATION_THRESHOLD = 0.10  # foreign CPU time as a fraction of the pinned CPUs' window capacity
_TICK = os.sysconf("SC_CLK_TCK")


def read_cpu_times(cpus, path: str = "/proc/stat") -> dict[int, tuple[float, float]]:
    """Per CPU: (busy seconds, total seconds) since boot."""
    wanted = set(cpus)
    times: dict[int, tuple[float, float]] = {}
    with open(path) as handle:
        for line in handle:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            cpu = int(name[3:])
            if cpu in wanted:
                values = [int(v) for v in fields[:8]]
                idle = values[3] + values[4]  # idle + iowait
                total = sum(values)
                times[cpu] = ((total - idle) / _TICK, total / _TICK)
    return times


def foreign_seconds(before, after, own_cpu_seconds: float) -> float:
    """CPU time the pinned CPUs spent busy on anything but this process (never below zero)."""
    busy = sum(after[c][0] - before[c][0] for c in before if c in after)
    return max(busy - own_cpu_seconds, 0.0)


def foreign_fraction(foreign_seconds: float, wall_seconds: float, cpus: int) -> float:
    capacity = wall_seconds * cpus
    return foreign_seconds / capacity if capacity > 0 else 0.0


def contamination_message(metrics) -> str:
    """One line for the console about a run whose pinned CPUs were shared with other work."""
    ids = ", ".join(map(str, metrics.contaminated_instances))
    return (f"result contaminated: other processes used {metrics.foreign_load:.0%} of the pinned CPUs of "
            f"instance(s) {ids} during the timed window (threshold {CONTAMINATION_THRESHOLD:.0%})")
