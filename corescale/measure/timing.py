"""Warmup until stable, then a timed loop: every forward timed with perf_counter_ns, samples kept raw.

perf_counter_ns is CLOCK_MONOTONIC on Linux, one clock for every process, so instances can share a window.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from corescale.config import WarmupConfig

Progress = Callable[[int], None]
PROGRESS_INTERVAL_NS = 100_000_000  # at most 10 progress reports a second, always between calls


@dataclass
class WarmupResult:
    durations_ns: list[int]
    converged: bool


@dataclass
class TimedSamples:
    starts_ns: np.ndarray
    ends_ns: np.ndarray

    @property
    def durations_ns(self) -> np.ndarray:
        return self.ends_ns - self.starts_ns


def is_stable(durations: list[int], window: int, tolerance: float) -> bool:
    """The median of the last `window` calls moved less than `tolerance` from the window before it."""
    if len(durations) < 2 * window:
        return False
    last = statistics.median(durations[-window:])
    before = statistics.median(durations[-2 * window:-window])
    return abs(last - before) <= tolerance * before


def warm_up(call: Callable[[], object], cfg: WarmupConfig, progress: Progress | None = None) -> WarmupResult:
    durations: list[int] = []
    deadline = time.perf_counter_ns() + int(cfg.max_seconds * 1e9)
    while len(durations) < cfg.max_iterations:
        start = time.perf_counter_ns()
        call()
        end = time.perf_counter_ns()
        durations.append(end - start)
        if progress:
            progress(len(durations))
        if len(durations) >= cfg.min_iterations and is_stable(durations, cfg.window, cfg.tolerance):
            return WarmupResult(durations, True)
        if end >= deadline and len(durations) >= cfg.min_iterations:
            break
    return WarmupResult(durations, False)


def wait_until(instant_ns: int) -> None:
    """Sleep coarsely, then spin the last millisecond, so every instance starts at the same instant."""
    while (remaining := instant_ns - time.perf_counter_ns()) > 2_000_000:
        time.sleep((remaining - 1_000_000) / 1e9)
    while time.perf_counter_ns() < instant_ns:
        pass


def timed_loop(call: Callable[[], object], start_ns: int, duration_s: float, min_iterations: int,
               progress: Progress | None = None, stream=None) -> TimedSamples:
    """Runs from start_ns until both duration_s has passed and min_iterations calls are done. `stream` (a binary
    file) gets every call's (start, end) as int64 pairs at each progress report, flushed, so the calls of an
    instance that is killed mid-window survive it."""
    streamed = 0
    deadline = start_ns + int(duration_s * 1e9)
    capacity = 1024
    starts = np.empty(capacity, dtype=np.int64)
    ends = np.empty(capacity, dtype=np.int64)
    count = 0
    next_report = start_ns + PROGRESS_INTERVAL_NS
    wait_until(start_ns)
    clock = time.perf_counter_ns
    while True:
        start = clock()
        call()
        end = clock()
        if count == capacity:
            capacity *= 2
            starts.resize(capacity, refcheck=False)
            ends.resize(capacity, refcheck=False)
        starts[count] = start
        ends[count] = end
        count += 1
        if end >= deadline and count >= min_iterations:
            break
        if end >= next_report:
            if stream is not None:
                streamed = append_pairs(stream, starts, ends, streamed, count)
            if progress:
                progress(count)
            next_report = end + PROGRESS_INTERVAL_NS
    if stream is not None:
        append_pairs(stream, starts, ends, streamed, count)
    return TimedSamples(starts[:count].copy(), ends[:count].copy())


def append_pairs(stream, starts: np.ndarray, ends: np.ndarray, since: int, count: int) -> int:
    """Appends calls since..count as (start, end) int64 pairs, flushed to the kernel; returns count."""
    if count > since:
        stream.write(np.stack([starts[since:count], ends[since:count]], axis=1).tobytes())
        stream.flush()
    return count


def read_pairs(path) -> TimedSamples:
    """What append_pairs wrote (a torn last pair, from a kill mid-write, is dropped)."""
    data = np.fromfile(path, dtype=np.int64)
    data = data[: len(data) // 2 * 2].reshape(-1, 2)
    return TimedSamples(data[:, 0].copy(), data[:, 1].copy())
