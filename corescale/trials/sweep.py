"""Sweeps: a Hydra `-m` grid composed and checked whole before the first trial runs, then run through the one
local loop (local.py) or fanned out over a Ray cluster (ray.py, `executor=ray`).

Sweeps resume: a trial whose key (measured config + model identity, see record/trial.trial_key) already has a
valid result under its results root is skipped; failed or unfinished ones are measured again. Every result is
committed atomically as soon as its trial ends, so killing a sweep loses nothing already finished.
"""

from __future__ import annotations

from corescale.config import RayExecutorConfig
from corescale.errors import UserError
from corescale.measure.runner import check_stated_precision, prepare_trial
from corescale.overrides import compose
from corescale.trials.local import Listener, LoopState, Planned, run_trials


def plan_sweep(trials: list[list[str]], topology=None) -> list[Planned]:
    """Every trial composed and checked before the first one runs (bad input: UserError naming the trial)."""
    planned = []
    for number, overrides in enumerate(trials, 1):
        try:
            trial = prepare_trial(compose(overrides), topology)
            check_stated_precision(trial, overrides)
        except UserError as exc:
            where = f"trial {number} ({' '.join(overrides)}): " if len(trials) > 1 else ""
            raise UserError(f"{where}{exc}") from None
        planned.append(Planned(number, overrides, trial))
    label(planned)
    return planned


def label(planned: list[Planned]) -> None:
    """Each trial's label: the overrides it does not share with every other trial."""
    shared = set.intersection(*(set(item.overrides) for item in planned)) if len(planned) > 1 else set()
    for item in planned:
        item.label = " ".join(o for o in item.overrides if o not in shared) or " ".join(item.overrides) or "(defaults)"


def run_sweep(planned: list[Planned], listener: Listener | None = None, fail_fast: bool = False,
              resume: bool = True, keep_going: bool = True, on_lock_wait=None,
              accept_foreign: bool = False, forkservers=None) -> LoopState:
    """Runs planned trials where their executor says: here, one at a time, or on a Ray cluster
    (forkservers: a caller's, kept across its local loops; Ray nodes start their own workers)."""
    executor = planned[0].trial.cfg.executor if planned else None
    if isinstance(executor, RayExecutorConfig):
        from corescale.trials.ray import RayExecutor

        return RayExecutor(executor).run(planned, listener, resume=resume, fail_fast=fail_fast,
                                         accept_foreign=accept_foreign)
    return run_trials(planned, listener, resume=resume, fail_fast=fail_fast, keep_going=keep_going,
                      on_lock_wait=on_lock_wait, accept_foreign=accept_foreign, forkservers=forkservers)
