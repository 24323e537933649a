"""The bundle's pinned instances behind one queue: started as measurement starts them, fed by the server
scenario's dynamic batching, watched, and restarted when one dies or hangs.

Each instance is a worker as measurement starts it (measure/instance.py's InstanceHandle) with the launch its
measurement recorded (CPUs, numactl, thread/OpenMP/allocator environment), in serving mode: it loads, warms up
(every batch size up to the bundle's max batch), then answers `Infer` commands with `answered` lines holding the
output rows (measure/protocol.py), or `unanswered` for a batch it could not compute (those requests get 500; the
instance serves on). A reader thread per instance follows its messages; a dispatcher thread per instance
(measure/instance.py's dispatch loop) takes the next batch from the one Batcher whenever its instance is ready and
idle; one keeper thread starts instances again.

What happens to each instance (its deadline, restarts, whether /health counts it) is serve/supervisor.py's
ServedInstance. An instance that dies fails only the batch it was computing (503); a batch it had not been sent
goes back to the head of the queue; a dispatcher's unexpected error fails its batch (500) and it carries on.
"""

from __future__ import annotations

import asyncio
import base64
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corescale.errors import UserError
from corescale.measure import protocol
from corescale.measure.batching import Batcher, Waiting
from corescale.measure.instance import dispatch, stop_all
from corescale.serve.opened import Bundle
from corescale.serve.supervisor import BATCH_DEADLINE_S, LATE, ServedInstance, log_tail, say, survived

STOP_GRACE_S = 5.0  # the longest stopped instances have to send their reports
QUEUE_DEADLINE_S = 30.0  # the longest an input waits in the queue for an instance, then 503 (--queue-timeout)
SWEEP_S = 0.25  # how often the queue is swept for inputs past their deadline
DRAIN_S = 10.0  # after the front's drain, the longest the dispatchers may take before queued inputs get 503


class Overloaded(Exception):
    """The queue is full: the request is refused (429)."""


class InstanceDied(Exception):
    """The instance computing the request died, or was killed for missing its deadline (503)."""


class NotReady(InstanceDied):
    """Every instance is down and backing off after a failed start: refused at once (503, Retry-After: the seconds
    until the first is due to start again)."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


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


def answered_rows(reply: protocol.Answered, rows: int) -> np.ndarray:
    """The answer's output rows, one per input of the batch; ValueError when the answer is not that (a model file
    whose output fixes or reduces the batch axis, bytes that do not fill the shape it states)."""
    outputs = np.frombuffer(base64.b64decode(reply.rows), dtype="<f4").reshape(reply.shape)
    if outputs.ndim == 0 or outputs.shape[0] != rows:
        raise ValueError(f"the model's output has shape {list(outputs.shape)} for a batch of {rows} input(s); its "
                         f"first axis must be the batch ({rows})")
    return outputs


@dataclass
class RequestFeeder:
    """One instance's side of the service's queue: a batch is sent only while it is ready; one never sent goes
    back to the head of the queue; one it was computing when it died or went past its deadline fails (503);
    one it could not compute fails (500)."""

    instance: ServedInstance
    batcher: Batcher
    pool: Pool
    number: int = 0
    generation: int = 0  # of the instance the batch was sent to
    batch: list[Waiting] | None = None  # sent and not yet completed: failed (500) when this thread errs
    refused: protocol.Unanswered | None = None  # the instance's answer when it could not compute the batch

    def idle(self) -> bool:
        pool = self.pool
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
        pool, instance = self.pool, self.instance
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
        try:
            outputs = answered_rows(reply, len(batch))
        except ValueError as wrong:  # every row of the batch fails (500); none is left waiting
            self.fail(BatchFailed(f"instance {instance.id} answered this request's batch wrongly: {wrong}"))
            return
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
            self.pool.finish(row.sample, None, error)

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
                 batch_deadline_s: float = BATCH_DEADLINE_S, queue_deadline_s: float = QUEUE_DEADLINE_S):
        self.bundle, self.work, self.metrics, self.max_queue = opened, work, metrics, max_queue
        self.batch_deadline_s, self.queue_deadline_s = batch_deadline_s, queue_deadline_s
        self.sweeper = threading.Thread(target=self.sweep, daemon=True, name="corescale-serve-expiry")
        self.batcher = Batcher(opened.cfg, np.zeros(0, dtype=np.int64))
        self.lock = threading.Lock()
        self.pending = 0  # inputs accepted and not yet answered
        self.draining = False  # a stop signal arrived: no restarts
        self.stopping = False  # no new requests
        self.instances: list[ServedInstance] = []
        self.dispatchers: list[threading.Thread] = []
        self.due: queue.Queue = queue.Queue()  # (when, instance) to start again; (0, None) ends the keeper
        self.keeper = threading.Thread(target=self.keep, daemon=True, name="corescale-serve-keeper")
        self.launched = 0.0  # when launch() started the instances (time.monotonic)

    def start(self, timeout_s: float) -> None:
        """Every instance started and ready (warm), or UserError/RuntimeError with the first failure."""
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Every instance's process started (they load and warm up meanwhile: wait_ready follows)."""
        from corescale.workload.models import configured_model

        cfg = self.bundle.cfg
        model = configured_model(cfg, judged=False)  # served: the quality reference stays behind
        jobs = protocol.Job.each(cfg, model, self.bundle.specs)
        for job, spec, launch in zip(jobs, self.bundle.specs, self.bundle.launches):
            self.instances.append(ServedInstance(self, spec.id, job, self.work / f"instance-{spec.id}.json", launch,
                                                 self.work / f"instance-{spec.id}.log"))
        for instance in self.instances:
            instance.start()
        self.launched = time.monotonic()

    def wait_ready(self, timeout_s: float) -> None:
        """Every instance ready (warm), `timeout_s` after launch() at most; or the first failure."""
        deadline = self.launched + timeout_s
        for instance in self.instances:
            while not instance.ready.wait(0.1):
                if instance.handle is not None and instance.handle.process.poll() is not None:
                    raise self.start_failure(instance)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"instance {instance.id} was not ready after {timeout_s:g} s"
                                       + log_tail(instance))
        self.keeper.start()
        self.sweeper.start()
        for instance in self.instances:
            thread = threading.Thread(target=RequestFeeder(instance, self.batcher, self).run, daemon=True,
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
            if self.dispatchers and all(instance.backing_off() for instance in self.instances):
                due = max(min(i.due_at for i in self.instances) - time.monotonic(), 1.0)
                raise NotReady(f"no instance is running: each one's last start failed and the next is due in "
                               f"{due:.0f} s or more", due)
            self.pending += rows

    def sweep(self) -> None:
        """Every input that waited in the queue past the queue deadline answered 503: whatever the instances do
        (all down, backing off, hung), an accepted request ends within the queue deadline plus its batch's."""
        while not (self.stopping and self.batcher.closed):
            time.sleep(SWEEP_S)
            try:
                limit_ns = time.perf_counter_ns() - int(self.queue_deadline_s * 1e9)
                for item in self.batcher.expired(limit_ns):
                    self.finish(item.sample, None, InstanceDied(
                        f"no instance took this input within the queue deadline ({self.queue_deadline_s:g} s)"))
            except Exception:
                survived("the queue's sweeper")

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
        instance.due_at = time.monotonic() + wait
        self.due.put((instance.due_at, instance))

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
                    instance.due_at = time.monotonic() + wait
                    self.due.put((instance.due_at, instance))
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
