"""`corescale embed BUNDLE INPUT OUTPUT --ray ADDRESS`: the same job on a Ray cluster, as Ray Data `map_batches`
over the shards not yet complete, with one actor per measured instance on each node that holds the layout.

An actor claims one block of the layout on its node (a lock file per node and block, released when the actor's
process ends however it ends), opens the bundle as `corescale serve` does (the node's CPUs: serve/opened.placed_here,
as `deploy --target ray` places its replicas) and runs that block's instance as the same pinned child
(serve/pool.py); its own threads (reading, tokenizing, writing) move off the node's blocks where the node has CPUs
to spare. Each call takes one shard number: the actor reads that shard's rows from INPUT, computes them through its
instance and writes the shard into OUTPUT as the one-machine job writes it (shards.py), so INPUT and OUTPUT must be
on storage every node mounts at the same path (an actor that sees other files, or no job in OUTPUT, says so and
stops). Two calls run at once in each actor: one shard computes while the next is read and tokenized.

The driver makes every check the one-machine job makes before Ray is reached, writes job.json, then consumes one
summary per shard (progress, counts, the manifest). Throughput is the rows computed over the window from the first
shard's start to the last one's end (`ready_s`: up to the first shard's start, the actors' start)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from corescale.embed.job import Job, Stop, make_work
from corescale.embed.output import JOB, read_job
from corescale.errors import UserError

CALLS_PER_ACTOR = 2  # shards one actor holds at once: one computing, the next read and tokenized
ACTOR_START_S = 120  # an actor's start (the bundle's copy, the imports) beyond its instance's load timeout
LOCAL = "local"  # --ray local: a private cluster on loopback, started and stopped by the job


def blocks_folder() -> Path:
    return Path(tempfile.gettempdir()) / "corescale-embed-blocks"


def forget_blocks(job: str) -> None:
    """This job's lock files on this node, once its dataset has ended."""
    for path in blocks_folder().glob(f"{job}-*.lock"):
        path.unlink(missing_ok=True)
    try:
        blocks_folder().rmdir()
    except OSError:  # another job's files, or none made here
        pass


@contextmanager
def claimed_block(job: str, node: str, blocks: int):
    """The first block of the layout no other actor of this job on this node holds (a lock on a file in the
    node's temporary folder, released when this process ends)."""
    folder = blocks_folder()
    folder.mkdir(exist_ok=True)
    for block in range(blocks):
        path = folder / f"{job}-{node[:16]}-{block}.lock"
        handle = open(path, "w")  # noqa: SIM115 (held for the actor's life)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield block
        finally:
            handle.close()  # the file stays: unlinked, a late opener of it and a new one could both hold the block
        return
    raise RuntimeError(f"Ray placed more embed actors on node {node[:16]} than the layout's {blocks} instance(s): "
                       "start each node with `ray start --num-cpus N`, N the layout's CPUs")


