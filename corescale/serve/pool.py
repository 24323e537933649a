"""The bundle's pinned instances behind one queue: started as measurement starts them, fed by the server
scenario's dynamic batching, restarted when one dies.

Each instance is a worker as measurement starts it (measure/instance.py's InstanceHandle) with the launch its
measurement recorded (CPUs, numactl, thread/OpenMP/allocator environment), in serving mode: it loads, warms up
(every batch size up to the bundle's max batch), then answers `Infer` commands with `answered` lines holding the
output rows (measure/protocol.py). A reader thread per instance follows its messages; a dispatcher thread per
instance (measure/instance.py's dispatch loop) takes the next batch from the one Batcher whenever its instance is
ready and idle. An instance that
dies fails only the batch it was computing (requests answered 503); a batch it had not been sent goes back to
the head of the queue; the instance is started again (backing off while it keeps failing).
"""

from __future__ import annotations

import asyncio
import base64
import queue
import threading
import time
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
STOP_GRACE_S = 5.0


class Overloaded(Exception):
    """The queue is full: the request is refused (429)."""


class InstanceDied(Exception):
    """The instance computing the request died (503)."""


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
        self.loop.call_soon_threadsafe(set_it)


@dataclass
class Row:
    request: Request
    index: int


def infer(number: int, rows: list[Row]) -> protocol.Infer:
    """The rows' token ids (and token type ids, a pair's) as the worker's `Infer` command."""
    return protocol.Infer(number, [row.request.rows[row.index].tolist() for row in rows],
                          [None if row.request.types is None else row.request.types[row.index].tolist()
                           for row in rows])


class ServedInstance:
    """One pinned worker, started again when it dies (each start a generation of its own), the thread that follows
    its messages and the one that feeds it batches."""

    def __init__(self, pool: Pool, number: int, job: Path, launch: instance_env.Launch, log: Path):
        self.pool, self.id, self.job, self.launch, self.log = pool, number, job, launch, log
        self.ready = threading.Event()
        self.replies: queue.Queue = queue.Queue()
        self.generation = 0
        self.handle: InstanceHandle | None = None
        self.restarts = 0
        self.failure: str | None = None  # the last failure's message
        self.failure_kind = "error"  # user: bad input (UserError in the worker)
        self.busy_ns = 0
        self.since_ns = time.perf_counter_ns()
        self.result: dict | None = None  # its report at stop
        self.artifact: str | None = None  # the file its backend runs (the Loaded message), where it has one

    def start(self) -> None:
        self.generation += 1
        self.handle = InstanceHandle.spawn(self.id, self.launch, self.job, self.log, append=True)
        threading.Thread(target=self.follow, args=(self.handle, self.generation), daemon=True,
                         name=f"corescale-serve-reader-{self.id}").start()

    def tell(self, command: protocol.Command) -> bool:
        return self.handle is not None and self.handle.tell(command)

    def follow(self, handle: InstanceHandle, generation: int) -> None:
        """Its messages until it ends: the start handshake, answers, its failure, its result."""
        handshake = Handshake([handle])  # each instance starts on its own, at once
        for message in handle.messages():
            if isinstance(message, protocol.ProtocolError):
                self.failure = f"sent a malformed message: {message}"
                continue
            handle.heard(message)
            if handshake.heard(message) is not None:
                self.ready.set()
            if isinstance(message, protocol.Answered):
                self.replies.put((generation, message))
            elif isinstance(message, protocol.WorkerFailure):
                self.failure, self.failure_kind = message.message, message.kind
            self.artifact, self.result = handle.artifact or self.artifact, handle.result
        code = handle.process.wait()
        self.ready.clear()
        self.replies.put((generation, None))
        self.pool.ended(self, code)

    def how_it_ended(self, code: int) -> str:
        return f"instance {self.id} {how_it_ended(code)[0]}" + (f": {self.failure}" if self.failure else "")

    def next_reply(self, generation: int) -> protocol.Answered | None:
        while True:
            seen, message = self.replies.get()
            if seen == generation:
                return message

    def busy_fraction(self) -> float:
        return self.busy_ns / max(time.perf_counter_ns() - self.since_ns, 1)


