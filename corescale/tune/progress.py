"""What the tune shows beside each trial: its stage, how far it is, the best so far and the ETA (the final
stage's seconds held in reserve)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from corescale.tune.plan import Tune
from corescale.tune.settings import FINAL_SHARE, LOAD_MARGIN_S


@dataclass
class Progress:
    """What the tune shows beside each trial: how far it is, the best so far, the ETA."""

    started: float
    elapsed_before: float
    budget_s: float | None
    trials: int | None
    done: int = 0
    best: str = "best: none yet"
    screen_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)  # the searched configurations' full windows
    fixed_s: list[float] = field(default_factory=list)  # the out-of-box baseline's and the peer's measurements
    stage: str = "baseline"

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def eta(self, reserve: float) -> float | None:
        if self.budget_s is not None:
            return max(0.0, self.budget_s - self.elapsed())
        if not self.screen_s:
            return None
        left = max(0, (self.trials or 0) - self.done)
        return left * (sum(self.screen_s) / len(self.screen_s)) + reserve

    def text(self, reserve: float) -> str:
        eta = self.eta(reserve)
        when = "ETA after the first trial" if eta is None else f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        total = f"/{self.trials}" if self.trials else ""
        return f"{self.stage} · trial {self.done}{total} · {self.best} · {when}"

    def full_estimate(self, tune: Tune) -> float:
        """Seconds one full-window measurement takes: the mean of those measured, else from the screens', else the
        window and the least a trial spends outside it."""
        if self.full_s:
            return sum(self.full_s) / len(self.full_s)
        if self.screen_s:
            return sum(self.screen_s) / len(self.screen_s) + tune.cfg.duration - tune.screen_s
        return tune.cfg.duration + LOAD_MARGIN_S

    def reserve(self, tune: Tune) -> float:
        """Seconds kept for the final stage: the repeats still to measure of the top k (a full window each) and of
        the baseline and the peer (what theirs took: out-of-box PyTorch's can be minutes), and at least
        FINAL_SHARE of the budget, which the final stage spends on more repeats of the searched finalists."""
        full = self.full_estimate(tune)
        fixed = 1 + bool(tune.peer)
        measured = sum(self.fixed_s) / len(self.fixed_s) if self.fixed_s else full
        needed = (tune.settings.repeats - 1) * (tune.settings.top_k * full + fixed * measured)
        return max(needed, FINAL_SHARE * self.budget_s) if self.budget_s is not None else needed