class ShardActor:
    """One instance of the layout on its node, computing the shards Ray Data hands it."""

    def __init__(self, bundle: str, corpus, folder: str, identity: dict, written, dtype: str, options, job: str):
        from corescale.trials.ray import restore_thread_env

        restore_thread_env()  # Ray's OMP_NUM_THREADS=1 reaches neither this process nor its child
        self.stack = ExitStack()
        self.corpus, self.shard_rows = corpus, options.shard_rows
        try:
            self.start(bundle, Path(folder), identity, written, dtype, options, job)
        except BaseException:
            self.stack.close()
            raise

    def start(self, bundle: str, folder: Path, identity: dict, written, dtype: str, options, job: str) -> None:
        import ray

        from corescale.embed.corpus import changed
        from corescale.embed.job import QUEUE_DEADLINE_S, corpus_tokens, queue_of
        from corescale.embed.output import Output
        from corescale.machine.scratch import scratch
        from corescale.measure.trial import housekeeping_cpus
        from corescale.serve.metrics import Metrics
        from corescale.serve.opened import open_bundle, part
        from corescale.serve.pool import Pool
        from corescale.serve.supervisor import BATCH_DEADLINE_S

        self.node = ray.get_runtime_context().get_node_id()
        moved = changed(self.corpus)
        if moved is not None:
            raise RuntimeError(f"node {self.node[:16]}: INPUT differs here ({moved}): --ray needs INPUT and OUTPUT "
                               "on storage every node mounts at the same path")
        if not (folder / JOB).is_file() or read_job(folder).get("identity") != identity:
            raise RuntimeError(f"node {self.node[:16]}: OUTPUT {folder} holds no such job here: --ray needs INPUT "
                               "and OUTPUT on storage every node mounts at the same path")
        work = self.stack.enter_context(scratch("embed"))
        opened = open_bundle(bundle, work, options.trust, options.key)
        self.block = self.stack.enter_context(claimed_block(job, self.node, len(opened.specs)))
        mine = part(opened, [self.block])
        self.cpus = list(mine.specs[0].cpus)
        pool = Pool(mine, work, Metrics(), queue_of(mine), BATCH_DEADLINE_S, QUEUE_DEADLINE_S)
        self.stack.callback(pool.stop)
        pool.start(opened.cfg.timeout)
        self.stack.enter_context(housekeeping_cpus(opened.specs))  # off every block of this node
        self.work = make_work(mine, pool, corpus_tokens(mine, options), written, dtype, Output(folder, identity),
                              options)
        self.loop = asyncio.new_event_loop()  # one loop for every call (the pool settles requests on it)
        thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="corescale-embed-loop")
        thread.start()
        self.stack.callback(self.loop.call_soon_threadsafe, self.loop.stop)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import json

        from corescale.embed.corpus import shard_rows
        from corescale.machine.cpulist import format_cpulist

        found: dict[str, list] = {name: [] for name in ("shard", "rows", "computed", "rejected", "tokens", "quality",
                                                        "began", "ended", "node", "block", "cpus")}
        for index in (int(i) for i in batch["shard"]):
            began = time.time()
            shard = shard_rows(self.corpus, index, self.shard_rows)
            prepared = self.work.prepare(index, shard)
            done = asyncio.run_coroutine_threadsafe(self.work.compute(prepared), self.loop).result()
            for name, value in (("shard", index), ("rows", len(shard)), ("computed", done.computed),
                                ("rejected", done.rejected), ("tokens", done.tokens),
                                ("quality", json.dumps(done.quality)), ("began", began), ("ended", time.time()),
                                ("node", self.node), ("block", self.block),
                                ("cpus", format_cpulist(self.cpus))):
                found[name].append(value)
        return {name: np.array(values) for name, values in found.items()}

    def __del__(self) -> None:
        stack = getattr(self, "stack", None)
        if stack is not None:
            stack.close()


