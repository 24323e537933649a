"""Two result roots, trials matched by what they measure: what got faster or slower, and is it significant.

The unit of uncertainty is the repeat (`repeats=N`, fresh processes each): two back-to-back runs of one config
differ by 10-20 % here while the calls of one run agree to a fraction of a percent, so a test over one run's calls
would call every rerun significant. Each side's repeats give one p50 each; Welch's t-test on their logarithms
(latency changes are ratios) and a bootstrap 95 % interval of the ratio of their means (after / before) decide.
A change is flagged when it is significant (p < ALPHA and the interval excludes 1) and larger than the threshold;
with fewer than MIN_REPEATS repeats on a side the verdict says so instead of printing a p-value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from corescale.analysis.store import normalise_value, ok_rows
from corescale.errors import UserError
from corescale.record.repeats import MIN_REPEATS
from corescale.record.stats import CHANGE_THRESHOLD, bootstrap_ratio_ci, welch_p

ALPHA = 0.05
DEFAULT_THRESHOLD = CHANGE_THRESHOLD
def measured_keys(frames: list[pd.DataFrame]) -> list[str]:
    """Every measured config key of the trials (config.key_fields(): exactly what trial keys hash), as the
    results table names its columns (`backend` for backend.name)."""
    keys = dict.fromkeys(_column(k) for frame in frames if "measured" in frame
                         for text in frame["measured"].dropna() for k in json.loads(text))
    return list(keys)


def _column(key: str) -> str:
    return "backend" if key == "backend.name" else key


def _identity(text: str, ignore: set[str]) -> str:
    """A trial's measured fields less the ignored ones: two trials match when these are equal."""
    fields = {k: v for k, v in json.loads(text).items() if _column(k) not in ignore}
    return json.dumps({k: normalise_value(v) for k, v in fields.items()}, sort_keys=True)


@dataclass
class LatencyTest:
    ratio: float  # median(after) / median(before), raw samples
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA and not (self.ci_low <= 1.0 <= self.ci_high)


def describe_ratio(ratio: float) -> str:
    """pyperf style: '1.52x slower (+52%)' / '1.25x faster (-20%)'."""
    if abs(ratio - 1) < 0.005:
        return "1.00x (same)"
    if ratio > 1:
        return f"{ratio:.2f}x slower (+{(ratio - 1) * 100:.0f}%)"
    return f"{1 / ratio:.2f}x faster (-{(1 - ratio) * 100:.0f}%)"


def repeat_test(before_p50: list[float], after_p50: list[float], seed: int = 0) -> LatencyTest | None:
    """Across repeats (each a fresh set of processes: the unit of uncertainty): Welch's t-test on the repeats' p50s
    and a bootstrap interval of the ratio of their means. None below MIN_REPEATS on either side."""
    a, b = np.asarray(before_p50, dtype=float), np.asarray(after_p50, dtype=float)
    if a.size < MIN_REPEATS or b.size < MIN_REPEATS:
        return None
    _, low, high = bootstrap_ratio_ci(a, b, seed=seed, stat=np.mean)
    la, lb = np.log(a), np.log(b)  # latencies scale multiplicatively: test the ratio, on the log scale
    return LatencyTest(float(b.mean() / a.mean()), low, high, welch_p(la, lb))


def verdict(test: LatencyTest | None, threshold: float, repeats: tuple[int, int] = (0, 0)) -> str:
    if test is None:
        return f"not enough repeats to tell ({repeats[0]} vs {repeats[1]}; need {MIN_REPEATS} each: repeats=N)"
    if not test.significant:
        return "no significant change"
    direction = "slower" if test.ratio > 1 else "faster"
    return direction if abs(test.ratio - 1) >= threshold else f"{direction} (below threshold)"


@dataclass
class Comparison:
    rows: pd.DataFrame  # one per matched trial
    only_before: list[str]
    only_after: list[str]
    threshold: float

    @property
    def regressions(self) -> int:
        return int((self.rows["verdict"] == "slower").sum()) if not self.rows.empty else 0

    @property
    def improvements(self) -> int:
        return int((self.rows["verdict"] == "faster").sum()) if not self.rows.empty else 0


