"""The bundle's pinned instances behind one queue: started as measurement starts them, fed by the server
scenario's dynamic batching, watched, and restarted when one dies or hangs.

Each instance is a worker as measurement starts it (measure/instance.py's InstanceHandle) with the launch its
measurement recorded (CPUs, numactl, thread/OpenMP/allocator environment), in serving mode: it loads, warms up
(every batch size up to the bundle's max batch), then answers `Infer` commands with `answered` lines holding the
output rows (measure/protocol.py), or `unanswered` for a batch it could not compute (those requests get 500; the
instance serves on). A reader thread per instance follows its messages; a dispatcher thread per instance
(measure/instance.py's dispatch loop) takes the next batch from the one Batcher whenever its instance is ready and
idle; one keeper thread starts instances again.

What happens to an instance, in one place (ServedInstance): a batch has a deadline (`deadline_s`: a floor plus
DEADLINE_CALLS warm calls); past it the instance's whole session is killed and the batch's requests get 503. An
instance that dies fails only the batch it was computing (503); a batch it had not been sent goes back to the head
of the queue; it is started again (at once the first time, then backing off while it keeps failing; a start that
raises is retried the same way). /health counts the instances that are ready and not late (a batch in flight past
half its deadline). Every thread logs an unexpected error and carries on: a dispatcher's fails its batch (500).
Restarts are a serving policy: measurement's launcher fails the run instead (a restarted instance is not the
measured one), so the policy lives here rather than beside InstanceHandle.
"""

from __future__ import annotations

import asyncio
import base64
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.measure import protocol
from corescale.measure.batching import Batcher, Waiting
from corescale.measure.instance import Handshake, InstanceHandle, dispatch, how_it_ended, stop_all
from corescale.serve.opened import Bundle

RESTART_BACKOFF_S = (0.5, 30.0)  # first wait after a failed start, and the longest
STOP_GRACE_S = 5.0  # the longest stopped instances have to send their reports
DRAIN_S = 10.0  # after the front's drain, the longest the dispatchers may take before queued inputs get 503
BATCH_DEADLINE_S = 10.0  # the floor of a batch's deadline (--batch-timeout)
DEADLINE_CALLS = 20  # ...plus this many warm calls (the ready event's, at the largest batch)
LOG_BOUND = 8 << 20  # an instance's log is cut to its last LOG_KEEP bytes when a start finds it larger
LOG_KEEP = 1 << 20


def say(text: str, stream=None) -> None:
    """One line of the service's log (stdout, or `stream`); a closed pipe (`corescale serve B | head`) silences
    it instead of raising in whichever thread logs."""
    stream = stream or sys.stdout
    try:
        print(f"corescale serve: {text}", file=stream, flush=True)
    except (OSError, ValueError):
        try:  # later writes and the flush at exit go nowhere instead of failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError):
            pass


def survived(where: str) -> None:
    """An unexpected error in a supervisor thread: logged (with its traceback, on stderr); the thread goes on."""
    say(f"unexpected error in {where} (carrying on): {traceback.format_exc().rstrip()}", sys.stderr)


class Overloaded(Exception):
    """The queue is full: the request is refused (429)."""


class InstanceDied(Exception):
    """The instance computing the request died, or was killed for missing its deadline (503)."""


class BatchFailed(Exception):
    """The request's batch could not be computed: the instance said so, or the supervisor failed on it (500)."""


@dataclass
class Request:
    """One HTTP request's inputs (token ids), resolved on the event loop when every row is answered."""

    rows: list[np.ndarray]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    types: list[np.ndarray] | None = None  # token type ids of each row (pairs)
    outputs: list[Any] = field(default_factory=list)
    left: int = 0
    queue_ns: int = 0  # the longest any of its rows waited for an instance
    inference_ns: int = 0  # the longest call any of its rows was in

    def __post_init__(self) -> None:
        self.outputs = [None] * len(self.rows)
        self.left = len(self.rows)

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        def set_it() -> None:
            if not self.future.done():
                self.future.set_exception(error) if error else self.future.set_result(result)
        try:
            self.loop.call_soon_threadsafe(set_it)
        except RuntimeError:  # the event loop is closed: the front has stopped, nobody waits any more
            pass


