"""Where trials run: here, one at a time (LocalExecutor), or one per node of a Ray cluster (RayExecutor).

Both take prepared trials (runner.prepare_trial on the driver has validated them) and call
`on_outcome(trial, outcome)` once per trial, right after its result directory is committed.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Callable

from corescale.measure.runner import Measured, Trial, TrialOutcome, commit, measure

OnOutcome = Callable[[Trial, TrialOutcome], None]


def trial_key(trial: Trial) -> str:
    """The resume key of a trial (resolved config + model identity), as sweeps use it."""
    from corescale.results.store import spec_key

    return spec_key(trial.cfg, trial.model)


def completed_keys(root) -> set[str]:
    """Keys of the trials that already have a valid, successful result under root."""
    from corescale.results.store import ResultIndex

    index = ResultIndex(root)
    index.refresh()
    return set(index.ok)


def output_root(trial: Trial) -> Path:
    return Path(os.path.expanduser(trial.cfg.output_dir))


def failed_measured(cfg, reason: str, host: dict | None, started: float, **extra) -> Measured:
    """A trial that ended before producing its own record still leaves one, with its reason."""
    record = {
        "config": cfg.to_dict(),
        "key": cfg.key(),
        "environment": host or {},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "status": "failed",
        "reason": reason,
        "valid": False,
        "elapsed_s": time.time() - started,
        **extra,
    }
    return Measured(record, None, {})


def error_measured(cfg, exc: BaseException, host: dict | None, started: float) -> Measured:
    """A failed Measured for an exception; a UserError keeps its one-line message and is marked as such."""
    from corescale.errors import UserError

    if isinstance(exc, UserError):
        return failed_measured(cfg, f"bad input: {exc}", host, started, user_error=True)
    return failed_measured(cfg, f"{type(exc).__name__}: {exc}", host, started, user_error=False,
                           traceback=traceback.format_exc())


def stamp(measured: Measured, trial: Trial, key: str | None = None, **fields) -> Measured:
    """What the driver adds before committing: the resume key, when it finished, where it ran."""
    measured.record.update(trial_key=key or trial_key(trial), finished_at=time.time(), **fields)
    return measured


class LocalExecutor:
    """Today's behaviour: trials strictly one after another on this machine."""

    def __init__(self, on_event=None, host: dict | None = None):
        self.on_event = on_event
        self.host = host

    def run(self, trials: list[Trial], on_outcome: OnOutcome) -> None:
        for trial in trials:
            measured = stamp(measure(trial, self.on_event, self.host), trial, executor={"name": "local"})
            on_outcome(trial, commit(trial.cfg, measured))


def create_executor(cfg):
    """The executor a config asks for (`executor=local` or `executor=ray ...`)."""
    from corescale.config import EXECUTORS, RayExecutorConfig
    from corescale.errors import UserError

    settings = cfg.executor
    if isinstance(settings, RayExecutorConfig):
        from corescale.trials.ray import RayExecutor

        return RayExecutor(settings)
    if settings.name == "local":
        return LocalExecutor()
    raise UserError(f"unknown executor '{settings.name}'; allowed: {', '.join(EXECUTORS)}")