def _match_key(frame: pd.DataFrame, ignore: set[str]) -> pd.Series:
    return frame["measured"].map(lambda text: _identity(text, ignore)).astype(object)


def _labels(frame: pd.DataFrame, varying: list[str]) -> list[str]:
    """What tells a trial apart from the others (keys a trial does not have, e.g. another backend's options, are
    left out)."""
    shown = varying or ["model", "backend", "batch_size", "sequence_length", "instances"]
    return [" ".join(f"{c}={normalise_value(row[c])}" for c in shown if c in frame.columns and not _missing(row[c]))
            for _, row in frame.iterrows()]


SEARCHED = "server_max_valid_qps"  # a QPS search's figure (scenario=server, target_qps=auto)


def _figures(rows: pd.DataFrame, searched: bool) -> list[float]:
    """Each repeat's figure, as a time (lower is faster): its latency p50, or for a QPS search the time per query
    at its max QPS (1000 ÷ QPS ms); a repeat without one (a search that met no rate) is left out."""
    if searched:
        return [1e3 / q for q in pd.to_numeric(rows[SEARCHED], errors="coerce").dropna() if q > 0]
    return list(pd.to_numeric(rows["latency_p50_ms"], errors="coerce").dropna())


def _compared(before: pd.DataFrame, after: pd.DataFrame, ignored: list[str], threshold: float) -> dict:
    """One matched trial: its repeats on each side, compared across repeats (a QPS search by its max QPS)."""
    first = pd.concat([before.iloc[-1].add_suffix("_before"), after.iloc[-1].add_suffix("_after")])
    searched = SEARCHED in before and SEARCHED in after and \
        bool(before[SEARCHED].notna().any() or after[SEARCHED].notna().any())
    cost_before, cost_after = _figures(before, searched), _figures(after, searched)
    test = repeat_test(cost_before, cost_after)
    ratio = test.ratio if test else (float(np.mean(cost_after) / np.mean(cost_before))
                                     if cost_before and cost_after else np.nan)
    rates = SEARCHED if searched else "throughput_samples_per_s"
    rate_before, rate_after = (float(pd.to_numeric(rows[rates], errors="coerce").mean()) for rows in (before, after))
    p50_before, p50_after = (np.nan if searched or not costs else float(np.mean(costs))
                             for costs in (cost_before, cost_after))
    return {
        "trial": " ".join([before["_label"].iloc[-1], *_changes(first, ignored)]).strip(),
        "repeats_before": len(cost_before), "repeats_after": len(cost_after),
        "figure": "max QPS" if searched else "p50 ms", "before": rate_before if searched else p50_before,
        "after": rate_after if searched else p50_after, "p50_before_ms": p50_before, "p50_after_ms": p50_after,
        "ratio": ratio, "ci_low": test.ci_low if test else np.nan, "ci_high": test.ci_high if test else np.nan,
        "p_value": test.p_value if test else np.nan, "change": describe_ratio(ratio) if ratio == ratio else "-",
        "verdict": verdict(test, threshold, (len(cost_before), len(cost_after))),
        "throughput_ratio": rate_after / rate_before if rate_before else np.nan,
        "run_before": before["run"].iloc[-1], "run_after": after["run"].iloc[-1],
        **shared_host(before, after),
    }


