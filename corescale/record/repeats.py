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

    def bounds(self, digits: int = 2) -> str:
        """'low – high', or '-' without an interval."""
        return "-" if self.low is None else f"{self.low:.{digits}f} – {self.high:.{digits}f}"

    def text(self, unit: str, digits: int = 2) -> str:
        if self.low is None:
            return f"{self.mean:.{digits}f} {unit} (1 repeat: no interval)"
        return (f"{self.mean:.{digits}f} {unit} (95 % CI {self.low:.{digits}f} – {self.high:.{digits}f} over "
                f"{self.n} repeats)")


@dataclass(frozen=True)
class Headline:
    """One measurement's rate and latencies as its scenario defines them."""

    rate: float | None  # offline: samples/s; server: the max QPS whose p99 met the SLO; single stream: its QPS
    p50_ms: float | None  # at that rate (server: None where no rate met the SLO)
    p99_ms: float | None
    unit: str  # what `rate` counts, for a column's header


def headline(record: TrialRecord) -> Headline | None:
    """The figures a table of repeats shows (None: nothing measured)."""
    served = record.server
    if served is not None:
        met = served.max_valid_qps is not None or served.scenario != "server"
        rate = served.max_valid_qps if served.scenario == "server" else (
            served.steps[-1].completed_qps if served.steps else None)
        lat = served.latency_ms if met else {}
        unit = "QPS at the SLO" if served.scenario == "server" else "QPS"
        return Headline(rate, lat.get("p50"), lat.get("p99"), unit)
    m = record.metrics
    if m is None:
        return None
    return Headline(m.throughput_samples_per_s, m.latency_s.p50 * 1e3, m.latency_s.p99 * 1e3, "samples/s")


@dataclass(frozen=True)
class AcrossRepeats:
    repeats: int  # valid ones with a figure
    failed: int  # repeats that failed or were not valid
    unmet: int  # valid server repeats where no rate met the SLO (no figure)
    throughput: Interval  # samples/s, or QPS (unit)
    p50_ms: Interval
    p99_ms: Interval
    unit: str | None  # None: nothing measured


def across_repeats(records: list[TrialRecord]) -> AcrossRepeats:
    valid = [headline(r) for r in records if r.valid_ok]
    found = [h for h in valid if h is not None and h.rate is not None]
    return AcrossRepeats(
        repeats=len(found), failed=len(records) - len(valid), unmet=len(valid) - len(found),
        throughput=Interval.of(h.rate for h in found),
        p50_ms=Interval.of(h.p50_ms for h in found),
        p99_ms=Interval.of(h.p99_ms for h in found),
        unit=found[0].unit if found else None,
    )
