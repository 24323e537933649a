"""The speed sentinel: a short fixed kernel timed on each measured CPU before and after every trial (and so between
repeats), compared with the first reading of the run.

Foreign processes on the same guest are seen by the contamination check (measure/contamination.py); the sentinel
sees what it cannot: the hypervisor taking the CPU, a neighbour on the host's shared caches and memory bandwidth,
a frequency change. Each reading runs, pinned to one CPU at a time with one BLAS thread, a compute-bound part (a
fixed 192² float32 GEMM, 64 times: ~906 MFLOP) and a memory-bound part (a STREAM-like triad over three 16 MiB float64
arrays, 2 times: ~100 MB of traffic), each 3–10 ms on a current core, timed RUNS times in turn (compute, memory,
compute, ...). A part's time is the median of its RUNS timings: an interrupt or a burst of steal in two of them spoils
none (single GEMM timings of 2.2 ms read 6.4 ms in 2 of 5 runs on an idle Zen 5), while a CPU shared half the time, a
lower clock or a neighbour on the memory bus slows most of them. Each timing spans several scheduler slices, and the
parts alternate, because a thread that slept runs its first milliseconds on the scheduler's credit: a GEMM of 16
products (1.8 ms) timed five times in a row read unchanged beside a busy loop on its CPU in 4 of 4 readings (Zen 5,
Linux 6.18), while the triad timed after it read 1.8× slower. Each CPU's
reference is its first reading (the median of three), replaced by a reading faster than it beyond the tolerance (a
reference taken while the machine was busy heals itself; noise never lowers it). A part slower than its reference
beyond its tolerance marks the reading as moved: TOLERANCE for the GEMM, MEMORY_TOLERANCE for the triad, whose median
of five ranged 3.3–5.0 ms within 3 s on the idle Zen 5 guest (the host's memory bandwidth: only a halving is
taken as moved). A trial with a moved reading is flagged, and `repeats` and a tune's final rounds measure it once more
(trials/local.py). A faster reading never marks a trial: its CPUs were at least as fast as before.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

TOLERANCE = 0.25  # the GEMM 25 % slower than its reference on the same CPU: moved
MEMORY_TOLERANCE = 1.0  # the triad twice as slow (an idle guest's triad ranged 1.6x within seconds)
RUNS = 5  # timings of each part per reading, their median kept
GEMM_SIZE, GEMM_REPS = 192, 64
TRIAD_ELEMENTS, TRIAD_REPS = 1 << 21, 2  # three float64 arrays of 16 MiB: beyond one CCD's 32 MiB L3 together


@dataclass(frozen=True)
class Timing:
    """One CPU's part times (milliseconds) in one reading."""

    compute_ms: float
    memory_ms: float


@dataclass
class _Kernel:
    """The fixed operands, made once per process (their first touch is not timed)."""

    a: Any = None
    b: Any = None
    x: Any = None
    y: Any = None
    z: Any = None

    def ready(self) -> _Kernel:
        if self.a is None:
            import numpy as np

            rng = np.random.default_rng(0)
            self.a = rng.standard_normal((GEMM_SIZE, GEMM_SIZE), dtype=np.float32)
            self.b = rng.standard_normal((GEMM_SIZE, GEMM_SIZE), dtype=np.float32)
            self.x, self.y, self.z = (np.ones(TRIAD_ELEMENTS) for _ in range(3))
        return self

    def compute(self) -> float:
        import numpy as np

        began = time.perf_counter()
        for _ in range(GEMM_REPS):
            np.matmul(self.a, self.b)
        return (time.perf_counter() - began) * 1e3

    def memory(self) -> float:
        import numpy as np

        began = time.perf_counter()
        for _ in range(TRIAD_REPS):
            np.multiply(self.y, 3.0, out=self.z)
            np.add(self.z, self.x, out=self.z)
        return (time.perf_counter() - began) * 1e3