@dataclass
class RequestFeeder:
    """One instance's side of the service's queue: a batch is sent only while it is ready; one never sent goes
    back to the head of the queue; one it was computing when it died fails (503)."""

    instance: ServedInstance
    batcher: Batcher
    number: int = 0
    generation: int = 0  # of the instance the batch was sent to

    def idle(self) -> bool:
        pool = self.instance.pool
        while not self.instance.ready.wait(0.2):
            if pool.stopping and self.batcher.closed and not self.batcher.waiting:
                return False
        return True

    def send(self, batch: list[Waiting]) -> bool:
        self.generation = self.instance.generation
        self.number += 1
        return self.instance.ready.is_set() and self.instance.tell(infer(self.number, [w.sample for w in batch]))

    def reply(self) -> protocol.Answered | None:
        return self.instance.next_reply(self.generation)

    def unsent(self, batch: list[Waiting]) -> None:
        self.batcher.requeue(batch)  # another instance (or this one, restarted) takes it

    def complete(self, batch: list[Waiting], taken_ns: int, reply: protocol.Served | None) -> None:
        pool, instance = self.instance.pool, self.instance
        if not isinstance(reply, protocol.Answered):
            error = InstanceDied(f"instance {instance.id} died while computing this request; it is being restarted")
            for row in batch:
                pool.finish(row.sample, None, error)
            return
        instance.busy_ns += reply.end_ns - reply.start_ns
        outputs = np.frombuffer(base64.b64decode(reply.rows), dtype="<f4").reshape(reply.shape)
        pool.metrics.batch(len(batch), (reply.end_ns - reply.start_ns) / 1e9, reply.length, reply.real_tokens)
        for position, row in enumerate(batch):
            request = row.sample.request
            request.queue_ns = max(request.queue_ns, taken_ns - row.arrived_ns)
            request.inference_ns = max(request.inference_ns, reply.end_ns - reply.start_ns)
            pool.finish(row.sample, outputs[position], None)


class Pool:
    def __init__(self, opened: Bundle, work: Path, metrics, max_queue: int):
        self.bundle, self.work, self.metrics, self.max_queue = opened, work, metrics, max_queue
        self.batcher = Batcher(opened.cfg, np.zeros(0, dtype=np.int64))
        self.lock = threading.Lock()
        self.pending = 0  # inputs accepted and not yet answered
        self.stopping = False
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
            path = job.write(self.work / f"instance-{spec.id}.json")
            self.instances.append(ServedInstance(self, spec.id, path, launch, self.work / f"instance-{spec.id}.log"))
        for instance in self.instances:
            instance.start()
        deadline = time.monotonic() + timeout_s
        for instance in self.instances:
            while not instance.ready.wait(0.1):
                if instance.handle is not None and instance.handle.process.poll() is not None:
                    raise self.start_failure(instance)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"instance {instance.id} was not ready after {timeout_s:g} s "
                                       f"(its log: {instance.log})")
        self.keeper.start()
        for instance in self.instances:
            thread = threading.Thread(target=dispatch, args=(self.batcher, RequestFeeder(instance, self.batcher)),
                                      daemon=True,
                                      name=f"corescale-serve-dispatch-{instance.id}")
            thread.start()
            self.dispatchers.append(thread)

    def start_failure(self, instance: ServedInstance) -> Exception:
        time.sleep(0.2)  # its reader may still be reading its last message
        assert instance.handle is not None
        message = instance.how_it_ended(instance.handle.process.wait())
        return UserError(message) if instance.failure_kind == "user" else RuntimeError(message)

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

    def ended(self, instance: ServedInstance, code: int) -> None:
        """An instance's process ended: unless the service is stopping, it is started again."""
        if self.stopping or not self.dispatchers:
            return
        self.metrics.restarted(instance.id)
        print(f"corescale serve: {instance.how_it_ended(code)}; starting it again", flush=True)
        instance.restarts += 1
        wait = min(RESTART_BACKOFF_S[0] * 2 ** min(instance.restarts - 1, 10), RESTART_BACKOFF_S[1])
        instance.failure = None
        self.due.put((time.monotonic() + (wait if instance.restarts > 1 else 0), instance))

    def keep(self) -> None:
        """Starts the instances that died again, from this one long-lived thread: a pinned child dies with the
        thread that started it (PR_SET_PDEATHSIG follows the thread), so never from a short-lived one."""
        while True:
            when, instance = self.due.get()
            if instance is None:
                return
            time.sleep(max(when - time.monotonic(), 0))
            if not self.stopping:
                instance.start()

    def ready_count(self) -> int:
        return sum(instance.ready.is_set() for instance in self.instances)

    def stop(self) -> None:
        """Drains the queue (every accepted input answered), then stops each instance with `stop` (its report),
        then the processes."""
        with self.lock:
            self.stopping = True
        self.batcher.close()
        self.due.put((0, None))
        for thread in self.dispatchers:
            thread.join()
        for instance in self.instances:
            instance.tell(protocol.Stop())
        stop_all([i.handle for i in self.instances if i.handle is not None], STOP_GRACE_S, terminate=False)
