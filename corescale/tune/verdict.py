"""From measurements to a recommendation: each measurement's figures and constraint violations, the finalists
ranked by their mean over repeats (fresh processes each) with 95 % intervals, statistical ties, and the ratio
to the out-of-box baseline with its bootstrap interval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from corescale.record.repeats import Interval
from corescale.record.stats import bootstrap_ratio_ci, welch_p
from corescale.record.trial import TrialRecord
from corescale.tune.settings import CONSTRAINTS, Objective, TuneSettings

ALPHA = 0.05
PRACTICAL = 0.05  # tied means this close are the same in practice: fewer cores, then fewer settings, first


def figures(record: TrialRecord, cost_of=None) -> dict:
    """The figures of one measurement that objectives and constraints read (None where not measured).
    cost_of(record) -> US$ per 1M inferences (or None without a price)."""
    m = record.metrics
    served = record.server if record.server and record.server.scenario == "server" else None
    if m is None and served is None:
        return {"valid": False}
    drift = record.drift
    figs = {
        "valid": record.valid,
        "ok": record.ok,  # a drift failure is valid (real figures) but not ok (wrong outputs)
        "drift": drift.max_rel_error if drift else None,
        "drift_ok": drift.within_tolerance if drift else True,
        "quality": quality_figure(record),
        "quality_ok": record.quality.passed is not False if record.quality else True,
        "cost_per_1m": cost_of(record) if cost_of else None,
    }
    if served is not None:  # LoadGen's figures at the highest rate that met the SLO (none met it: no value)
        met = served.max_valid_qps is not None
        rss = sum(inst.resident_bytes for inst in record.instance_reports)
        return {**figs, "server_qps": served.max_valid_qps, "throughput": served.max_valid_qps,
                "p50_ms": served.latency_ms.get("p50") if met else None,
                "p99_ms": served.latency_ms.get("p99") if met else None, "memory_gb": rss / 1e9,
                "open_ended": open_ended(served),
                # no rate met the SLO before a bound ended the search: unknown, not 0 (nor "none can")
                "unestablished": served.unestablished, "lowest_miss": lowest_miss(served)}
    assert m is not None, "neither served nor measured returned above"
    rss = sum((inst.rss_bytes or inst.peak_rss_bytes) for inst in m.per_instance)
    tokens = m.throughput_tokens_per_s / m.throughput_samples_per_s if m.throughput_samples_per_s else None
    if figs["cost_per_1m"] is not None and tokens:  # real tokens per sample (padding not counted)
        figs["cost_per_1m_tokens"] = figs["cost_per_1m"] / tokens
    return {**figs, "throughput": m.throughput_samples_per_s, "p50_ms": m.latency_s.p50 * 1e3,
            "p99_ms": m.latency_s.p99 * 1e3, "memory_gb": rss / 1e9}


def open_ended(served) -> bool:
    """Whether a QPS search's best rate is only a lower bound: its wall-time bound ended it before its bracket
    narrowed to its precision (with no rate above the best missed, or with a miss well above it: out-of-box
    PyTorch met 38.65 QPS and missed 77.3, its max anywhere between)."""
    return bool(served.bounded) and served.max_valid_qps is not None


def lowest_miss(served) -> float | None:
    """Where no rate met the SLO: the lowest rate tested (the configuration serves less than it at the SLO)."""
    if served.max_valid_qps is not None:
        return None
    rates = [float(point.target_qps) for point in getattr(served, "load_curve", None) or [] if point.target_qps]
    return min(rates) if rates else None


def quality_figure(record: TrialRecord) -> float | None:
    """The first metric of the quality gate (embed: cosine p1), the one a table shows."""
    q = record.quality
    if q is None or not q.gate:
        return None
    return q.metrics.get(q.gate[0].split(">")[0].split("<")[0])


def samples_per_s(record: TrialRecord) -> float | None:
    """The rate a deployment sustains: closed-loop throughput, or the server scenario's max valid QPS."""
    if record.server and record.server.scenario == "server":
        return record.server.max_valid_qps
    return record.metrics.throughput_samples_per_s if record.metrics else None