@dataclass
class Row:
    request: Request
    index: int


def infer(number: int, rows: list[Row]) -> protocol.Infer:
    """The rows' token ids (and token type ids, a pair's) as the worker's `Infer` command."""
    return protocol.Infer(number, [row.request.rows[row.index].tolist() for row in rows],
                          [None if row.request.types is None else row.request.types[row.index].tolist()
                           for row in rows])


LATE = object()  # next_reply's answer when the deadline passed


class ServedInstance:
    """One pinned worker and what happens to it: started (again, when it dies: each start a generation of its
    own, backing off while it keeps failing), the thread that follows its messages, the deadline of the batch it
    computes (killed past it), whether it counts as ready."""

    def __init__(self, pool: Pool, number: int, job: protocol.Job, path: Path, launch: instance_env.Launch,
                 log: Path):
        self.pool, self.id, self.job, self.path, self.launch, self.log = pool, number, job, path, launch, log
        self.ready = threading.Event()
        self.replies: queue.Queue = queue.Queue()
        self.generation = 0
        self.handle: InstanceHandle | None = None
        self.reader: threading.Thread | None = None
        self.restarts = 0
        self.failed_starts = 0  # in a row, since it was last ready: the backoff's exponent
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


@dataclass
class RequestFeeder:
    """One instance's side of the service's queue: a batch is sent only while it is ready; one never sent goes
    back to the head of the queue; one it was computing when it died or went past its deadline fails (503);
    one it could not compute fails (500)."""

    instance: ServedInstance
    batcher: Batcher
    number: int = 0
    generation: int = 0  # of the instance the batch was sent to
    batch: list[Waiting] | None = None  # sent and not yet completed: failed (500) when this thread errs
    refused: protocol.Unanswered | None = None  # the instance's answer when it could not compute the batch

    def idle(self) -> bool:
        pool = self.instance.pool
        while not self.instance.ready.wait(0.2):
            if pool.stopping and self.batcher.closed and not self.batcher.waiting:
                return False
        return True

    def send(self, batch: list[Waiting]) -> bool:
        instance = self.instance
        self.generation = instance.generation
        self.number += 1
        self.batch = batch
        instance.sent_at = time.monotonic()
        if instance.ready.is_set() and instance.tell(infer(self.number, [w.sample for w in batch])):
            return True
        instance.sent_at, self.batch = None, None
        return False

    def reply(self) -> protocol.Served | None:
        instance, handle = self.instance, self.instance.handle
        reply = instance.next_reply(self.generation, self.number)
        if reply is LATE:
            instance.kill_late(handle)
            return None
        if isinstance(reply, protocol.Unanswered):
            self.refused = reply
            return None
        return reply

    def unsent(self, batch: list[Waiting]) -> None:
        self.batcher.requeue(batch)  # another instance (or this one, restarted) takes it

    def complete(self, batch: list[Waiting], taken_ns: int, reply: protocol.Served | None) -> None:
        pool, instance = self.instance.pool, self.instance
        instance.sent_at, refused, self.refused = None, self.refused, None
        if refused is not None:
            self.fail(BatchFailed(f"instance {instance.id} could not compute this request's batch: "
                                  f"{refused.message}"))
            return
        if not isinstance(reply, protocol.Answered):
            why = "did not answer in time" if instance.killed else "died while computing this request"
            self.fail(InstanceDied(f"instance {instance.id} {why}; it is being restarted"))
            return
        instance.busy_ns += reply.end_ns - reply.start_ns
        outputs = np.frombuffer(base64.b64decode(reply.rows), dtype="<f4").reshape(reply.shape)
        pool.metrics.batch(len(batch), (reply.end_ns - reply.start_ns) / 1e9, reply.length, reply.real_tokens)
        self.batch = None  # from here each row is answered once
        for position, row in enumerate(batch):
            request = row.sample.request
            request.queue_ns = max(request.queue_ns, taken_ns - row.arrived_ns)
            request.inference_ns = max(request.inference_ns, reply.end_ns - reply.start_ns)
            pool.finish(row.sample, outputs[position], None)

    def fail(self, error: BaseException) -> None:
        """The batch in flight (if any) answered with `error`."""
        batch, self.batch, self.instance.sent_at = self.batch, None, None
        for row in batch or []:
            self.instance.pool.finish(row.sample, None, error)

    def run(self) -> None:
        """The dispatch loop, kept going through any error: the batch it was on fails (500)."""
        while True:
            try:
                dispatch(self.batcher, self)
                return
            except Exception:
                survived(f"the dispatcher of instance {self.instance.id}")
                self.fail(BatchFailed("corescale serve failed on this request's batch (see its log)"))


