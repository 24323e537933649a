"""Runs trials strictly one at a time (timing must not share cores), each in fresh worker processes.

Sweeps resume: a trial whose key (resolved config + model identity, see store.trial_key) already has a valid
result under its output root is skipped; failed or unfinished ones are measured again. Every result is
committed atomically as soon as its trial ends, so killing a sweep loses nothing already finished. A
machine-wide lock keeps trials of concurrent sweeps (or runs) from overlapping.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from corescale.errors import UserError
from corescale.machine import environment
from corescale.measure.runner import Trial, TrialOutcome, commit, measure, prepare_trial
from corescale.overrides import compose
from corescale.report.console import TrialProgress, console, errors, print_result
from corescale.results.store import ResultIndex, spec_key
from corescale.trials import create_executor, error_measured

EXIT_OK, EXIT_FAILED = 0, 1
LOCK_PATH = Path(tempfile.gettempdir()) / "corescale-trials.lock"


@contextmanager
def machine_lock(path: Path = LOCK_PATH):
    """One trial at a time on this machine, across processes (released by the kernel if we die).

    Yields the seconds spent waiting for another process's trial."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    started = time.monotonic()
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            errors.print(f"waiting for another corescale trial on this machine to finish (lock {path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield time.monotonic() - started
    finally:
        os.close(fd)  # closing releases the lock


@dataclass
class Planned:
    number: int
    overrides: list[str]
    trial: Trial
    key: str
    label: str = ""  # the overrides that tell this trial apart from the others

    @property
    def root(self) -> Path:
        return Path(os.path.expanduser(self.trial.cfg.output_dir))


@dataclass
class SweepState:
    """What a sweep has done so far; feeds the ETA and the closing summary."""

    total: int
    rows: list[tuple[Planned, str, dict | None, Path | None]] = field(default_factory=list)
    measured_seconds: list[float] = field(default_factory=list)

    def eta(self, remaining: int) -> str:
        if not self.measured_seconds:
            return "ETA after first trial"
        seconds = remaining * sum(self.measured_seconds) / len(self.measured_seconds)
        return f"ETA {time.strftime('%H:%M:%S', time.gmtime(seconds))}"

    def count(self, status: str) -> int:
        return sum(1 for row in self.rows if row[1] == status)


class SweepProgress(TrialProgress):
    """The trial's bars plus one over the whole sweep."""

    def __init__(self, cfg, enabled: bool, done: int, total: int, eta: str):
        super().__init__(cfg, enabled)
        self.sweep = (done, total, eta)

    def __enter__(self):
        super().__enter__()
        done, total, eta = self.sweep
        self.progress.add_task(f"sweep {done}/{total}", total=total, completed=done, info=eta)
        return self


def plan_sweep(trials: list[list[str]]) -> list[Planned]:
    """Every trial composed and checked before the first one runs (bad input: UserError naming the trial)."""
    planned = []
    for number, overrides in enumerate(trials, 1):
        try:
            trial = prepare_trial(compose(overrides))
        except UserError as exc:
            where = f"trial {number} ({' '.join(overrides)}): " if len(trials) > 1 else ""
            raise UserError(f"{where}{exc}") from None
        planned.append(Planned(number, overrides, trial, spec_key(trial.cfg, trial.model)))
    shared = set.intersection(*(set(item.overrides) for item in planned)) if len(planned) > 1 else set()
    for item in planned:
        item.label = " ".join(o for o in item.overrides if o not in shared) or " ".join(item.overrides) or "(defaults)"
    return planned


def run_trial(planned: Planned, host: dict, on_event=None, keep_going: bool = True) -> TrialOutcome:
    """Measure under the machine lock, then commit (failures too). keep_going: errors become failed records."""
    started = time.time()
    host = {**host, "load_average": list(os.getloadavg())}
    with machine_lock() as waited:
        try:
            measured = measure(planned.trial, on_event, host)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - one broken trial must not end the sweep
            if not keep_going:
                raise
            measured = error_measured(planned.trial.cfg, exc, host, started)
            measured.record.update(model=planned.trial.model.identity(), plan=planned.trial.plan.to_dict())
        finished = time.time()  # still holding the lock: no other trial ran before this instant
    trial = planned.trial
    reused = [inst.id for inst, threads in zip(trial.plan.instances, trial.threads)
              if trial.cfg.calibrate and (tuple(inst.cpus), threads) in trial.sgemm_known]
    measured.record.update(trial_key=planned.key, finished_at=finished, sgemm_reused_instances=reused,
                           lock_wait_s=waited)
    return commit(planned.trial.cfg, measured)


def run_single(overrides: list[str], progress: bool = True) -> int:
    trial = prepare_trial(compose(overrides))
    planned = Planned(1, overrides, trial, spec_key(trial.cfg, trial.model), " ".join(overrides))
    with TrialProgress(trial.cfg, enabled=progress) as bars:
        outcome = run_trial(planned, environment.capture(), on_event=bars, keep_going=False)
    print_result(outcome.record, outcome.path)
    if not outcome.ok:
        errors.print(f"[red]run failed:[/red] {escape(str(outcome.record['reason']))}")
    return EXIT_OK if outcome.ok else EXIT_FAILED


def remember_sgemm(record: dict, known: dict) -> None:
    """SGEMM rates a trial calibrated, by (cpus, threads): later trials on the same cores skip calibration."""
    placed = {inst["id"]: inst for inst in (record.get("plan") or {}).get("instances", [])}
    for report in record.get("instances") or []:
        inst = placed.get(report.get("instance"))
        if inst is not None and report.get("sgemm_gflops"):
            known[(tuple(inst["cpus"]), inst["threads"])] = report["sgemm_gflops"]


def run_sweep(trials: list[list[str]], fail_fast: bool = False, progress: bool = True, resume: bool = True,
              listener=None) -> int:
    """listener(planned, instance, event), if given, sees every worker event (benchmarks time the stages)."""
    planned = plan_sweep(trials)
    if planned and planned[0].trial.cfg.executor.name != "local":
        return _run_remote(planned)
    indexes: dict[Path, ResultIndex] = {}
    host = environment.capture()  # once per sweep: the machine does not change between trials
    sgemm_known: dict = {}
    state = SweepState(len(planned))
    for item in planned:
        item.trial.sgemm_known = sgemm_known
        index = indexes.setdefault(item.root, ResultIndex(item.root))
        existing = index.find(item.key) if resume else None
        if existing is not None:
            console.print(f"trial {item.number}/{state.total} skipped (valid result exists: {existing}): "
                          f"{escape(item.label)}", soft_wrap=True)
            state.rows.append((item, "skipped", None, existing))
            continue
        remaining = state.total - item.number + 1
        eta = state.eta(remaining)
        console.print(f"[bold]trial {item.number}/{state.total}[/bold] ({eta}): {escape(item.label)}")
        started = time.monotonic()
        with SweepProgress(item.trial.cfg, progress, item.number - 1, state.total, eta) as bars:
            outcome = run_trial(item, host, on_event=_tee(bars, listener, item))
        state.measured_seconds.append(time.monotonic() - started)
        remember_sgemm(outcome.record, sgemm_known)
        index.refresh()
        state.rows.append((item, outcome.record["status"], outcome.record, outcome.path))
        if progress:
            print_result(outcome.record, outcome.path)
        else:
            console.print(f"  {escape(_brief(outcome.record))} -> {escape(str(outcome.path))}", soft_wrap=True)
        if not outcome.ok:
            errors.print(f"[red]trial {item.number} failed:[/red] {escape(str(outcome.record['reason']))}")
            if fail_fast:
                errors.print("stopping the sweep (--fail-fast)")
                break
    _summary(state, sorted({str(item.root) for item in planned}))
    return EXIT_FAILED if state.count("failed") else EXIT_OK


def _run_remote(planned: list[Planned]) -> int:
    """Trials fan out over a cluster (executor=ray): the executor resumes, retries and commits each result.

    Trials already in flight on other nodes finish whatever happens, so --fail-fast does not apply here."""
    state = SweepState(len(planned))
    by_trial = {id(item.trial): item for item in planned}
    executor = create_executor(planned[0].trial.cfg)

    def on_outcome(trial: Trial, outcome: TrialOutcome) -> None:
        item = by_trial[id(trial)]
        state.rows.append((item, outcome.record["status"], outcome.record, outcome.path))
        node = (outcome.record.get("node") or {}).get("hostname", "?")
        console.print(f"trial {item.number}/{state.total} on {escape(str(node))}: "
                      f"{escape(_brief(outcome.record))} -> {escape(str(outcome.path))}", soft_wrap=True)

    executor.run([item.trial for item in planned], on_outcome)
    for trial, why in getattr(executor, "skipped", []):
        state.rows.append((by_trial[id(trial)], "skipped", None, why))
    _summary(state, sorted({str(item.root) for item in planned}))
    return EXIT_FAILED if state.count("failed") else EXIT_OK


def _tee(bars, listener, item):
    if listener is None:
        return bars

    def on_event(instance: int, event: dict) -> None:
        bars(instance, event)
        listener(item, instance, event)

    return on_event


def _brief(record: dict) -> str:
    metrics = record.get("metrics")
    if record["status"] != "ok" or not metrics:
        return f"failed: {record.get('reason')}"
    return (f"p50 {metrics['latency_s']['p50'] * 1e3:.2f} ms, p99 {metrics['latency_s']['p99'] * 1e3:.2f} ms, "
            f"{metrics['throughput_samples_per_s']:.2f} samples/s")


def _summary(state: SweepState, roots: list[str]) -> None:
    from rich.table import Table

    table = Table(title="sweep", header_style="bold")
    for column in ("#", "trial", "status", "result"):
        table.add_column(column)
    for item, status, record, path in state.rows:
        colour = {"ok": "green", "failed": "red"}.get(status, "dim")
        detail = _brief(record) if record else str(path)
        table.add_row(str(item.number), escape(item.label), f"[{colour}]{status}[/{colour}]", escape(detail))
    console.print(table)
    not_run = state.total - len(state.rows)
    console.print(f"{state.total} trials: {state.count('ok')} measured ok, {state.count('failed')} failed, "
                  f"{state.count('skipped')} skipped (already done)" + (f", {not_run} not run" if not_run else ""))
    for root in roots:
        console.print(escape(f"results: {root}  (corescale results {root})"), soft_wrap=True)
