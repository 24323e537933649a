"""Repeats are the unit of uncertainty: a trial's headline interval comes from its repeats (each a fresh set of
processes), never from the calls of one run, whose latencies are autocorrelated and share the run's luck
(the CPU it got, the memory layout, the neighbours). Within-run intervals stay in each record, labelled so."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from corescale.record.stats import t_quantile
from corescale.record.trial import TrialRecord

MIN_REPEATS = 3  # below this, an across-repeat interval or test says too little to print


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float | None  # 95 % Student-t interval over the repeats (of their logs where it would reach 0); None
    #                    with fewer than 2
    high: float | None
    n: int

    @classmethod
    def of(cls, values) -> Interval:
        data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
        if data.size == 0:
            return cls(math.nan, None, None, 0)
        mean = float(data.mean())
        if data.size < 2:
            return cls(mean, None, None, 1)
        t = t_quantile(0.975, int(data.size) - 1)
        half = t * float(data.std(ddof=1)) / math.sqrt(data.size)
        if mean - half <= 0 < data.min():  # a rate or a time cannot be <= 0: the interval of its logarithm
            logs = np.log(data)
            centre, spread = float(logs.mean()), t * float(logs.std(ddof=1)) / math.sqrt(data.size)
            return cls(mean, math.exp(centre - spread), max(math.exp(centre + spread), mean), int(data.size))
        return cls(mean, mean - half, mean + half, int(data.size))

    @property
    def cv(self) -> float | None:
        """Half-width of the interval over the mean (a relative precision)."""
        if self.low is None or self.high is None or not self.mean:
            return None
        return (self.high - self.low) / 2 / self.mean

    def text(self, unit: str, digits: int = 2) -> str:
        if self.low is None:
            return f"{self.mean:.{digits}f} {unit} (1 repeat: no interval)"
        return (f"{self.mean:.{digits}f} {unit} (95 % CI {self.low:.{digits}f} – {self.high:.{digits}f} over "
                f"{self.n} repeats)")


@dataclass(frozen=True)
class AcrossRepeats:
    repeats: int  # valid ones
    failed: int
    throughput: Interval  # samples/s
    p50_ms: Interval
    p99_ms: Interval


def across_repeats(records: list[TrialRecord]) -> AcrossRepeats:
    ok = [r.metrics for r in records if r.valid_ok and r.metrics is not None]
    return AcrossRepeats(
        repeats=len(ok), failed=len(records) - len(ok),
        throughput=Interval.of(m.throughput_samples_per_s for m in ok),
        p50_ms=Interval.of(m.latency_s.p50 * 1e3 for m in ok),
        p99_ms=Interval.of(m.latency_s.p99 * 1e3 for m in ok),
    )
