"""Runs trials strictly one at a time (timing must not share cores), each in fresh worker processes."""

from __future__ import annotations

from corescale import environment
from corescale.console import TrialProgress, console, errors, print_result
from corescale.errors import UserError
from corescale.overrides import compose
from corescale.runner import execute, prepare_trial

EXIT_OK, EXIT_FAILED = 0, 1


def run_single(overrides: list[str], progress: bool = True) -> int:
    trial = prepare_trial(compose(overrides))
    with TrialProgress(trial.cfg, enabled=progress) as bars:
        outcome = execute(trial, on_event=bars)
    print_result(outcome.record, outcome.path)
    if not outcome.ok:
        errors.print(f"[red]run failed:[/red] {outcome.record['reason']}")
    return EXIT_OK if outcome.ok else EXIT_FAILED


def run_sweep(trials: list[list[str]], fail_fast: bool = False, progress: bool = True) -> int:
    configs = [compose(overrides) for overrides in trials]  # every trial checked before the first one runs
    prepared = [prepare_trial(cfg) for cfg in configs]
    host = environment.capture()
    failures = 0
    for number, (overrides, trial) in enumerate(zip(trials, prepared), 1):
        console.print(f"[bold]trial {number}/{len(trials)}[/bold]: {' '.join(overrides)}")
        try:
            with TrialProgress(trial.cfg, enabled=progress) as bars:
                outcome = execute(trial, on_event=bars, host=host)
        except UserError as exc:
            raise UserError(f"trial {number} ({' '.join(overrides)}): {exc}") from None
        print_result(outcome.record, outcome.path)
        if not outcome.ok:
            failures += 1
            errors.print(f"[red]trial {number} failed:[/red] {outcome.record['reason']}")
            if fail_fast:
                break
    console.print(f"{len(trials)} trials, {failures} failed")
    return EXIT_OK if not failures else EXIT_FAILED
