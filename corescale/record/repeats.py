"""Repeats are the unit of uncertainty: a trial's headline interval comes from its repeats (each a fresh set of
processes), never from the calls of one run, whose latencies are autocorrelated and share the run's luck
(the CPU it got, the memory layout, the neighbours). Within-run intervals stay in each record, labelled so."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from corescale.record.stats import t_quantile
from corescale.record.trial import TrialRecord

MIN_REPEATS = 3  # below this, an across-repeat interval or test says too little to print
LISTED = 5  # up to this many repeats are shown one by one where their interval is not; more, as their range
NO_INTERVAL = "no usable 95 % interval"
SPREAD = "95 % CI / repeats"  # a table column of Interval.bounds: the interval, or the repeats where it is not usable


@dataclass(frozen=True)
class Interval:
    """A figure's mean over the repeats, its 95 % interval, and the repeats' own values. The interval is shown only
    where a reader can use it (`usable`); elsewhere the text says what the repeats were."""

    mean: float
    low: float | None  # 95 % Student-t interval over the repeats (of their logs where it would reach 0); None
    #                    with fewer than 2
    high: float | None
    n: int
    values: tuple[float, ...] = ()  # each repeat's figure, in order
    within: tuple[tuple[float, float] | None, ...] = ()  # each repeat's own within-run interval, where known

    @classmethod
    def of(cls, values, within=None) -> Interval:
        """Over `values` (None and non-finite ones skipped); `within`: each value's own (low, high) in that
        run, or None, in the same order."""
        pairs = [(v, w) for v, w in zip(values, within if within is not None else repeat(None))
                 if v is not None and math.isfinite(v)]
        data = np.asarray([v for v, _ in pairs], dtype=float)
        kept = tuple(float(v) for v in data)
        runs = tuple(w for _, w in pairs) if within is not None else ()
        if data.size == 0:
            return cls(math.nan, None, None, 0)
        mean = float(data.mean())
        if data.size < 2:
            return cls(mean, None, None, 1, kept, runs)
        t = t_quantile(0.975, int(data.size) - 1)
        half = t * float(data.std(ddof=1)) / math.sqrt(data.size)
        if mean - half <= 0 < data.min():  # a rate or a time cannot be <= 0: the interval of its logarithm
            logs = np.log(data)
            centre, spread = float(logs.mean()), t * float(logs.std(ddof=1)) / math.sqrt(data.size)
            return cls(mean, math.exp(centre - spread), max(math.exp(centre + spread), mean), int(data.size),
                       kept, runs)
        return cls(mean, mean - half, mean + half, int(data.size), kept, runs)

    @property
    def cv(self) -> float | None:
        """Half-width of the interval over the mean (a relative precision)."""
        if self.low is None or self.high is None or not self.mean:
            return None
        return (self.high - self.low) / 2 / self.mean

    @property
    def wide(self) -> bool:
        """No interval, or one wider than the value itself (high - low > mean): it bounds nothing."""
        return self.low is None or self.high is None or self.high - self.low > abs(self.mean)

    @property
    def past_repeats(self) -> bool:
        """A bound below every repeat or above every repeat: more than what was measured."""
        return bool(self.values) and self.low is not None and self.high is not None and (
            self.low < min(self.values) or self.high > max(self.values))

    @property
    def usable(self) -> bool:
        """Over MIN_REPEATS or more, narrower than the value and within the repeats' range: worth printing."""
        return self.n >= MIN_REPEATS and not self.wide and not self.past_repeats

    def listed(self, digits: int = 2) -> str:
        """The repeats' values, '41.20, 56.60' (each with its within-run interval where known: '41.20 [40.90 –
        41.50]'), or beyond LISTED their range, 'range 12.10 – 14.30'; '' without values."""
        if len(self.values) > LISTED:
            return f"range {min(self.values):.{digits}f} – {max(self.values):.{digits}f}"
        runs = self.within or (None,) * len(self.values)
        return ", ".join(f"{v:.{digits}f}" + ("" if w is None else f" [{w[0]:.{digits}f} – {w[1]:.{digits}f}]")
                         for v, w in zip(self.values, runs))

    def bounds(self, digits: int = 2) -> str:
        """A table cell: 'low – high' where usable, else the repeats ('repeats 41.20, 56.60', 'range 10.00 –
        30.00'); '-' with fewer than 2 (the mean is the one repeat)."""
        if self.usable:
            return f"{self.low:.{digits}f} – {self.high:.{digits}f}"
        if self.n < 2:
            return "-"
        listed = self.listed(digits)
        if not listed:  # a document from before the values were kept
            return f"{self.n} repeats: {NO_INTERVAL}"
        return listed if listed.startswith("range") else f"repeats {listed}"

    def text(self, unit: str, digits: int = 2) -> str:
        """'48.90 QPS (95 % CI 45.10 – 52.70 over 6 repeats)' where usable, else what the repeats were: '48.90 QPS
        (2 repeats: 41.20, 56.60; no usable 95 % interval)', '... (1 repeat: no interval)'."""
        value = f"{self.mean:.{digits}f}" + (f" {unit}" if unit else "")
        if self.usable:
            return f"{value} (95 % CI {self.low:.{digits}f} – {self.high:.{digits}f} over {self.n} repeats)"
        if self.n < 2:
            return f"{value} (1 repeat: no interval)" if self.n else value
        listed = self.listed(digits)
        joiner = ", " if listed.startswith("range") else ": "
        return f"{value} ({self.n} repeats{joiner if listed else ''}{listed}; {NO_INTERVAL})"


@dataclass(frozen=True)
class Headline:
    """One measurement's rate and latencies as its scenario defines them."""

    rate: float | None  # offline: samples/s; server: the max QPS whose p99 met the SLO; single stream: its QPS
    p50_ms: float | None  # at that rate (server: None where no rate met the SLO)
    p99_ms: float | None
    unit: str  # what `rate` counts, for a column's header
    p50_within_ms: tuple[float, float] | None = None  # the p50's own 95 % interval over the run's calls


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
    calls = m.latency_s
    within = (calls.p50_ci95_low * 1e3, calls.p50_ci95_high * 1e3)
    return Headline(m.throughput_samples_per_s, calls.p50 * 1e3, calls.p99 * 1e3, "samples/s",
                    within if all(math.isfinite(b) for b in within) else None)


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
        p50_ms=Interval.of([h.p50_ms for h in found], within=[h.p50_within_ms for h in found]),
        p99_ms=Interval.of(h.p99_ms for h in found),
        unit=found[0].unit if found else None,
    )
