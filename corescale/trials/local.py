"""The one local trial loop: `run`, `run -m`, every `study`, `tune` and server run go through it.

For each planned trial, strictly one at a time (timing must not share cores): resume (a valid result with the
same key under the trial's results root is reused, not measured again) -> machine lock -> measure in fresh
pinned worker processes -> stamp -> commit atomically -> tell the listener. A trial that raises becomes a
failed record with its reason (or, with keep_going=False, the error ends the loop). Nothing here draws: the
listener (the command's) does. The Ray executor (ray.py) is the only other loop; it shares the schedule, the
resume (Resume), the loop state, --fail-fast, stamp and commit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from corescale.machine import environment
from corescale.machine.environment import HostEnvironment
from corescale.machine.lock import folder_lock, machine_lock
from corescale.measure.forkserver import ForkServers
from corescale.measure.runner import Trial, TrialOutcome, UncommittedResult, commit, failed_result, run_instances
from corescale.record.index import ResultIndex
from corescale.record.trial import Failure, TrialRecord, machine_fingerprint

FORKSERVER_ENV = "CORESCALE_FORKSERVER"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # stop a loop like Ctrl-C (interruptible)


@dataclass
class Planned:
    """A trial of a loop: its number, the overrides it came from and a label telling it apart from the others."""

    number: int
    overrides: list[str]
    trial: Trial
    label: str = ""
    resume_root: Path | None = None  # where earlier results count for resume (default: the results root)

    @property
    def key(self) -> str:
        return self.trial.key

    @property
    def root(self) -> Path:
        return self.trial.cfg.results_root

    @property
    def index_root(self) -> Path:
        return self.resume_root or self.root


@dataclass
class Row:
    item: Planned
    status: str  # ok | failed | skipped
    record: TrialRecord | None
    path: Path | None
    repeat: int = 0

    def result(self) -> TrialRecord:
        """The record: measured in this loop, or read from the file a skipped row found."""
        if self.record is not None:
            return self.record
        assert self.path is not None, "a row without a record is a skipped one, which names its file"
        from corescale.record.files import read_result

        return read_result(self.path)


def schedule(planned: list[Planned]) -> list[tuple[Planned, int]]:
    """(trial, repeat) in the order they run: round by round over every trial (A B C A B C ...), so drift over
    time spreads over all of them instead of aliasing onto the swept variable; `repeat_order=shuffled` puts
    each round in a random order seeded by the trials' `seed` and the round."""
    import random

    rounds = max((item.trial.cfg.repeats for item in planned), default=0)
    order: list[tuple[Planned, int]] = []
    for r in range(rounds):
        round_items = [item for item in planned if r < item.trial.cfg.repeats]
        if round_items and round_items[0].trial.cfg.repeat_order == "shuffled":
            random.Random(f"{round_items[0].trial.cfg.seed}-{r}").shuffle(round_items)
        order.extend((item, r) for item in round_items)
    return order


@dataclass
class LoopState:
    """What a loop has done so far; feeds the ETA and the closing summary."""

    total: int  # trials x repeats
    rows: list[Row] = field(default_factory=list)
    measured_seconds: list[float] = field(default_factory=list)
    stopped: bool = False  # --fail-fast ended the loop early
    position: int = 0  # the number (1-based) of the trial run or skipped last
    repeat: int = 0  # and which repeat of its trial that is
    # a re-run whose sentinel moved throughout as well: the slowdown outlasts a trial, and re-running measures the
    # same weather again (doubling every later trial on a busy host); later moved trials are flagged, not re-run
    slow_host: bool = False

    def eta_seconds(self, remaining: int) -> float | None:
        if not self.measured_seconds:
            return None
        return remaining * sum(self.measured_seconds) / len(self.measured_seconds)

    def count(self, status: str) -> int:
        return sum(1 for row in self.rows if row.status == status)

    @property
    def failed(self) -> int:
        return self.count("failed")

    def skip(self, item: Planned, existing: Path, repeat: int, listener: Listener) -> None:
        """A (trial, repeat) with a valid result already: not measured."""
        self.rows.append(Row(item, "skipped", None, existing, repeat))
        listener.skipped(item, existing, self)

    def finish(self, item: Planned, outcome: TrialOutcome, repeat: int, listener: Listener, fail_fast: bool) -> bool:
        """A measured (trial, repeat), committed; True when it failed and --fail-fast ends the loop here."""
        self.rows.append(Row(item, outcome.record.status, outcome.record, outcome.path, repeat))
        listener.finished(item, outcome, self)
        self.stopped = self.stopped or (fail_fast and not outcome.ok)
        return self.stopped

    def records_of(self, item: Planned) -> list[TrialRecord]:
        """Every repeat of one trial measured or found in this loop (skipped ones read from their files)."""
        return [row.result() for row in self.rows
                if row.item is item and (row.record is not None or row.path is not None)]