class Pool:
    def __init__(self, opened: Bundle, work: Path, metrics, max_queue: int,
                 batch_deadline_s: float = BATCH_DEADLINE_S):
        self.bundle, self.work, self.metrics, self.max_queue = opened, work, metrics, max_queue
        self.batch_deadline_s = batch_deadline_s
        self.batcher = Batcher(opened.cfg, np.zeros(0, dtype=np.int64))
        self.lock = threading.Lock()
        self.pending = 0  # inputs accepted and not yet answered
        self.draining = False  # a stop signal arrived: no restarts
        self.stopping = False  # no new requests
        self.instances: list[ServedInstance] = []
        self.dispatchers: list[threading.Thread] = []
        self.due: queue.Queue = queue.Queue()  # (when, instance) to start again; (0, None) ends the keeper
        self.keeper = threading.Thread(target=self.keep, daemon=True, name="corescale-serve-keeper")

    def start(self, timeout_s: float) -> None:
        """Every instance started and ready (warm), or UserError/RuntimeError with the first failure."""
        from corescale.workload.models import configured_model

        cfg = self.bundle.cfg
        model = configured_model(cfg, judged=False)  # served: the quality reference stays behind
        jobs = protocol.Job.each(cfg, model, self.bundle.specs)
        for job, spec, launch in zip(jobs, self.bundle.specs, self.bundle.launches):
            self.instances.append(ServedInstance(self, spec.id, job, self.work / f"instance-{spec.id}.json", launch,
                                                 self.work / f"instance-{spec.id}.log"))
        for instance in self.instances:
            instance.start()
        deadline = time.monotonic() + timeout_s
        for instance in self.instances:
            while not instance.ready.wait(0.1):
                if instance.handle is not None and instance.handle.process.poll() is not None:
                    raise self.start_failure(instance)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"instance {instance.id} was not ready after {timeout_s:g} s"
                                       + log_tail(instance))
        self.keeper.start()
        for instance in self.instances:
            thread = threading.Thread(target=RequestFeeder(instance, self.batcher).run, daemon=True,
                                      name=f"corescale-serve-dispatch-{instance.id}")
            thread.start()
            self.dispatchers.append(thread)

    def start_failure(self, instance: ServedInstance) -> Exception:
        time.sleep(0.2)  # its reader may still be reading its last message
        assert instance.handle is not None
        message = instance.how_it_ended(instance.handle.process.wait())
        if instance.failure_kind == "user":
            return UserError(message)
        return RuntimeError(message + ("" if instance.failure else log_tail(instance)))

    def admit(self, rows: int) -> None:
        """Room for `rows` inputs in the queue, taken before any work on them (tokenizing), or Overloaded when
        they would pass the bound; submit() or release() follows."""
        with self.lock:
            if self.stopping:
                raise Overloaded("the service is stopping")
            if self.pending + rows > self.max_queue:
                raise Overloaded(f"the queue holds {self.pending} inputs (at most {self.max_queue})")
            self.pending += rows

    def release(self, rows: int) -> None:
        """Room admitted for a request refused before it was submitted."""
        with self.lock:
            self.pending -= rows

    def submit(self, request: Request) -> None:
        """Queues the request's rows (admitted first)."""
        now = time.perf_counter_ns()
        self.batcher.add([Waiting(Row(request, i), now, len(ids)) for i, ids in enumerate(request.rows)])

    def finish(self, row: Row, output: Any, error: BaseException | None) -> None:
        request = row.request
        with self.lock:
            self.pending -= 1
            request.outputs[row.index] = error or output
            request.left -= 1
            done = request.left == 0
        if done:
            failed = next((o for o in request.outputs if isinstance(o, BaseException)), None)
            request.settle(None if failed else request.outputs, failed)

    def fail_queued(self, why: str) -> None:
        """Every input still queued answered 503 (nothing will compute it)."""
        for item in self.batcher.clear():
            self.finish(item.sample, None, InstanceDied(why))

    def ended(self, instance: ServedInstance, code: int) -> None:
        """An instance's process ended: unless the service is stopping, it is started again."""
        if not self.dispatchers:
            return
        if self.draining:
            if not any(i.ready.is_set() for i in self.instances):
                self.fail_queued(f"{instance.how_it_ended(code)} while the service was stopping")
            return
        self.metrics.restarted(instance.id)
        instance.restarts += 1
        wait = instance.restart_wait_s()
        say(f"{instance.how_it_ended(code)}; starting it again" + (f" in {wait:g} s" if wait else ""))
        instance.failure = None
        self.due.put((time.monotonic() + wait, instance))

    def keep(self) -> None:
        """Starts the instances that died again, from this one long-lived thread: a pinned child dies with the
        thread that started it (PR_SET_PDEATHSIG follows the thread), so never from a short-lived one. A start
        that raises (no process: ENOMEM, a vanished numactl, a CPU set that changed) is tried again later."""
        while True:
            try:
                when, instance = self.due.get()
                if instance is None:
                    return
                time.sleep(max(when - time.monotonic(), 0))
                if self.draining:
                    continue
                try:
                    instance.start()
                except Exception as exc:
                    wait = instance.restart_wait_s()
                    say(f"instance {instance.id} could not start ({type(exc).__name__}: {exc}); trying again in "
                        f"{wait:g} s", sys.stderr)
                    self.due.put((time.monotonic() + wait, instance))
            except Exception:
                survived("the keeper")

    def ready_count(self) -> int:
        """Instances ready and not late (/health)."""
        return sum(instance.responsive() for instance in self.instances)

    def drain_begins(self) -> None:
        """A stop signal arrived: no more restarts; with no instance left to compute them, queued inputs fail."""
        self.draining = True
        if self.dispatchers and not any(i.ready.is_set() for i in self.instances):
            self.fail_queued("no instance is running and the service is stopping")

    def stop(self) -> None:
        """After the front's drain: the dispatchers finish what is queued (at most DRAIN_S, then what is left
        gets 503), then each instance is told `stop` (its report), then the processes' sessions are killed."""
        with self.lock:
            self.stopping = True
        self.draining = True
        self.batcher.close()
        self.due.put((0, None))
        deadline = time.monotonic() + DRAIN_S
        for thread in self.dispatchers:
            thread.join(max(deadline - time.monotonic(), 0))
        self.fail_queued("the service stopped before this request was computed")
        for instance in self.instances:
            instance.tell(protocol.Stop())
        deadline = time.monotonic() + STOP_GRACE_S
        for instance in self.instances:  # each reader reads its report, then sees it end
            if instance.reader is not None:
                instance.reader.join(max(deadline - time.monotonic(), 0))
        stop_all([i.handle for i in self.instances if i.handle is not None], STOP_GRACE_S, terminate=False)


def log_tail(instance: ServedInstance) -> str:
    """The end of an instance's log, to print: the log itself goes with the service's temporary folder."""
    tail = instance.handle.stderr_tail() if instance.handle is not None else ""
    return f"; the end of its log:\n{tail}" if tail else ""
