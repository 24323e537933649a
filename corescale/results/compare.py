"""Two result roots, trials matched by config: what got faster or slower, and is it significant.

Latency is compared on the raw timed samples. Consecutive calls are correlated (a slow stretch lasts), so the
samples of each run are cut into up to BLOCKS consecutive blocks and the tests run on the block medians: a
two-sided Mann-Whitney U test and a percentile-bootstrap 95 % interval of the ratio of medians (after / before).
A change is flagged when it is significant (p < ALPHA and the interval excludes 1) and larger than the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from corescale.errors import UserError
from corescale.measure.stats import bootstrap_ratio_ci
from corescale.results.store import config_columns, ok_rows, timed_latencies_ms

ALPHA = 0.05
BLOCKS = 50
DEFAULT_THRESHOLD = 0.10
# where things are written or how they were dispatched, not what is measured
NOT_MATCHED = ("output_dir", "cache_dir", "executor.name", "executor.address", "executor.max_retries")


def match_columns(frames: list[pd.DataFrame], ignore: list[str]) -> list[str]:
    """Config keys two trials must share to be compared (every config key, less NOT_MATCHED and ignore)."""
    columns = list(dict.fromkeys(c for frame in frames for c in config_columns(frame)))
    unknown = [name for name in ignore if name not in columns]
    if unknown:
        raise UserError(f"--ignore: unknown config key(s) {', '.join(unknown)}; keys: {', '.join(columns)}")
    return [c for c in columns if c not in NOT_MATCHED and c not in ignore]


def block_medians(samples: np.ndarray, blocks: int = BLOCKS) -> np.ndarray:
    if samples.size <= blocks:
        return samples
    return np.array([np.median(part) for part in np.array_split(samples, blocks)])


@dataclass
class LatencyTest:
    ratio: float  # median(after) / median(before), raw samples
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA and not (self.ci_low <= 1.0 <= self.ci_high)


def latency_test(before: np.ndarray, after: np.ndarray, seed: int = 0) -> LatencyTest:
    if before.size < 2 or after.size < 2:
        raise UserError("need at least 2 timed samples on each side to compare")
    a, b = block_medians(before), block_medians(after)
    _, low, high = bootstrap_ratio_ci(a, b, seed=seed)
    p_value = float(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    return LatencyTest(float(np.median(after) / np.median(before)), low, high, p_value)


def describe_ratio(ratio: float) -> str:
    """pyperf style: '1.52x slower (+52%)' / '1.25x faster (-20%)'."""
    if abs(ratio - 1) < 0.005:
        return "1.00x (same)"
    if ratio > 1:
        return f"{ratio:.2f}x slower (+{(ratio - 1) * 100:.0f}%)"
    return f"{1 / ratio:.2f}x faster (-{(1 - ratio) * 100:.0f}%)"


def verdict(test: LatencyTest, threshold: float) -> str:
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


def _norm(value) -> str:
    """One spelling per value across tables: NaN/None alike, 8.0 as 8."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return "None"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _match_key(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    present = [c for c in columns if c in frame.columns]
    return pd.Series(["|".join(_norm(v) for v in values) for values in frame[present].itertuples(index=False)],
                     index=frame.index, dtype=object)


def _labels(frame: pd.DataFrame, varying: list[str]) -> list[str]:
    shown = varying or ["model", "backend", "batch_size", "sequence_length", "instances"]
    return [" ".join(f"{c}={_norm(row[c])}" for c in shown if c in frame.columns) for _, row in frame.iterrows()]


def compare_frames(before: pd.DataFrame, after: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
                   ignore: list[str] | None = None) -> Comparison:
    if threshold < 0:
        raise UserError(f"--threshold must be >= 0 (got {threshold})")
    columns = match_columns([before, after], ignore or [])
    before, after = ok_rows(before), ok_rows(after)
    before = before.assign(_match=_match_key(before, columns)).drop_duplicates("_match", keep="last")
    after = after.assign(_match=_match_key(after, columns)).drop_duplicates("_match", keep="last")
    both = pd.concat([before, after])
    varying = [c for c in columns if c in both.columns and both[c].map(_norm).nunique() > 1]
    before, after = before.assign(_label=_labels(before, varying)), after.assign(_label=_labels(after, varying))
    pairs = before.merge(after, on="_match", suffixes=("_before", "_after"))
    rows = []
    for _, pair in pairs.iterrows():
        test = latency_test(timed_latencies_ms(pair["path_before"]), timed_latencies_ms(pair["path_after"]))
        ratio_tput = pair["throughput_samples_per_s_after"] / pair["throughput_samples_per_s_before"]
        rows.append({
            "trial": " ".join([pair["_label_before"]] + [
                f"{c}={_norm(pair[f'{c}_before'])}→{_norm(pair[f'{c}_after'])}" for c in ignore or []
                if _norm(pair[f"{c}_before"]) != _norm(pair[f"{c}_after"])]).strip(),
            "p50_before_ms": pair["latency_p50_ms_before"], "p50_after_ms": pair["latency_p50_ms_after"],
            "ratio": test.ratio, "ci_low": test.ci_low, "ci_high": test.ci_high, "p_value": test.p_value,
            "change": describe_ratio(test.ratio), "verdict": verdict(test, threshold),
            "throughput_ratio": ratio_tput, "run_before": pair["run_before"], "run_after": pair["run_after"],
        })
    matched = set(pairs["_match"])

    def unmatched(frame: pd.DataFrame) -> list[str]:
        return list(frame.loc[~frame["_match"].isin(matched), "_label"])

    return Comparison(pd.DataFrame(rows), unmatched(before), unmatched(after), threshold)