class Listener:
    """What a loop tells whoever shows it (every method may be left as it is: the loop works silently)."""

    def skipped(self, item: Planned, existing: Path, state: LoopState) -> None: ...

    def starting(self, item: Planned, state: LoopState) -> None: ...

    def worker_event(self, item: Planned, instance: int, event: dict[str, Any]) -> None: ...

    def finished(self, item: Planned, outcome: TrialOutcome, state: LoopState) -> None: ...

    def rerunning(self, item: Planned, outcome: TrialOutcome, state: LoopState) -> None:
        """The trial just measured is measured once more: its speed sentinel moved."""

    def slow_host(self, item: Planned, state: LoopState) -> None:
        """A re-run's sentinel moved throughout too: from now on moved trials are flagged, not re-run."""


class Resume:
    """What both loops' resume reads (this one and ray.py's): a valid result of a (trial, repeat) under the trial's
    resume root, measured on a machine and software that machines(item) names (fingerprints; None: any machine's,
    with --accept-foreign). Nothing counts when it is off (--rerun)."""

    def __init__(self, enabled: bool, machines: Callable[[Planned], frozenset[str] | None]):
        self.enabled, self.machines = enabled, machines
        self.indexes: dict[tuple, ResultIndex] = {}

    @classmethod
    def here(cls, enabled: bool, accept_foreign: bool, host: HostEnvironment) -> Resume:
        """Results of this machine and software count (any machine's: accept_foreign)."""
        machines = None if accept_foreign else frozenset([machine_fingerprint(host)])
        return cls(enabled, lambda item: machines)

    def index(self, item: Planned) -> ResultIndex:
        machines = self.machines(item)
        key = (item.index_root, machines)
        if key not in self.indexes:
            self.indexes[key] = ResultIndex(item.index_root, machines)
        return self.indexes[key]

    def find(self, item: Planned, repeat: int) -> Path | None:
        return self.index(item).find(item.key, repeat) if self.enabled else None


def stamp(measured: UncommittedResult, **fields) -> UncommittedResult:
    """What the driver adds before committing: when it finished, how long it waited, where it ran."""
    measured.record.finished_at = time.time()
    for name, value in fields.items():
        setattr(measured.record, name, value)
    return measured


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where SIGINT raises KeyboardInterrupt (the CLI exits 130 with one line)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name


@contextmanager
def interruptible():
    """While trials run, SIGTERM and SIGHUP stop them like Ctrl-C: the launcher stops every instance, the trial is
    recorded as interrupted, temp directories go, and the machine lock is released only after all that. A signal
    that this process inherited as ignored (`nohup` ignores SIGHUP) is left ignored, as Python does for SIGINT."""
    def stop(signum, frame):
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS
                if signal.getsignal(sig) != signal.SIG_IGN}  # ignored when we started (nohup): it stays ignored
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_trial(trial: Trial, host: HostEnvironment | None = None, on_event=None, keep_going: bool = True,
              on_lock_wait=None, repeat: int = 0, done_meanwhile=None, forkservers=None,
              rerun_of_moved: bool = False) -> TrialOutcome | Path:
    """Measure under the machine lock, then commit (failures too). keep_going: errors become failed records.
    done_meanwhile(), checked once the lock is held, returns a valid result that another process committed
    while this one waited: then nothing is measured and that path is returned."""
    started = time.time()
    host = replace(host or environment.capture(), load_average=list(os.getloadavg()))
    with interruptible(), machine_lock(on_wait=on_lock_wait) as waited:
        existing = done_meanwhile() if done_meanwhile else None
        if existing is not None:
            return existing
        try:
            measured = run_instances(trial, on_event, host, forkservers)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # one broken trial must not end the loop
            if not keep_going:
                raise
            measured = failed_result(trial, Failure.from_exception(exc), host, started)
        # still holding the lock: no other trial ran before this instant
        stamp(measured, lock_wait_s=waited, executor={"name": "local"}, repeat=repeat, repeats=trial.cfg.repeats)
        if rerun_of_moved and measured.record.contamination is not None:
            measured.record.contamination = replace(measured.record.contamination, rerun_of_moved=True)
        outcome = commit_once(measured, done_meanwhile)
    if measured.interrupted is not None:
        raise measured.interrupted  # the interrupted trial is on disk; the loop ends here
    return outcome


