"""Statistics of latency samples as properties of one small immutable value object."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import ceil, floor, sqrt

import numpy as np

from corescale.record.sections import LatencySummary

PERCENTILES = (50, 90, 95, 99, 99.9)  # LatencySummary's p50 ... p99_9
MAD_OUTLIER_THRESHOLD = 5.0  # |x - median| / (1.4826 · MAD)
BOOTSTRAP_RESAMPLES = 2000
CHANGE_THRESHOLD = 0.10  # compare: a change smaller than this fraction is not flagged (its default)


# Student's t from scipy.special (a third of a second to import; scipy.stats takes over a second, on every run)
def t_quantile(q: float, df: int) -> float:
    """The q quantile of Student's t with df degrees of freedom."""
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test (unequal variances); a, b with at least 2 values each. Without any
    spread: 1 where the means are equal, else 0."""
    from scipy.special import stdtr

    if np.std(a) == 0 and np.std(b) == 0:
        return 1.0 if a.mean() == b.mean() else 0.0
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    t = (a.mean() - b.mean()) / sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(2 * stdtr(df, -abs(t)))


@dataclass(frozen=True, eq=False)
class Measurement:
    """Latencies in seconds. Every statistic is derived from the raw samples on demand."""

    samples: np.ndarray

    @classmethod
    def from_ns(cls, durations_ns) -> "Measurement":
        return cls(np.asarray(durations_ns, dtype=np.float64) / 1e9)

    @property
    def count(self) -> int:
        return int(self.samples.size)

    @cached_property
    def mean(self) -> float:
        return float(self.samples.mean())

    @cached_property
    def std(self) -> float:
        return float(self.samples.std(ddof=1)) if self.count > 1 else 0.0

    @property
    def min(self) -> float:
        return float(self.samples.min())

    @property
    def max(self) -> float:
        return float(self.samples.max())

    @property
    def cv(self) -> float:
        return self.std / self.mean if self.mean else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.samples, q))

    @property
    def median(self) -> float:
        return self.percentile(50)

    @cached_property
    def mean_ci95(self) -> tuple[float, float]:
        """Student-t interval for the mean."""
        if self.count < 2:
            return (self.mean, self.mean)
        half = t_quantile(0.975, self.count - 1) * self.std / sqrt(self.count)
        return (self.mean - half, self.mean + half)

    @cached_property
    def median_ci95(self) -> tuple[float, float]:
        """Distribution-free interval for the median from order statistics (binomial, normal approx.)."""
        n = self.count
        ordered = np.sort(self.samples)
        if n < 6:  # too few samples for a 95 % order-statistic interval
            return (float(ordered[0]), float(ordered[-1]))
        half = 1.96 * sqrt(n) / 2
        lo = max(int(floor(n / 2 - half)), 0)
        hi = min(int(ceil(n / 2 + half)), n - 1)
        return (float(ordered[lo]), float(ordered[hi]))

    @cached_property
    def mad(self) -> float:
        return float(np.median(np.abs(self.samples - self.median)))

    @cached_property
    def outliers(self) -> int:
        """Samples further than MAD_OUTLIER_THRESHOLD scaled MADs from the median."""
        scale = 1.4826 * self.mad
        if scale == 0:
            return 0
        return int(np.count_nonzero(np.abs(self.samples - self.median) / scale > MAD_OUTLIER_THRESHOLD))

    def summary(self) -> LatencySummary:
        p50, p90, p95, p99, p99_9 = (self.percentile(q) for q in PERCENTILES)
        (mean_low, mean_high), (p50_low, p50_high) = self.mean_ci95, self.median_ci95
        return LatencySummary(count=self.count, mean=self.mean, std=self.std, min=self.min, max=self.max,
                              cv=self.cv, mad=self.mad, outliers=self.outliers, p50=p50, p90=p90, p95=p95, p99=p99,
                              p99_9=p99_9, mean_ci95_low=float(mean_low), mean_ci95_high=float(mean_high),
                              p50_ci95_low=p50_low, p50_ci95_high=p50_high)

    def __repr__(self) -> str:
        lo, hi = self.median_ci95
        return (f"Measurement(n={self.count}, median={self.median * 1e3:.3f} ms "
                f"[{lo * 1e3:.3f}, {hi * 1e3:.3f}], mean={self.mean * 1e3:.3f} ms, cv={self.cv:.1%})")


def bootstrap_ratio_ci(a: np.ndarray, b: np.ndarray, seed: int = 0, stat=np.median) -> tuple[float, float, float]:
    """Ratio stat(b)/stat(a) with a 95 % percentile-bootstrap interval."""
    rng = np.random.default_rng(seed)
    ra = rng.choice(a, size=(BOOTSTRAP_RESAMPLES, a.size))
    rb = rng.choice(b, size=(BOOTSTRAP_RESAMPLES, b.size))
    ratios = stat(rb, axis=1) / stat(ra, axis=1)
    return float(stat(b) / stat(a)), float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def window_throughput(starts_ns, ends_ns, window_start_ns: int, window_end_ns: int, batch_size: int):
    """Samples done inside [window_start, window_end] ÷ window length (s). Returns (samples, samples/s).

    A call that straddles an edge of the window is credited with the fraction of its duration inside it, so an
    instance whose calls do not line up with the window is neither dropped nor counted whole: unbiased for any
    number of instances and batch sizes (dropping straddlers undercounts by about half a call per instance)."""
    starts = np.asarray(starts_ns, dtype=np.float64)
    ends = np.asarray(ends_ns, dtype=np.float64)
    durations = np.maximum(ends - starts, 1.0)
    inside = np.clip(np.minimum(ends, window_end_ns) - np.maximum(starts, window_start_ns), 0.0, None)
    samples = float(batch_size * np.sum(inside / durations))
    length = (window_end_ns - window_start_ns) / 1e9
    return samples, (samples / length if length > 0 else 0.0)


def in_window(starts_ns, ends_ns, window_start_ns: int, window_end_ns: int) -> np.ndarray:
    """Which calls started and ended inside the window (the calls latency statistics are taken from)."""
    starts, ends = np.asarray(starts_ns), np.asarray(ends_ns)
    return (starts >= window_start_ns) & (ends <= window_end_ns)


def ms(seconds: float | None, missing: float | None = None) -> float | None:
    """Seconds -> milliseconds; None gives `missing` (NaN in tables)."""
    return missing if seconds is None else seconds * 1e3