def violations(figs: dict, settings: TuneSettings) -> dict[str, float]:
    """Per constraint, how far over its limit a measurement is (<= 0: met). The drift check of a reduced
    precision counts as a constraint of its own (its tolerance is the limit)."""
    out = {}
    for key, (metric, _) in CONSTRAINTS.items():
        limit = getattr(settings, key)
        value = figs.get(metric)
        if limit is not None and key != "max_drift":
            out[key] = (value - limit) if value is not None else math.inf
    out["drift_check"] = 0.0 if figs.get("drift_ok", True) else 1.0
    out["quality_check"] = 0.0 if figs.get("quality_ok", True) else 1.0  # min_quality: a withheld configuration
    return out


def feasible(figs: dict, settings: TuneSettings) -> bool:
    return figs.get("valid", False) and all(v <= 0 for v in violations(figs, settings).values())


@dataclass
class Finalist:
    label: str
    overrides: list[str]
    records: list[TrialRecord]
    paths: list[str]
    figures: list[dict]
    baseline: bool = False
    complexity: int = 0  # settings away from the defaults: the simpler first in a tie
    cores: int = 0
    peer: bool = False  # the peer baseline (tune/peer.py): measured, never ranked

    def interval(self, metric: str) -> Interval:
        return Interval.of(f[metric] for f in self.figures if f.get("valid") and f.get(metric) is not None)

    def values(self, metric: str) -> np.ndarray:
        return np.asarray([f[metric] for f in self.figures if f.get("valid") and f.get(metric) is not None],
                          dtype=float)

    def feasible(self, settings: TuneSettings) -> bool:
        """Every repeat measured and meets every constraint (the SLO on the mean p99)."""
        if not self.figures or not all(f.get("valid") for f in self.figures):
            return False
        mean = {k: self.interval(k).mean for k in ("p99_ms", "memory_gb")}
        mean["valid"], mean["drift_ok"] = True, all(f.get("drift_ok", True) for f in self.figures)
        mean["quality_ok"] = all(f.get("quality_ok", True) for f in self.figures)
        return feasible(mean, settings)

    @property
    def open_ended(self) -> bool:
        """Some repeat's QPS is only a lower bound (open_ended): a ratio over this one is then an upper bound."""
        return any(f.get("valid") and f.get("open_ended") for f in self.figures)

    @property
    def serves_below(self) -> float | None:
        """Where no repeat met the SLO at any rate tested: a rate it serves less than (the highest of the repeats'
        lowest misses: the weakest claim they make together); None where a repeat met it or none was tested."""
        if not self.figures or any(f.get("throughput") is not None for f in self.figures):
            return None
        misses = [f.get("lowest_miss") for f in self.figures]
        return None if any(m is None for m in misses) else max(m for m in misses if m is not None)

    @property
    def quality_withheld(self) -> bool:
        """Measured, but its outputs miss the quality gate on real text: never recommended."""
        return any(f.get("valid") and not f.get("quality_ok", True) for f in self.figures)


@dataclass
class Verdict:
    ranked: list[Finalist]  # feasible finalists, best first (a tie's simpler member first)
    infeasible: list[Finalist]
    baseline: Finalist | None
    tie: list[str] = field(default_factory=list)  # labels statistically tied with the winner
    tie_p: float | None = None
    tie_simpler_first: bool = False  # some tied mean was within PRACTICAL of the best: it went by cores, settings
    speedup: tuple[float, float, float] | None = None  # winner ÷ baseline throughput, 95 % bootstrap CI
    peer: Finalist | None = None  # the peer baseline, when measured
    peer_speedup: tuple[float, float, float] | None = None  # winner ÷ peer throughput, 95 % bootstrap CI
    speedup_at_least: float | None = None  # winner ÷ a rate the baseline serves less than (no rate of it met the SLO)

    @property
    def winner(self) -> Finalist | None:
        return self.ranked[0] if self.ranked else None


def same(a: np.ndarray, b: np.ndarray) -> tuple[bool, float]:
    """(no significant difference, p) by Welch's t-test on the logarithms (figures scale as ratios)."""
    if a.size < 2 or b.size < 2:
        return False, math.nan
    p = welch_p(np.log(a), np.log(b))
    return p >= ALPHA, p