def commit_once(measured: UncommittedResult, done_meanwhile=None) -> TrialOutcome | Path:
    """Commits under the results root's commit lock (an flock on the folder), which every loop's commit takes
    (local and Ray, any process): done_meanwhile(), checked again under it, returns a valid result of the same
    key and repeat that another sweep committed meanwhile; then that path is returned and nothing is written
    (one key, one result)."""
    with folder_lock(measured.record.config.results_root):  # the results root's own flock: no file in it
        existing = done_meanwhile() if done_meanwhile else None
        if existing is not None:
            return existing
        return commit(measured)


def run_trials(planned: list[Planned], listener: Listener | None = None, resume: bool = True,
               fail_fast: bool = False, keep_going: bool = True, on_lock_wait=None,
               accept_foreign: bool = False, forkservers: ForkServers | None = None) -> LoopState:
    """Every planned trial, in order; returns what happened to each. Resume counts results measured on this
    machine and software only, unless accept_foreign. forkservers: a caller's, kept across its loops."""
    listener = listener or Listener()
    host = environment.capture()  # once per loop: the machine does not change between trials
    done = Resume.here(resume, accept_foreign, host)
    order = schedule(planned)
    state = LoopState(len(order))
    with forkservers_for(len(planned), forkservers) as servers:
        for number, (item, repeat) in enumerate(order, 1):
            state.position, state.repeat = number, repeat
            existing = done.find(item, repeat)
            if existing is not None:
                state.skip(item, existing, repeat, listener)
                continue
            listener.starting(item, state)
            started = time.monotonic()
            outcome = run_trial(item.trial, host, lambda i, e, item=item: listener.worker_event(item, i, e),
                                keep_going, on_lock_wait, repeat,
                                (lambda i=item, r=repeat: done.find(i, r)) if resume else None,
                                servers and servers.for_repeat(repeat))
            if isinstance(outcome, Path):  # a concurrent sweep measured it while this one waited for the lock
                state.skip(item, outcome, repeat, listener)
                continue
            if sentinel_moved(item, outcome) and not state.slow_host:  # repeats, a tune's final: once more
                listener.rerunning(item, outcome, state)
                again = run_trial(item.trial, host, lambda i, e, item=item: listener.worker_event(item, i, e),
                                  keep_going, on_lock_wait, repeat, None, servers and servers.for_repeat(repeat),
                                  rerun_of_moved=True)
                if isinstance(again, TrialOutcome):  # the new one counts
                    outcome = again
                    state.slow_host = moved_throughout(again)
                    if state.slow_host:
                        listener.slow_host(item, state)
            state.measured_seconds.append(time.monotonic() - started)
            if state.finish(item, outcome, repeat, listener, fail_fast):
                break
    return state


def sentinel_moved(item: Planned, outcome: TrialOutcome) -> bool:
    """A valid trial of a configuration measured several times (`repeats`, a tune's final rounds) whose speed
    sentinel moved both before and after it, and which is not itself a re-run. One side alone is flagged, not re-run:
    on the Zen 5 guest a vCPU's GEMM flipped between 2.0 and 3.9 ms within seconds (no steal counted), so a
    one-sided reading re-ran most trials and measured the same weather again."""
    found = outcome.record.contamination
    return item.trial.cfg.repeats > 1 and moved_throughout(outcome) and found is not None and not found.rerun_of_moved


def moved_throughout(outcome: TrialOutcome) -> bool:
    """A valid trial whose speed sentinel moved both before and after it."""
    found = outcome.record.contamination
    return outcome.record.valid_ok and found is not None and found.sentinel_moved_throughout


def fork_workers() -> bool:
    return os.environ.get(FORKSERVER_ENV) != "0"


@contextmanager
def forkservers_for(configs: int, given: ForkServers | None = None):
    """Workers of a loop over several configurations start as forks of pre-imported servers, one set per repeat
    (CORESCALE_FORKSERVER=0: every worker starts fresh)."""
    if given is not None or configs < 2 or not fork_workers():
        yield given
        return
    with ForkServers.temporary() as servers:
        yield servers
