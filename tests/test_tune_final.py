"""The final stage's reserve and rounds (tune/progress.py, tune/search.py): the reserve covers what the baseline's
measurements took and at least FINAL_SHARE of the budget; a budget's reserve buys the searched finalists more
repeats than tune.repeats, one whole round at a time, until the leader is separated."""

import time
from types import SimpleNamespace

import pytest

from corescale.tune import search, verdict
from corescale.tune.progress import Progress
from corescale.tune.search import Tuner
from corescale.tune.settings import FINAL_SHARE, MAX_FINAL_REPEATS

SETTINGS = SimpleNamespace(top_k=2, repeats=3, eta=3)


def _tune(peer=None):
    return SimpleNamespace(settings=SETTINGS, peer=peer, peer_label="peer" if peer else None, screen_s=1.0,
                           cfg=SimpleNamespace(duration=3.0), baseline=["backend=pytorch"], cost_of=None,
                           trial_overrides=lambda suggested, duration: [*suggested, f"duration={duration:g}"])


def test_the_reserve_counts_the_baselines_own_time_and_grows_with_the_budget():
    tune = _tune()
    progress = Progress(started=time.monotonic(), elapsed_before=0.0, budget_s=300.0, trials=None,
                        full_s=[20.0], fixed_s=[60.0])
    assert progress.reserve(tune) == pytest.approx((3 - 1) * (2 * 20.0 + 60.0))  # 200 s > 15 % of 5 minutes
    progress.budget_s = 2400.0
    assert progress.reserve(tune) == pytest.approx(FINAL_SHARE * 2400.0)  # 360 s: a 40-minute tune keeps more
    progress.fixed_s = []  # the baseline not measured yet: a full window's estimate stands in
    progress.budget_s = None
    assert progress.reserve(tune) == pytest.approx(2 * 3 * 20.0)
    assert progress.reserve(_tune(peer=["peer"])) == pytest.approx(2 * 4 * 20.0)


def _final(monkeypatch, budget_s, separated_at, stored=(1, 1, 1), elapsed_s=0.0, baseline_apart=True, narrow_at=0):
    """Tuner._final over two searched finalists and the baseline; each new measurement takes 10 s of the budget
    (stored: the repeats of each committed before, found by key; narrow_at: from how many repeats the leader's own
    interval is narrower than its value). Returns {label: repeats}, the calls' sizes, the final stage's words and
    how many measurements it made."""
    tuner = Tuner.__new__(Tuner)
    tuner.tune, tuner.study, tuner.final_end = _tune(), object(), ""
    tuner.progress = Progress(started=time.monotonic(), elapsed_before=elapsed_s, budget_s=budget_s, trials=None,
                              full_s=[10.0])
    tuner._stored = lambda configs, most: list(stored)  # stored=None: a call fails the test
    top = [SimpleNamespace(user_attrs={"overrides": [f"backend={name}"], "label": name}) for name in ("A", "B")]
    monkeypatch.setattr(search.studies, "ranked_complete", lambda study, settings: top)
    monkeypatch.setattr(verdict, "figures", lambda record, cost_of: {})
    monkeypatch.setattr(verdict, "separated", lambda finalists, settings: len(finalists[0].records) >= separated_at
                        and (baseline_apart or not any(f.baseline for f in finalists)))
    monkeypatch.setattr(verdict, "leader_wide", lambda finalists, settings: len(finalists[0].records) < narrow_at)
    monkeypatch.setattr(tuner, "_withheld", lambda study: [])
    measured = dict(zip(["A", "B", "baseline: out-of-box pytorch"], stored or (1, 1, 1)))
    calls, new = [], []

    def run_trials(configs, labels, repeats=1, kind="full"):
        calls.append(len(configs))
        got = []
        for label in (label.removeprefix("final ") for label in labels):
            fresh = max(0, repeats - measured[label])  # the search's full window and earlier repeats: by key
            measured[label] = max(repeats, measured[label])
            new.append(fresh)
            tuner.progress.elapsed_before += 10.0 * fresh
            got.append([(SimpleNamespace(elapsed_s=10.0, placed=[]), f"{label}/{i}") for i in range(repeats)])
        return got

    tuner.run_trials = run_trials
    finalists = tuner._final()
    return {f.label: len(f.records) for f in finalists}, calls, tuner.final_end, sum(new)


def test_a_budgets_reserve_repeats_the_searched_finalists_until_the_leader_is_separated(monkeypatch):
    repeats, calls, words, _ = _final(monkeypatch, budget_s=1000.0, separated_at=6)
    assert repeats == {"A": 6, "B": 6, "baseline: out-of-box pytorch": 3}
    assert calls == [3, 3, 2, 2, 2]  # tune.repeats rounds with the baseline, then the searched finalists alone
    assert "gave the searched finalists 6 repeats (tune.repeats=3, more from the budget's reserve) until" in words


