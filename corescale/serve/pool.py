"""The bundle's pinned instances behind one queue: started as measurement starts them, fed by the server
scenario's dynamic batching, restarted when one dies.

Each instance is `python -m corescale.measure.worker JOB` started with `instance_env.spawn` and the launch its
measurement recorded (CPUs, numactl, thread/OpenMP/allocator environment), in serving mode: it loads, warms up
(every batch size up to the bundle's max batch), then answers `infer` lines with `answered` lines holding the
output rows (measure/protocol.py). A reader thread per instance follows its messages; a dispatcher thread per
instance takes the next batch from the one Batcher whenever its instance is ready and idle. An instance that
dies fails only the batch it was computing (requests answered 503); a batch it had not been sent goes back to
the head of the queue; the instance is started again (backing off while it keeps failing).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import queue
import signal
import subprocess
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


def row_text(row: Row) -> str:
    """One row of an `infer` line: its token ids, then `/` and its token type ids when it has them."""
    request = row.request
    ids = ",".join(map(str, request.rows[row.index].tolist()))
    if request.types is None:
        return ids
    return f"{ids}/{','.join(map(str, request.types[row.index].tolist()))}"


class Instance:
    """One pinned worker process and the threads that feed and follow it."""

    def __init__(self, pool: Pool, number: int, job: Path, launch: instance_env.Launch, log: Path):
        self.pool, self.id, self.job, self.launch, self.log = pool, number, job, launch, log
        self.ready = threading.Event()
        self.replies: queue.Queue = queue.Queue()
        self.generation = 0
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.failure: str | None = None  # the last failure's message
        self.failure_kind = "error"  # user: bad input (UserError in the worker)
        self.busy_ns = 0
        self.since_ns = time.perf_counter_ns()
        self.result: dict | None = None  # its report at stop
        self.artifact: str | None = None  # the file its backend runs (the Loaded message), where it has one

    def start(self) -> None:
        self.generation += 1
        with open(self.log, "ab") as stderr:
            self.process = instance_env.spawn(self.launch, "corescale.measure.worker", str(self.job),
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        threading.Thread(target=self.follow, args=(self.process, self.generation), daemon=True,
                         name=f"corescale-serve-reader-{self.id}").start()

    def tell(self, line: str) -> bool:
        process = self.process
        try:
            assert process is not None and process.stdin is not None
            process.stdin.write(f"{line}\n".encode())
            process.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def follow(self, process: subprocess.Popen, generation: int) -> None:
        """Its messages until it ends: the start handshake, answers, its failure, its result."""
        assert process.stdout is not None
        for line in process.stdout:
            try:
                message = protocol.decode(line)
            except protocol.ProtocolError as bad:
                self.failure = f"sent a malformed message: {bad}"
                continue
            if isinstance(message, protocol.Loaded):
                self.artifact = message.artifact
                self.tell("warmup")
            elif isinstance(message, protocol.Ready):
                self.tell(f"start {time.perf_counter_ns()}")
                self.ready.set()
            elif isinstance(message, protocol.Answered):
                self.replies.put((generation, message))
            elif isinstance(message, protocol.WorkerFailure):
                self.failure, self.failure_kind = message.message, message.kind
            elif isinstance(message, protocol.Result):
                self.result = message.report
        code = process.wait()
        self.ready.clear()
        self.replies.put((generation, None))
        self.pool.ended(self, code)

    def how_it_ended(self, code: int) -> str:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"instance {self.id} {how}" + (f": {self.failure}" if self.failure else "")

    def dispatch(self, batcher: Batcher) -> None:
        """Takes a batch whenever this instance is ready and idle, until the queue is closed and empty."""
        number = 0
        while True:
            while not self.ready.wait(0.2):
                if self.pool.stopping and batcher.closed and not batcher.waiting:
                    return
            batch = batcher.take()
            if batch is None:
                return
            generation = self.generation
            number += 1
            ids = ";".join(row_text(row.sample) for row in batch)
            if not self.ready.is_set() or not self.tell(f"infer {number} {ids}"):
                batcher.requeue(batch)  # never sent: another instance (or this one, restarted) takes it
                continue
            taken_ns = time.perf_counter_ns()
            reply = self.next_reply(generation)
            if reply is None:
                error = InstanceDied(f"instance {self.id} died while computing this request; it is being restarted")
                for row in batch:
                    self.pool.finish(row.sample, None, error)
                continue
            self.busy_ns += reply.end_ns - reply.start_ns
            outputs = np.frombuffer(base64.b64decode(reply.rows), dtype="<f4").reshape(reply.shape)
            self.pool.metrics.batch(len(batch), (reply.end_ns - reply.start_ns) / 1e9)
            for position, row in enumerate(batch):
                request = row.sample.request
                request.queue_ns = max(request.queue_ns, taken_ns - row.arrived_ns)
                request.inference_ns = max(request.inference_ns, reply.end_ns - reply.start_ns)
                self.pool.finish(row.sample, outputs[position], None)

    def next_reply(self, generation: int) -> protocol.Answered | None:
        while True:
            seen, message = self.replies.get()
            if seen == generation:
                return message

    def busy_fraction(self) -> float:
        return self.busy_ns / max(time.perf_counter_ns() - self.since_ns, 1)


class Pool:
    def __init__(self, opened: Bundle, work: Path, metrics, max_queue: int):
        self.bundle, self.work, self.metrics, self.max_queue = opened, work, metrics, max_queue
        self.batcher = Batcher(opened.cfg, np.zeros(0, dtype=np.int64))
        self.lock = threading.Lock()
        self.pending = 0  # inputs accepted and not yet answered
        self.stopping = False
        self.instances: list[Instance] = []
        self.dispatchers: list[threading.Thread] = []
        self.due: queue.Queue = queue.Queue()  # (when, instance) to start again; (0, None) ends the keeper
        self.keeper = threading.Thread(target=self.keep, daemon=True, name="corescale-serve-keeper")

    def start(self, timeout_s: float) -> None:
        """Every instance started and ready (warm), or UserError/RuntimeError with the first failure."""
        from corescale.workload.models import resolve_model

        cfg = self.bundle.cfg
        model = resolve_model(cfg.model, cfg.trust_remote_code, cfg.task, cfg.cache_dir)
        cpus = sorted(c for spec in self.bundle.specs for c in spec.cpus)
        for spec, launch in zip(self.bundle.specs, self.bundle.launches):
            job = self.work / f"instance-{spec.id}.json"
            job.write_text(json.dumps({"config": cfg.to_dict(), "model": dataclasses.asdict(model),
                                       "trial_cpus": cpus, "instance": spec.to_json()}))
            self.instances.append(Instance(self, spec.id, job, launch, self.work / f"instance-{spec.id}.log"))
        for instance in self.instances:
            instance.start()
        deadline = time.monotonic() + timeout_s
        for instance in self.instances:
            while not instance.ready.wait(0.1):
                if instance.process is not None and instance.process.poll() is not None:
                    raise self.start_failure(instance)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"instance {instance.id} was not ready after {timeout_s:g} s "
                                       f"(its log: {instance.log})")
        self.keeper.start()
        for instance in self.instances:
            thread = threading.Thread(target=instance.dispatch, args=(self.batcher,), daemon=True,
                                      name=f"corescale-serve-dispatch-{instance.id}")
            thread.start()
            self.dispatchers.append(thread)

    def start_failure(self, instance: Instance) -> Exception:
        time.sleep(0.2)  # its reader may still be reading its last message
        assert instance.process is not None
        message = instance.how_it_ended(instance.process.returncode)
        return UserError(message) if instance.failure_kind == "user" else RuntimeError(message)

    def submit(self, request: Request) -> None:
        """Queues the request's rows, or raises Overloaded when they would pass the bound."""
        with self.lock:
            if self.stopping:
                raise Overloaded("the service is stopping")
            if self.pending + len(request.rows) > self.max_queue:
                raise Overloaded(f"the queue holds {self.pending} inputs (at most {self.max_queue})")
            self.pending += len(request.rows)
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

    def ended(self, instance: Instance, code: int) -> None:
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
            instance.tell("stop")
        deadline = time.monotonic() + STOP_GRACE_S
        for instance in self.instances:
            process = instance.process
            if process is None:
                continue
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