def shared_host(before: pd.DataFrame, after: pd.DataFrame) -> dict:
    """Whether the two sides' repeats were interleaved in time (each side's first start before the other's last
    finish: one sweep's A B A B), how far apart they were otherwise, and the speed sentinel's range over both sides
    (each reading ÷ its run's first) with whether it moved: a ratio measured while it moved is marked."""
    def times(frame: pd.DataFrame) -> pd.Series:
        return pd.to_datetime(frame.get("started_at", pd.Series(dtype=object)), errors="coerce", utc=True).dropna()

    a, b = times(before), times(after)
    interleaved = bool(len(a) and len(b) and a.min() <= b.max() and b.min() <= a.max())
    apart = None if interleaved or not len(a) or not len(b) else \
        float(abs((b.min() - a.max()).total_seconds()) if b.min() > a.max() else (a.min() - b.max()).total_seconds())
    both = pd.concat([before, after])
    low = both["sentinel_low"].dropna() if "sentinel_low" in both else pd.Series(dtype=float)
    high = both["sentinel_high"].dropna() if "sentinel_high" in both else pd.Series(dtype=float)
    moved = bool(both["sentinel_moved"].fillna(False).astype(bool).any()) if "sentinel_moved" in both else False
    steal = both["steal_fraction"].dropna() if "steal_fraction" in both else pd.Series(dtype=float)
    return {"interleaved": interleaved, "apart_s": apart,
            "sentinel_low": float(low.min()) if len(low) else np.nan,
            "sentinel_high": float(high.max()) if len(high) else np.nan, "sentinel_moved": moved,
            "steal_max": float(steal.max()) if len(steal) else np.nan}


def shared_host_note(rows: pd.DataFrame) -> list[str]:
    """What the console says of the comparison's conditions: ratios whose sentinel moved, sides measured apart."""
    if rows.empty:
        return []
    notes = []
    moved = rows[rows["sentinel_moved"].astype(bool)]
    if len(moved):
        notes.append(f"{len(moved)} ratio(s) marked *: the speed sentinel moved beyond its tolerance around their "
                     "trials (the CPUs' speed changed: frequency, a neighbour, the hypervisor); measure them again")
    apart = rows[~rows["interleaved"].astype(bool)]
    if len(apart):
        hours = apart["apart_s"].dropna().max() / 3600 if apart["apart_s"].notna().any() else float("nan")
        notes.append(f"{len(apart)} matched trial(s) measured apart in time, not interleaved (up to {hours:.1f} h): a "
                     "drift of the machine between them is in the ratio; for a comparison that holds on a shared "
                     "host measure both in one sweep (corescale run -m ... repeats=N: A B A B, short alternating "
                     "windows) and compare its two halves")
    return notes


def _changes(pair: pd.Series, ignored: list[str]) -> list[str]:
    """`key=before→after` for the ignored keys that differ within a matched pair."""
    changes = []
    for c in ignored:
        old, new = normalise_value(pair.get(f"{c}_before")), normalise_value(pair.get(f"{c}_after"))
        if old != new:
            changes.append(f"{c}={old}→{new}")
    return changes


def _missing(value) -> bool:
    return value is None or (pd.api.types.is_scalar(value) and pd.isna(value))


def compare_frames(before: pd.DataFrame, after: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
                   ignore: list[str] | None = None) -> Comparison:
    if threshold < 0:
        raise UserError(f"--threshold must be >= 0 (got {threshold})")
    keys = measured_keys([before, after])
    unknown = [name for name in ignore or [] if name not in keys]
    if unknown:
        raise UserError(f"--ignore: unknown config key(s) {', '.join(unknown)}; keys: {', '.join(keys)}")
    skip = set(ignore or [])
    before, after = ok_rows(before), ok_rows(after)
    before = before.assign(_match=_match_key(before, skip)).drop_duplicates(["_match", "repeat"], keep="last")
    after = after.assign(_match=_match_key(after, skip)).drop_duplicates(["_match", "repeat"], keep="last")
    both = pd.concat([before, after])
    varying = [c for c in keys if c not in skip and c in both.columns and both[c].map(normalise_value).nunique() > 1]
    before, after = before.assign(_label=_labels(before, varying)), after.assign(_label=_labels(after, varying))
    matched = [m for m in dict.fromkeys(before["_match"]) if m in set(after["_match"])]
    rows = [_compared(before[before["_match"] == m], after[after["_match"] == m], ignore or [], threshold)
            for m in matched]
    found = set(matched)

    def unmatched(frame: pd.DataFrame) -> list[str]:
        return list(frame.loc[~frame["_match"].isin(found), "_label"])

    return Comparison(pd.DataFrame(rows), unmatched(before), unmatched(after), threshold)