def test_a_round_past_tune_repeats_is_measured_whole_or_not_at_all(monkeypatch):
    repeats, calls, words, _ = _final(monkeypatch, budget_s=75.0, separated_at=99)  # 60 s spent after 3 rounds
    assert repeats == {"A": 3, "B": 3, "baseline: out-of-box pytorch": 3} and calls == [3, 3]
    assert words == "; the leader was not separated after tune.repeats=3 and the budget left no whole round more"
    repeats, calls, words, _ = _final(monkeypatch, budget_s=85.0, separated_at=99)  # one whole round more fits
    assert repeats["A"] == 4 and calls == [3, 3, 2]
    assert words == ("; the final stage gave the searched finalists 4 repeats (tune.repeats=3, more from the "
                     "budget's reserve) and the leader was not separated")
    repeats, _, words, _ = _final(monkeypatch, budget_s=1e6, separated_at=99)
    assert repeats["A"] == MAX_FINAL_REPEATS and "the most it gives" in words


def test_without_a_budget_the_final_stage_gives_tune_repeats(monkeypatch):
    # _stored is not consulted: without a budget nothing is fitted, so its lookup would only cost time
    repeats, calls, words, _ = _final(monkeypatch, budget_s=None, separated_at=99, stored=None)
    assert repeats == {"A": 3, "B": 3, "baseline: out-of-box pytorch": 3} and calls == [3, 3] and words == ""
    repeats, _, words, _ = _final(monkeypatch, budget_s=None, separated_at=2)
    assert repeats["A"] == 2 and "stopped after 2 of 3 repeats" in words


def test_a_tune_resumed_past_its_budget_concludes_from_the_repeats_it_stored(monkeypatch):
    """Killed in its final stage and run again after the budget: the stored repeats cost nothing, so the verdict
    rests on all of them (it used to re-conclude from one each, "the budget ended the final stage in its repeat
    2")."""
    repeats, _, words, new = _final(monkeypatch, budget_s=100.0, separated_at=99, stored=(6, 6, 3), elapsed_s=150.0)
    assert repeats == {"A": 6, "B": 6, "baseline: out-of-box pytorch": 3} and new == 0
    assert "gave the searched finalists 6 repeats" in words and "not separated" in words
    repeats, _, words, new = _final(monkeypatch, budget_s=100.0, separated_at=99, stored=(4, 2, 3), elapsed_s=150.0)
    assert (repeats["A"], repeats["B"], new) == (3, 2, 0) and "repeat 3 of 3" in words  # B has no third stored


def test_past_tune_repeats_the_leader_is_judged_among_the_searched_finalists(monkeypatch):
    """The extra rounds measure only the searched finalists: a baseline whose 2 noisy repeats give it an interval of
    1-1000 QPS (out-of-box PyTorch on the Zen 4) must not keep the rounds going to the most (P6' seed 4 spent its
    reserve so); before tune.repeats the baseline still counts (an early stop needs every finalist apart)."""
    repeats, calls, words, _ = _final(monkeypatch, budget_s=1e6, separated_at=2, baseline_apart=False)
    assert repeats == {"A": 3, "B": 3, "baseline: out-of-box pytorch": 3} and calls == [3, 3]
    assert "clear of every other searched finalist's" not in words and words == ""
    repeats, _, words, _ = _final(monkeypatch, budget_s=1e6, separated_at=5, baseline_apart=False)
    assert repeats["A"] == 5 and "clear of every other searched finalist's" in words


def test_a_separated_leader_whose_own_interval_is_wider_than_its_value_gets_more_repeats(monkeypatch):
    """Clear of the others after 2 repeats, but 41 and 616 QPS leave the leader's own interval wider than its value:
    a reader gets its repeats, not a figure; so the rounds go on while the budget allows, and say why they ended."""
    repeats, calls, words, _ = _final(monkeypatch, budget_s=1e6, separated_at=2, narrow_at=5)
    assert repeats == {"A": 5, "B": 5, "baseline: out-of-box pytorch": 3} and calls == [3, 3, 2, 2]
    assert "gave the searched finalists 5 repeats" in words and "clear of every other searched finalist's" in words
    repeats, _, words, _ = _final(monkeypatch, budget_s=75.0, separated_at=2, narrow_at=99)
    assert repeats["A"] == 3
    assert words == ("; the leader's own 95 % interval stayed wider than its value after tune.repeats=3 and the "
                     "budget left no whole round more")
    repeats, _, words, _ = _final(monkeypatch, budget_s=1e6, separated_at=2, narrow_at=99)
    assert repeats["A"] == MAX_FINAL_REPEATS and words.endswith("and the leader's own 95 % interval stayed wider "
                                                                 "than its value")