def decide(finalists: list[Finalist], baseline: Finalist | None, objective: Objective,
           settings: TuneSettings, peer: Finalist | None = None) -> Verdict:
    metric = objective.metric
    candidates = [*finalists, *([baseline] if baseline is not None else [])]  # out-of-box may be the best here
    good = [f for f in candidates if f.feasible(settings) and f.values(metric).size]
    bad = [f for f in finalists if f not in good]
    sign = -1 if objective.direction == "maximize" else 1
    good.sort(key=lambda f: sign * f.interval(metric).mean)
    verdict = Verdict(good, bad, baseline, peer=peer)
    if good:
        best = good[0]
        tied = [f for f in good[1:] if same(best.values(metric), f.values(metric))[0]]
        if tied:
            group = [best, *tied]
            top = best.interval(metric).mean

            def close(f: Finalist) -> bool:  # within PRACTICAL of the best mean: the same in practice
                return abs(f.interval(metric).mean / top - 1) <= PRACTICAL

            def order(f: Finalist):  # the practically same: the cheaper/simpler first
                mean = f.interval(metric).mean
                return (0, f.cores, f.complexity, sign * mean) if close(f) else (1, 0, 0, sign * mean)

            group.sort(key=order)
            verdict.tie = [f.label for f in group]
            verdict.tie_simpler_first = any(close(f) for f in tied)
            verdict.tie_p = min(same(best.values(metric), f.values(metric))[1] for f in tied)
            verdict.ranked = group + [f for f in good if f not in group]
        if baseline is not None and baseline.values("throughput").size:
            verdict.speedup = bootstrap_ratio_ci(baseline.values("throughput"),
                                                 verdict.ranked[0].values("throughput"), stat=np.mean)
        elif baseline is not None and baseline.serves_below and verdict.ranked[0] is not baseline:
            verdict.speedup_at_least = verdict.ranked[0].interval("throughput").mean / baseline.serves_below
        if peer is not None and peer.values("throughput").size:
            verdict.peer_speedup = bootstrap_ratio_ci(peer.values("throughput"),
                                                      verdict.ranked[0].values("throughput"), stat=np.mean)
    return verdict


def _contenders(finalists: list[Finalist], settings: TuneSettings) -> list[Finalist]:
    """The feasible finalists with an interval (the peer never), the best mean first."""
    metric = settings.objective.metric
    good = [f for f in finalists if not f.peer and f.feasible(settings) and f.values(metric).size >= 2]
    sign = 1 if settings.objective.direction == "maximize" else -1
    return sorted(good, key=lambda f: -sign * f.interval(metric).mean)


def separated(finalists: list[Finalist], settings: TuneSettings) -> bool:
    """Whether the leader (the best mean of the feasible finalists, the baseline included, the peer not) is
    separated: its 95 % interval clear of every other candidate's, so more repeats would not change the order."""
    metric = settings.objective.metric
    good = _contenders(finalists, settings)
    if len(good) < 2 or len(good) < sum(1 for f in finalists if not f.peer):
        return False  # a finalist without an interval (or infeasible so far) could still change the order
    nan = math.nan  # a missing bound compares false: not separated
    bounds = [(nan if i.low is None else i.low, nan if i.high is None else i.high)
              for i in (f.interval(metric) for f in good)]
    (low, high), others = bounds[0], bounds[1:]
    if settings.objective.direction == "maximize":
        return all(low > other_high for _, other_high in others)
    return all(high < other_low for other_low, _ in others)


def leader_wide(finalists: list[Finalist], settings: TuneSettings) -> bool:
    """Whether the leader's own 95 % interval is wider than its value (Interval.wide): separated or not, its
    figure would be printed as its repeats, so another repeat, where the budget allows, is worth taking."""
    good = _contenders(finalists, settings)
    return bool(good) and good[0].interval(settings.objective.metric).wide


def closest(finalists: list[Finalist], settings: TuneSettings) -> Finalist | None:
    """With nothing feasible: the measured finalist that misses the constraints by the least (relative)."""
    def miss(f: Finalist) -> float:
        total = 0.0
        for key, (metric, _) in CONSTRAINTS.items():
            limit = getattr(settings, key)
            if limit is not None and key != "max_drift":
                value = f.interval(metric).mean
                total += max(0.0, (value - limit) / limit) if math.isfinite(value) else math.inf
        wrong = not all(x.get("drift_ok", True) and x.get("quality_ok", True) for x in f.figures)
        return total + (1e6 if wrong else 0)

    measured = [f for f in finalists if f.figures and any(x.get("valid") for x in f.figures)]
    return min(measured, key=miss) if measured else None
