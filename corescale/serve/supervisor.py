"""What happens to one of `corescale serve`'s instances, in one place: its starts (each a generation of its own),
the thread that follows its messages, the deadline of the batch it computes (its whole session killed past it),
the restart policy (at once after it was serving, then doubling waits while its starts keep failing) and whether
/health counts it (ready, and its batch in flight, if any, within half its deadline).

Restarts are a serving policy: measurement's launcher fails the run instead (a restarted instance is not the
measured one), so the policy lives here, beside the pool that feeds the instances (serve/pool.py), rather than
beside InstanceHandle (measure/instance.py), which both share. Every thread here logs an unexpected error (`say`,
`survived`: a closed stdout silences the log instead of failing the thread) and carries on.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Protocol

from corescale.machine import instance_env
from corescale.measure import protocol
from corescale.measure.instance import Handshake, InstanceHandle, how_it_ended

RESTART_BACKOFF_S = (0.5, 30.0)  # first wait after a failed start, and the longest
BATCH_DEADLINE_S = 10.0  # the floor of a batch's deadline (--batch-timeout)
DEADLINE_CALLS = 20  # ...plus this many warm calls (the ready event's, at the largest batch)
LOG_BOUND = 8 << 20  # an instance's log is cut to its last LOG_KEEP bytes when a start finds it larger
LOG_KEEP = 1 << 20


class Owner(Protocol):
    """What an instance needs of the pool that owns it (serve/pool.py's Pool)."""

    batch_deadline_s: float  # the floor of a batch's deadline

    def ended(self, instance: ServedInstance, code: int) -> None:
        """Its process ended (exit status `code`): the pool decides whether it starts again."""


def say(text: str, stream=None, who: str = "corescale serve") -> None:
    """One line of the service's log (stdout, or `stream`); a closed pipe (`corescale serve B | head`) silences
    it instead of raising in whichever thread logs."""
    stream = stream or sys.stdout
    try:
        print(f"{who}: {text}", file=stream, flush=True)
    except (OSError, ValueError):
        try:  # later writes and the flush at exit go nowhere instead of failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError):
            pass


def survived(where: str) -> None:
    """An unexpected error in a supervisor thread: logged (with its traceback, on stderr); the thread goes on."""
    say(f"unexpected error in {where} (carrying on): {traceback.format_exc().rstrip()}", sys.stderr)


LATE = object()  # next_reply's answer when the deadline passed


class ServedInstance:
    """One pinned worker and what happens to it: started (again, when it dies: each start a generation of its
    own, backing off while it keeps failing), the thread that follows its messages, the deadline of the batch it
    computes (killed past it), whether it counts as ready."""

    def __init__(self, pool: Owner, number: int, job: protocol.Job, path: Path, launch: instance_env.Launch,
                 log: Path):
        self.pool, self.id, self.job, self.path, self.launch, self.log = pool, number, job, path, launch, log
        self.ready = threading.Event()
        self.replies: queue.Queue = queue.Queue()
        self.generation = 0
        self.handle: InstanceHandle | None = None
        self.reader: threading.Thread | None = None
        self.restarts = 0
        self.failed_starts = 0  # in a row, since it was last ready: the backoff's exponent
        self.due_at = 0.0  # when its next start is due (time.monotonic), while it is down
        self.failure: str | None = None  # the last failure's message
        self.failure_kind = "error"  # user: bad input (UserError in the worker)
        self.sent_at: float | None = None  # monotonic instant the batch in flight was sent (None: idle)
        self.killed: str | None = None  # why the supervisor killed this generation (its deadline)
        self.busy_ns = 0
        self.since_ns = time.perf_counter_ns()
        self.result: dict | None = None  # its report at stop
        self.artifact: str | None = None  # the file its backend runs (the Loaded message), where it has one

    def start(self) -> None:
        """A new generation: its job file written again when it is gone (a cleaned temporary folder), its log
        cut when it grew past LOG_BOUND."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.job.write(self.path)
        bound_log(self.log)
        self.generation += 1
        self.killed = None
        self.handle = InstanceHandle.spawn(self.id, self.launch, self.path, self.log, append=True)
        self.reader = threading.Thread(target=self.follow, args=(self.handle, self.generation), daemon=True,
                                       name=f"corescale-serve-reader-{self.id}")
        self.reader.start()

    def tell(self, command: protocol.Command) -> bool:
        return self.handle is not None and self.handle.tell(command)

    def follow(self, handle: InstanceHandle, generation: int) -> None:
        """Its messages until it ends: the start handshake, answers, its failure, its result; then its end
        reported, whatever happened meanwhile."""
        try:
            self.read(handle, generation)
        except Exception:
            survived(f"the reader of instance {self.id}")
            handle.signal_group(signal.SIGKILL)  # a reader that cannot follow it ends it: it starts again
        try:
            code = handle.process.wait()
            self.ready.clear()
            self.replies.put((generation, None))
            self.pool.ended(self, code)
        except Exception:
            survived(f"the reader of instance {self.id}")

    def read(self, handle: InstanceHandle, generation: int) -> None:
        handshake = Handshake([handle])  # each instance starts on its own, at once
        for message in handle.messages():
            if isinstance(message, protocol.ProtocolError):
                self.failure = f"sent a malformed message: {message}"
                continue
            handle.heard(message)
            if handshake.heard(message) is not None:
                self.failed_starts = 0
                self.ready.set()
            if isinstance(message, (protocol.Answered, protocol.Unanswered)):
                self.replies.put((generation, message))
            elif isinstance(message, protocol.WorkerFailure):
                self.failure, self.failure_kind = message.message, message.kind
            self.artifact, self.result = handle.artifact or self.artifact, handle.result

    def how_it_ended(self, code: int) -> str:
        why = self.killed or self.failure
        return f"instance {self.id} {how_it_ended(code)[0]}" + (f": {why}" if why else "")

    def deadline_s(self) -> float:
        """The longest a batch may take: the floor plus DEADLINE_CALLS of its warm calls."""
        call_ns = self.handle.call_ns if self.handle is not None else 0
        return self.pool.batch_deadline_s + DEADLINE_CALLS * call_ns / 1e9

    def responsive(self) -> bool:
        """Ready, and not late: its batch in flight (if any) is within half its deadline (/health)."""
        sent = self.sent_at
        return self.ready.is_set() and (sent is None or time.monotonic() - sent < self.deadline_s() / 2)

    def next_reply(self, generation: int, number: int) -> protocol.Answered | protocol.Unanswered | None:
        """Its answer to batch `number` (an `unanswered` without a number counts: one batch is in flight); None
        when that generation ended first; LATE past the deadline."""
        sent = self.sent_at if self.sent_at is not None else time.monotonic()
        while True:
            left = sent + self.deadline_s() - time.monotonic()
            try:
                seen, message = self.replies.get(timeout=max(left, 0.001))
            except queue.Empty:
                return LATE  # type: ignore[return-value]
            if seen == generation and (message is None or message.batch == number
                                       or isinstance(message, protocol.Unanswered) and message.batch == -1):
                return message
            if seen == generation and isinstance(message, protocol.Unanswered):
                say(f"instance {self.id} could not compute batch {message.batch}, which it was not sent by this "
                    f"service: {message.message}")

    def kill_late(self, handle: InstanceHandle | None) -> None:
        """Past its deadline: the whole session killed (a stopped or hung process included); its reader then
        sees it end and the keeper starts it again."""
        if handle is None:
            return
        self.killed = f"it did not answer a batch within {self.deadline_s():.1f} s and was killed"
        self.ready.clear()
        handle.signal_group(signal.SIGKILL)

    def backing_off(self) -> bool:
        """Down after a start that failed: it waits before its next start (restart_wait_s), so nothing queued
        for it would be computed soon."""
        return not self.ready.is_set() and self.failed_starts >= 2

    def restart_wait_s(self) -> float:
        """The restart policy: at once after it was serving, then doubling waits while its starts keep failing."""
        self.failed_starts += 1
        if self.failed_starts == 1:
            return 0.0
        return min(RESTART_BACKOFF_S[0] * 2 ** min(self.failed_starts - 2, 10), RESTART_BACKOFF_S[1])

    def busy_fraction(self) -> float:
        return self.busy_ns / max(time.perf_counter_ns() - self.since_ns, 1)


def bound_log(log: Path) -> None:
    """Keeps an instance's log (appended to by every start) under LOG_BOUND: its last LOG_KEEP bytes."""
    try:
        if log.stat().st_size <= LOG_BOUND:
            return
        with open(log, "rb") as handle:
            handle.seek(-LOG_KEEP, os.SEEK_END)
            tail = handle.read()
        log.write_bytes(b"[earlier output cut by corescale serve]\n" + tail)
    except OSError:
        pass


def log_tail(instance: ServedInstance) -> str:
    """The end of an instance's log, to print: the log itself goes with the service's temporary folder."""
    tail = instance.handle.stderr_tail() if instance.handle is not None else ""
    return f"; the end of its log:\n{tail}" if tail else ""