class RayJob(Job):
    """The driver: every check made (job.py), the shards not complete handed to Ray Data, their summaries read."""

    def __init__(self, *args, address: str, identity: dict):
        super().__init__(*args)
        self.address, self.identity = address, identity

    def run(self) -> int:
        import signal

        from corescale.embed.corpus import count_rows
        from corescale.trials.ray import connect, import_ray, is_loopback, nodes_holding

        done = self.output.done()
        address = None if self.address == LOCAL else self.address
        ray = import_ray(loopback=address is None or is_loopback(address))
        try:
            import ray.data  # noqa: F401
        except ImportError as exc:
            raise UserError(f"embed --ray needs Ray Data's dependencies ({exc.name} is missing): "
                            "pip install 'corescale[ray]'") from None
        total = self.corpus.rows if self.corpus.rows is not None else count_rows(self.corpus)
        size = self.options.shard_rows
        pending = [i for i in range(-(-total // size)) if i not in done]
        previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        started_here = False
        try:
            started_here = connect(ray, address, what="--ray")
            nodes = nodes_holding(ray, self.opened.specs, "embed --ray")
            self.output.begin()
            began = time.monotonic()
            windows = self.consume(ray, pending, len(nodes), done)
        except RuntimeError as failed:
            print(f"corescale: error: {failed}", file=sys.stderr)
            return 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if started_here and ray.is_initialized():
                ray.shutdown()
        first, last = windows
        ready_s = (first - began) if first is not None else time.monotonic() - began  # to the first shard's start
        return self.ended(done, ready_s, (last - first) if first is not None and last is not None else 0.0)

    def consume(self, ray, pending: list[int], nodes: int, done: set[int]):
        """(the first shard's start, the last one's end): monotonic seconds, from the actors' wall-clock times."""
        import json

        from ray.data import ActorPoolStrategy, DataContext

        logging.getLogger("ray.data").setLevel(logging.ERROR)  # its own progress lines: the job has its bar
        context = DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        context.wait_for_min_actors_s = int(self.opened.cfg.timeout) + ACTOR_START_S  # every actor ready first
        blocks = len(self.opened.specs)
        actors = min(blocks * nodes, max(len(pending), 1))
        cpus = sum(len(spec.cpus) for spec in self.opened.specs) / blocks
        self.executor = {"name": "ray", "address": self.address, "nodes": nodes, "actors": actors,
                         "ray": ray.__version__, "ran": {}}
        first: float | None = None
        last: float | None = None
        if not pending:
            return first, last
        offset = time.time() - time.monotonic()  # the actors report wall-clock times
        job = uuid.uuid4().hex[:12]
        shards = ray.data.from_items([{"shard": i} for i in pending], override_num_blocks=len(pending))
        computed = shards.map_batches(
            ShardActor, batch_size=1, num_cpus=cpus,
            fn_constructor_kwargs={"bundle": str(self.root), "corpus": self.corpus, "folder": str(self.output.folder),
                                   "identity": self.identity, "written": self.written, "dtype": self.dtype,
                                   "options": self.options, "job": job},
            compute=ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=CALLS_PER_ACTOR,
                                      max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
                                      enable_true_multi_threading=True))
        rows = iter(computed.iter_rows())
        with self.bar(done):
            try:
                for summary in rows:
                    self.check_stop()
                    self.computed += int(summary["computed"])
                    self.rejected += int(summary["rejected"])
                    self.quality = self.quality or json.loads(summary["quality"])
                    began, ended = float(summary["began"]) - offset, float(summary["ended"]) - offset
                    first = began if first is None else min(first, began)
                    last = ended if last is None else max(last, ended)
                    ran = self.executor["ran"].setdefault(f"{summary['node'][:16]}/{int(summary['block'])}",
                                                          {"shards": 0, "cpus": str(summary["cpus"])})
                    ran["shards"] += 1
                    self.advance(int(summary["rows"]), int(summary["tokens"]))
            except Stop:
                pass
            except Exception as failed:  # an actor that could not start or compute: why, once
                if self.caught is None:
                    raise RuntimeError(f"the Ray Data job failed: {first_line(failed)}") from None
            finally:
                close = getattr(rows, "close", None)
                if close is not None:
                    close()
                forget_blocks(job)  # this node's; another node's stay in its temporary folder
        return first, last


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def check_address(address: str) -> None:
    """--ray's address: `local`, `auto` (Ray's: RAY_ADDRESS) or host:port, reachable (before anything starts)."""
    from corescale.trials.ray import check_reachable, split_address

    if address in (LOCAL, "auto"):
        return
    if split_address(address) is None:
        raise UserError(f"embed --ray {address[:100]}: give host:port of the cluster's head (as `ray start --head` "
                        f"prints it), auto (RAY_ADDRESS) or {LOCAL} (a private cluster on this machine)")
    check_reachable(address, "--ray")
