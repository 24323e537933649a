"""What a tune's budget bounds (issue 32): each QPS search's wall time (server.max_search_s) and the slack past the
budget a tune may end within.

A server-objective tune with a budget gives every full window's QPS search (the out-of-box baseline, the peer, the
searched configurations' full windows and the final repeats) FULL_SHARE of the budget and every screen's
SCREEN_SHARE, each at least LEAST_TESTS LoadGen tests of its window: a pathological configuration (out-of-box
PyTorch's OpenMP threads descheduled beside LoadGen on 2 cores served 4-12 QPS, each test of 459 queries 40-150 s)
then costs a bounded share instead of the whole budget. server.max_search_s given by the user is kept (a screen
takes the smaller of it and the screen's share). The final stage starts a measurement only while its estimate
fits the budget; a tune ends within the budget plus `slack` (the estimate's error: a trial's load and warm-up are
not bounded)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corescale.tune.document import SearchBounds

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig
    from corescale.tune.settings import TuneSettings

FULL_SHARE = 0.1  # of the budget: one full window's QPS search (a 5-minute tune: 30 s)
SCREEN_SHARE = 1 / 30  # of the budget: one screen's (a 5-minute tune: 10 s)
LEAST_TESTS = 3  # a bound holds at least this many LoadGen tests of the window's minimum duration
SLACK_SHARE, SLACK_MIN_S = 0.05, 15.0  # a tune ends within budget + max(SLACK_SHARE x budget, SLACK_MIN_S)


def slack(budget_s: float | None) -> float | None:
    return None if budget_s is None else max(SLACK_SHARE * budget_s, SLACK_MIN_S)


def search_bounds(settings: TuneSettings, cfg: BenchmarkConfig, screen_s: float) -> SearchBounds | None:
    """The bounds of this tune's QPS searches (None: offline, or neither a budget nor server.max_search_s)."""
    if settings.objective.scenario != "server":
        return None
    given = cfg.server.max_search_s
    budget = settings.budget_s
    if budget is None:
        return None if given is None else SearchBounds(given, given, None, "server.max_search_s as given")
    screen = max(SCREEN_SHARE * budget, LEAST_TESTS * screen_s)
    if given is not None:
        return SearchBounds(given, min(given, screen), slack(budget), "server.max_search_s as given; a screen "
                            f"at most {SCREEN_SHARE:.3g} of the budget")
    full = max(FULL_SHARE * budget, LEAST_TESTS * cfg.duration)
    return SearchBounds(round(full, 1), round(min(full, screen), 1), slack(budget),
                        f"the budget: a full window's search {FULL_SHARE:g} of it, a screen's {SCREEN_SHARE:.3g}, "
                        f"each at least {LEAST_TESTS} LoadGen tests of its window")
