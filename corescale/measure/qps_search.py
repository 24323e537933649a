"""`target_qps=auto`: the search for the highest arrival rate whose p99 meets the SLO (bracket, then bisect),
and what its steps show: the load curve and its knee."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def floor_qps(cfg: BenchmarkConfig) -> float:
    """Below this rate LoadGen's minimum query count would take more than half the timeout per test."""
    return cfg.server.min_query_count / (0.5 * cfg.timeout)


def search(step, first: float, precision: float, max_steps: int, steps: list, floor: float = 0.0,
           slo_ms: float | None = None) -> float | None:
    """Bracket (double until a step misses the SLO, halve until one meets it) then bisect until the bracket is
    within `precision` of its low end; every step is appended to `steps`. Returns the highest QPS that met it.
    Halving stops below `floor` (a LoadGen test there would outlast the timeout)."""
    low: float | None = None
    high: float | None = None
    qps = max(first, floor)
    while len(steps) < max_steps and qps >= floor:
        result = step(qps)
        steps.append(result)
        if result.meets_slo:
            low = qps if low is None else max(low, qps)
        else:
            high = qps if high is None else min(high, qps)
            if low is None and slo_ms is not None and (result.latency_ms or {}).get("min", 0) > slo_ms:
                break  # even the fastest query missed: lower rates cannot help
            if low is None and getattr(result, "broken", False):
                break  # every query failed, none for lack of time: the server is broken, not overloaded
        if low is None:
            assert high is not None, "each step sets one end of the bracket"
            qps = high / 2
        elif high is None:
            qps = low * 2
        elif (high - low) / low <= precision:
            break
        else:
            qps = (low + high) / 2
        qps = float(f"{qps:.4g}")
    return low


def load_curve(steps: list[dict]) -> list[dict]:
    """(QPS, p50/p90/p99) of every step, by offered load."""
    points = [{"target_qps": s["target_qps"], "scheduled_qps": s["scheduled_qps"], "completed_qps": s["completed_qps"],
               **{k: s["latency_ms"].get(k) for k in ("p50", "p90", "p99")}, "validity": s["validity"],
               "meets_slo": s["meets_slo"]} for s in steps if s["target_qps"] is not None]
    return sorted(points, key=lambda p: p["target_qps"])


def knee(curve: list[dict]) -> float | None:
    """The QPS where p99 turns up: the point farthest below the chord from the first to the last point, both axes
    scaled to [0, 1] (Kneedle, Satopää et al. 2011); None with fewer than three distinct loads."""
    points = [(p["target_qps"], p["p99"]) for p in curve if p["p99"] is not None]
    if len({q for q, _ in points}) < 3:
        return None
    qs, ps = np.array([q for q, _ in points], float), np.array([p for _, p in points], float)
    x = (qs - qs.min()) / (qs.max() - qs.min())
    span = ps.max() - ps.min()
    if span <= 0:
        return None
    y = (ps - ps.min()) / span
    below = x - y  # p99 rising late: the chord y = x lies above the curve
    best = int(np.argmax(below))
    return float(qs[best]) if below[best] > 0 else None
