"""`target_qps=auto`: the search for the highest arrival rate whose p99 meets the SLO (bracket, then bisect),
and what its steps show: the load curve and its knee."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def warm_capacity(call_ns: int, single_ns: int | None, max_batch: int, mean_length: float,
                  sequence_length: int) -> float:
    """Queries a second one instance's warm calls say it sustains: full batches at sequence_length (`call_ns`), or,
    where more, one query at a time at the queries' mean real length: a row's cost (the full batch's call less one
    row's, `single_ns`, per added row) scaled by its tokens, plus what a call costs at any size. Real text is
    mostly shorter than sequence_length (the built-in texts: 28 tokens of 128), and a first guess from full-length
    rows alone sent the search's first test to a quarter of what out-of-box PyTorch meets."""
    full = max_batch / max(call_ns, 1) * 1e9
    if not single_ns or max_batch < 2 or call_ns <= single_ns:
        return full
    row = (call_ns - single_ns) / (max_batch - 1)
    one = max(single_ns - row, 0.0) + row * min(mean_length, sequence_length) / sequence_length
    return max(full, 1e9 / one)


# a call whose rows leave a query room in the SLO: it may wait for the call ahead of it, then its own, and queue
SLO_SHARE = 1 / 3
# the first test, at this share of the capacity estimate from the calls at the workload's real lengths: near the
# knee, where p99 turns up (above it a miss; far below it the longest test: the minimum query count at a low rate)
FIRST_SHARE = 0.7


@dataclass(frozen=True)
class Capacity:
    """What one instance's warm calls at the workload's real lengths say it sustains at the SLO: the batch size
    whose call leaves a query room in it (SLO_SHARE) with the most queries a second, that rate, and that call."""

    qps: float
    rows: int
    call_ms: float


def slo_capacity(calls: list, slo_ms: float | None) -> Capacity | None:
    """One instance's capacity at the SLO from its warm calls of real queries ([rows, median ns] each, the queries
    drawn from the query set and padded as the pad policy pads them: the length distribution, not its mean): the
    most queries a second over the batch sizes whose call takes at most SLO_SHARE of the SLO (a batching
    configuration serves at the SLO with the batches whose calls fit it, not with its max batch); the smallest
    batch where none does. None without calls."""
    known = sorted((int(rows), int(ns)) for rows, ns in calls if int(rows) > 0 and int(ns) > 0)
    if not known:
        return None
    fits = [(rows, ns) for rows, ns in known if slo_ms is None or ns / 1e6 <= SLO_SHARE * slo_ms] or known[:1]
    rows, ns = max(fits, key=lambda c: c[0] / c[1])
    return Capacity(rows / ns * 1e9, rows, ns / 1e6)


def floor_qps(cfg: BenchmarkConfig) -> float:
    """Below this rate LoadGen's minimum query count would take more than half the timeout per test."""
    return cfg.server.min_query_count / (0.5 * cfg.timeout)


# a step that missed the SLO and completed less than this share of its rate fell behind: it completed about what
# the configuration sustains (its server was busy throughout), an estimate (a busy machine's short test completes
# less than a calm one sustains) the search tries, never assumes: with no rate met yet, the next rate is this
# share of it (queues stay short below saturation); once one is met, the estimate is tried before bisecting above
BEHIND = 0.9
SUSTAINED_SHARE = 0.7
# a missed rate that kept up: the next, with no rate met yet, is the SLO's share of the p99 it showed, between half
# of it and NEAR (a miss by little puts the knee near; halving it cost out-of-box PyTorch's search its precision)
NEAR = 0.8
# a miss is doubtful where it kept up, its p99 was within DOUBTFUL × the SLO, and the best rate met had a p99 within
# CALM × the SLO: on a shared host one pause of the vCPU (~100 ms) queues every query behind it, enough for a p99 at a
# rate the service sustains; such a rate is tested once more (once a search) before it bounds the bracket
DOUBTFUL = 1.5
CALM = 0.5


@dataclass
class Bound:
    """A wall-time bound on one search (server.max_search_s; None: none): seconds left, and whether a test of
    `least_s` seconds still fits."""

    seconds: float | None
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def total(self) -> float:
        return math.inf if self.seconds is None else self.seconds

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (self.clock() - self.started)

    def words(self) -> str:
        return f"server.max_search_s={self.seconds:g}"


@dataclass
class Searched:
    """What a search found: the highest rate that met the SLO (None: none did), and why it stopped early when its
    wall-time bound did (None: it ran to its precision or max_steps)."""

    best: float | None
    bounded: str | None = None
    # no rate met the SLO and a bound (the wall time, max_steps) ended the search before the floor or a fact that
    # no lower rate can meet it: the max is not established, only that these rates missed (None: it is, or none)
    unestablished: str | None = None


def search(step, first: float, precision: float, max_steps: int, steps: list, floor: float = 0.0,
           slo_ms: float | None = None, bound: Bound | None = None,
           least_s: Callable[[float], float] | None = None) -> Searched:
    """Bracket (double until a step misses the SLO, halve until one meets it: after a missed step that fell
    behind, go below the rate it completed rather than to half a high guess, and try that rate before bisecting)
    then bisect until the bracket is within `precision` of its low end; every step is appended to `steps`.
    Halving stops below `floor` (a LoadGen test there would outlast the timeout). `bound`: no test starts that
    cannot end within it (least_s(qps): the least a test at qps takes; while one end of the bracket is unknown, a
    rate is raised to the least whose test fits, below a missed one), and a step that the bound cut (result.cut)
    ends the search; either way the best rate met so far is kept."""
    low: float | None = None
    high: float | None = None
    ceiling: float | None = None  # what a step that fell behind completed: tried once a rate is met
    missed = calm = None  # the step that set the bracket's upper end, the one that set its lower end
    again: float | None = None  # the rate being tested once more (DOUBTFUL); the search retests once
    retested = False
    settled = False  # no lower rate can meet the SLO (its fastest query missed it; the server is broken)
    bound = bound or Bound(None)
    qps = max(first, floor)
    while len(steps) < max_steps and qps >= floor:
        need = least_s(qps) if least_s is not None else 0.0
        if need > (bound.left() if steps else bound.total()):  # the first test runs when it fits at all
            raised = fitting(qps, bound.left(), least_s) if steps and (low is None or high is None) else None
            if raised is not None and high is not None and raised >= high:
                raised = None  # going down from a miss: only a rate below it is worth the time left
            if raised is None:
                why = (f"{bound.words()} ended it after {tests(len(steps))}: the next, at {qps:g} QPS, takes at "
                       f"least {need:.3g} s and {max(bound.left(), 0.0):.3g} s were left")
                return Searched(low, why, unestablished(steps, low, why))
            qps = raised  # still bracketing: a little faster, so that it fits, rather than no end found
        result = step(qps)
        if again is not None:
            result.retest, again = True, None
        steps.append(result)
        if getattr(result, "cut", False):
            why = (f"{bound.words()} cut LoadGen test {len(steps)}, at {qps:g} QPS: the queries still queued were "
                   "answered at once, the test judged not valid")
            return Searched(low, why, unestablished(steps, low, why))
        if result.meets_slo:
            if low is None or qps > low:
                low, calm = qps, result
            if high is not None and qps >= high:  # a retested miss met the SLO: bracket upwards again
                high = missed = None
        else:
            if high is None or qps <= high:
                high, missed = qps, result
            fell = behind(result, qps)
            ceiling = fell if fell is not None else ceiling
            if low is None and slo_ms is not None and (result.latency_ms or {}).get("min", 0) > slo_ms:
                settled = True
                break  # even the fastest query missed: lower rates cannot help
            if low is None and getattr(result, "broken", False):
                settled = True
                break  # every query failed, none for lack of time: the server is broken, not overloaded
        if not retested and missed is not None and doubtful(missed, calm, slo_ms):
            qps = again = missed.target_qps
            retested = True
            continue
        if low is None:
            assert high is not None, "each step sets one end of the bracket"
            qps = min(high / 2, SUSTAINED_SHARE * ceiling) if ceiling is not None else \
                high * below_missed(result, slo_ms)
        elif high is None:
            qps = low * 2
        elif (high - low) / low <= precision:
            break
        elif ceiling is not None and low * (1 + precision) < ceiling < (low + high) / 2:
            qps, ceiling = ceiling, None  # the rate a step sustained, before bisecting the rest of a wide bracket
        else:
            qps = (low + high) / 2
        qps = float(f"{qps:.4g}")
    if low is None and not settled and len(steps) >= max_steps and qps >= floor:
        return Searched(None, None, unestablished(steps, low, f"server.max_steps={max_steps} ended it"))
    return Searched(low)


def unestablished(steps: list, low: float | None, why: str) -> str | None:
    """Where no rate met the SLO and a bound ended the search (`why`), what the tests show: that these rates
    missed, not that no rate meets the SLO (the next lower one was never tested); None where a rate met it."""
    if low is not None or not steps:
        return None
    lowest = min(steps, key=lambda s: s.target_qps)
    p99 = (getattr(lowest, "latency_ms", None) or {}).get("p99")
    at = f"p99 {p99:.0f} ms" if p99 is not None and math.isfinite(p99) else "no p99"
    shown = (f"one LoadGen test at {lowest.target_qps:g} QPS missed the SLO ({at})" if len(steps) == 1 else
             f"{tests(len(steps))} down to {lowest.target_qps:g} QPS missed the SLO (there: {at})")
    return f"not established: {shown}; {why}, no lower rate tested"


def doubtful(missed, calm, slo_ms: float | None) -> bool:
    """Whether the step that bounds the bracket from above (`missed`) missed the SLO by so little, having kept up,
    above the rate met with a calm tail (`calm`, the bracket's lower end), that one pause of a shared host explains
    it (see DOUBTFUL)."""
    if missed is None or calm is None or slo_ms is None:
        return False
    p99, calm_p99 = ((r.latency_ms or {}).get("p99") for r in (missed, calm))
    if not p99 or not calm_p99 or behind(missed, missed.target_qps) is not None:
        return False
    return slo_ms < p99 <= DOUBTFUL * slo_ms and calm_p99 <= CALM * slo_ms


def below_missed(result, slo_ms: float | None) -> float:
    """The share of a missed rate (one that kept up) to try next while no rate met the SLO: SLO ÷ its p99, at
    least a half (bracketing by halving), at most NEAR (a test LoadGen could not decide whose p99 met it: NEAR); a
    half where the p99 or the SLO is not known."""
    p99 = (getattr(result, "latency_ms", None) or {}).get("p99")
    if slo_ms is None or not p99 or not math.isfinite(p99):
        return 0.5
    return min(max(slo_ms / p99, 0.5), NEAR)


def fitting(qps: float, left: float, least_s: Callable[[float], float] | None) -> float | None:
    """A rate a little above `qps` whose LoadGen test fits the `left` seconds (a test of the minimum query count
    ends sooner at a higher rate), at most twice `qps`; None when none does (its minimum duration does not fit)."""
    if least_s is None or left <= 0:
        return None
    raised = float(f"{qps * least_s(qps) / left * 1.02:.4g}")
    return raised if raised <= 2 * qps and least_s(raised) <= left else None


def tests(count: int) -> str:
    return f"{count} LoadGen test{'' if count == 1 else 's'}"


def behind(result, qps: float) -> float | None:
    """The rate a step at `qps` completed when it fell behind (less than BEHIND of what it was offered: about
    what the configuration sustains), else None."""
    completed = getattr(result, "completed_qps", None)
    if completed is None or not math.isfinite(completed) or completed <= 0 or completed >= BEHIND * qps:
        return None
    return float(completed)


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
