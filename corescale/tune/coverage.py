"""How good a tune's answer is: how much of the space it measured, the best it saw per backend and precision,
and what a longer budget could gain, estimated from the spread of its screens and read from the search's own
record (when the best was found; docs/tune.md, "How good is the answer"). Drawn from the tune document's trials,
so `tune.json`, the console and the report say the same."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

from corescale.overrides import override_key
from corescale.tune.document import LONGER, BestSeen, Coverage, TuneTrial

if TYPE_CHECKING:
    from corescale.tune.space import Space

LEAST_SCREENS = 4  # fewer screens give no estimate of the spread


def coverage(trials: list[TuneTrial], space: Space, metric: str, direction: str) -> Coverage:
    """The coverage of a tune whose Optuna trials are `trials` over `space`."""
    first = [t for t in trials if t.repeat_of is None and t.overrides]
    screened = [t for t in first if t.screen]
    branches = []
    sign = 1 if direction == "maximize" else -1
    for backend in space.backends:
        for precision in space.precisions[backend]:
            mine = [t for t in first if _branch(t) == (backend, precision)]
            values = [(v, t.label) for t in mine if t.screen and _feasible(t)
                      for v in (_best_of(t, metric, sign),) if v is not None]
            best = max(values, key=lambda p: sign * p[0]) if values else (None, None)
            branches.append(BestSeen(backend, precision, space.size_of(backend, precision),
                                     sum(1 for t in mine if t.screen),
                                     sum(1 for t in mine if _withheld(t)), best[0], best[1],
                                     sum(1 for t in mine if _unestablished(t))))
    gain, words = _longer(screened, metric, sign, direction)
    best_at = found_at(screened, metric, sign)
    if best_at is not None:
        words += "; " + found_words(best_at, len(screened))
    return Coverage(len(screened), space.size(), branches, gain, words, best_at)


def _longer(screened: list[TuneTrial], metric: str, sign: int, direction: str) -> tuple[float | None, str]:
    """The estimate from the best's own backend × precision branch when it has LEAST_SCREENS feasible screens (a
    longer budget gains there; screens across backends 25× apart would make σ a spread of families), else from
    all feasible screens."""
    feasible = [(t, v) for t in screened if _feasible(t)
                for v in (t.figure("screen", metric),) if v is not None and v > 0]
    if feasible:
        leader = _branch(max(feasible, key=lambda p: sign * (_best_of(p[0], metric, sign) or p[1]))[0])
        mine = [v for t, v in feasible if _branch(t) == leader]
        if len(mine) >= LEAST_SCREENS:
            return estimate(mine, direction, f"of {' '.join(leader)}, the best's branch")
    return estimate([v for _, v in feasible], direction, "across branches" if feasible else "")


def found_at(screened: list[TuneTrial], metric: str, sign: int) -> int | None:
    """Where the best feasible configuration was first screened: its position (1-based) among the screened, in the
    order they were asked; None when none was feasible."""
    ordered = sorted(screened, key=lambda t: t.number)
    values = [(i, v) for i, t in enumerate(ordered, 1) if _feasible(t)
              for v in (_best_of(t, metric, sign),) if v is not None]
    if not values:
        return None
    best = max(sign * v for _, v in values)
    return next(i for i, v in values if sign * v == best)


def found_words(best_at: int, screened: int) -> str:
    """What the search's own record says about a longer budget, beside the spread's estimate."""
    if best_at == screened:
        return f"the best came with the last of {screened} screens: the search was still finding better ones"
    return (f"the best was found by screen {best_at} of {screened}: the {screened - best_at} screened after it found "
            "nothing better")


def estimate(values: list[float], direction: str, of: str = "") -> tuple[float | None, str]:
    """What LONGER times the screens could gain over the best of these: the expected best of LONGER·n draws
    over that of n from a log-normal fitted to the screens (Blom's approximation of a normal maximum). The
    sampler's draws are not random, so this is a guide to whether a longer run could matter, not a promise."""
    n = len(values)
    if n < LEAST_SCREENS:
        return None, (f"no estimate: {n} feasible screen(s), at least {LEAST_SCREENS} give the screens' spread "
                      "(a longer budget measures more)")
    logs = [math.log(v) for v in values]
    mean = sum(logs) / n
    sigma = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    step = _blom(LONGER * n) - _blom(n)
    gain = math.exp(sigma * step) - 1 if direction == "maximize" else 1 - math.exp(-sigma * step)
    source = f"{n} screens{' ' + of if of else ''}"
    return gain, (f"≈ {gain:+.1%} on the best with {LONGER}× the configurations measured (the spread of {source}, "
                  f"log-normal: σ = {sigma:.2f}; a guide, not a promise: the sampler's draws are not random)")


def _blom(n: int) -> float:
    """The expected largest of n standard normal draws (Blom's approximation)."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _branch(trial: TuneTrial) -> tuple[str, str]:
    from corescale.backends import DEFAULT_BACKEND
    from corescale.machine.precisions import REFERENCE

    values = {override_key(o): o.split("=", 1)[1] for o in trial.overrides or []}
    return values.get("backend", DEFAULT_BACKEND), values.get("precision", REFERENCE)


def _feasible(trial: TuneTrial) -> bool:
    return bool(trial.screen and trial.screen.get("valid")) and all(c <= 0 for c in trial.constraints or [])


def _withheld(trial: TuneTrial) -> bool:
    if trial.outcome == "withheld":
        return True
    figs = trial.full or trial.screen or {}
    return bool(figs.get("valid")) and not (figs.get("quality_ok", True) and figs.get("drift_ok", True))


def _unestablished(trial: TuneTrial) -> bool:
    """Its QPS search met no rate before a bound ended it (verdict.figures' `unestablished`): unknown, not 0."""
    figs = trial.full or trial.screen or {}
    return bool(figs.get("unestablished"))


def _best_of(trial: TuneTrial, metric: str, sign: int) -> float | None:
    found = [v for v in (trial.figure("screen", metric), trial.figure("full", metric)) if v is not None]
    return max(found, key=lambda v: sign * v) if found else None