_KERNEL = _Kernel()


def time_cpus(cpus) -> dict[int, Timing]:
    """Each part on each CPU in turn, this thread pinned there with one BLAS thread; its affinity is restored."""
    from threadpoolctl import threadpool_limits

    kernel = _KERNEL.ready()
    mine = os.sched_getaffinity(0)
    found: dict[int, Timing] = {}
    try:
        with threadpool_limits(1):
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})
                kernel.compute()  # the first call after a move pays the migration: not timed
                pairs = [(kernel.compute(), kernel.memory()) for _ in range(RUNS)]  # alternated: the same moments
                found[cpu] = Timing(_median([c for c, _ in pairs]), _median([m for _, m in pairs]))
    finally:
        os.sched_setaffinity(0, mine)
    return found


@dataclass
class Sentinel:
    """The run's sentinel: its first reading on each CPU (the median of three), replaced part by part by a reading
    faster beyond the tolerance, is the reference of every later one."""

    tolerance: float = TOLERANCE
    memory_tolerance: float = MEMORY_TOLERANCE
    first: dict[int, Timing] = field(default_factory=dict)

    def read(self, cpus, phase: str) -> dict:
        """One reading on `cpus` as the record keeps it: per CPU times, the worst ratio to the reference (a part's
        time ÷ its reference's: 1.0 = unchanged, below 1 faster; far faster replaces the reference) and
        whether it moved (a part slower beyond its tolerance)."""
        timings = time_cpus(cpus)
        new = [cpu for cpu in timings if cpu not in self.first]
        if new:  # the reference of a CPU is the median of three readings: one interrupted reading spoils none
            again = [time_cpus(new) for _ in range(2)]
            for cpu in new:
                self.first[cpu] = Timing(*(_median([getattr(t[cpu], part) for t in (timings, *again)])
                                           for part in ("compute_ms", "memory_ms")))
        compute = _worst([now.compute_ms / self.first[cpu].compute_ms for cpu, now in timings.items()])
        memory = _worst([now.memory_ms / self.first[cpu].memory_ms for cpu, now in timings.items()])
        for cpu, now in timings.items():  # far faster: the reference was taken on slowed CPUs (noise never lowers it)
            self.first[cpu] = Timing(_healed(now.compute_ms, self.first[cpu].compute_ms, self.tolerance),
                                     _healed(now.memory_ms, self.first[cpu].memory_ms, self.memory_tolerance))
        # which part moved tells the cause apart: both (the CPU's time or clock: steal, frequency, a process on it),
        # the memory part only (a neighbour on the shared caches and memory bandwidth)
        return {"at": time.time(), "phase": phase,
                "compute_ms": {str(c): round(t.compute_ms, 3) for c, t in timings.items()},
                "memory_ms": {str(c): round(t.memory_ms, 3) for c, t in timings.items()},
                "ratio": round(_worst([compute, memory]), 4),
                "moved": moved(compute, self.tolerance) or moved(memory, self.memory_tolerance),
                "compute_ratio": round(compute, 4), "memory_ratio": round(memory, 4)}


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _healed(now: float, reference: float, tolerance: float) -> float:
    """The reference, or this reading where it is faster beyond the tolerance."""
    return now if now * (1 + tolerance) < reference else reference


def _worst(ratios: list[float]) -> float:
    """The slowest ratio; when none is slower than its reference, the one farthest below 1 (1.0 for none)."""
    return max(ratios) if ratios and max(ratios) >= 1 else min(ratios, default=1.0)


def moved(ratio: float, tolerance: float = TOLERANCE) -> bool:
    """Slower than the reference beyond the tolerance (faster never moves a reading)."""
    return ratio > 1 + tolerance


_RUN = Sentinel()


def run_sentinel() -> Sentinel:
    """This process's sentinel: one per run (a `corescale run`, a tune), whose first reading is the reference."""
    return _RUN
