"""One corpus job on this machine, once start.py has checked everything: the bundle's instances started as
`corescale serve` starts them (serve/pool.py: pinned, warm, restarted when one dies), fed shard by shard.

Each shard not yet complete is read, tokenized in a thread, its texts sorted by length (so that the batcher's
batches carry little padding) and sent in batches of the bundle's max batch, with at most the bundle's queue of
inputs waiting (shards.py); while one shard computes the next is read and tokenized. A shard is written whole
(output.py) with its rows back in input order. A text that cannot be computed goes to the shard's
rejects with its reason. SIGINT or SIGTERM: the shards being computed are abandoned (the next run computes them),
the instances stop, exit 130 or 143 with what is complete."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corescale.embed.corpus import Columns, Corpus, Row, changed, rows
from corescale.embed.estimate import Estimate, duration
from corescale.embed.output import Output
from corescale.embed.shards import Prepared, ShardWork

SHARD_ROWS = 8192  # rows per output shard: the length-sorting window, and at most what a kill makes a rerun redo
IN_FLIGHT_SHARDS = 2  # one computing, the next read and tokenized meanwhile
QUEUE_DEADLINE_S = 3600.0  # the job bounds its own queue: no input waits long, the service's 30 s would misfire


@dataclass(frozen=True)
class Options:
    columns: Columns = Columns()
    dtype: str | None = None  # None: the task's first (float32)
    truncate: bool = False  # cut texts over the model's length instead of rejecting them
    shard_rows: int = SHARD_ROWS
    progress: bool = True
    max_input_chars: int = 100_000
    catalog: str | None = None
    trust: Any = None  # serve/opened.py Trust (None: none)
    key: bytes | None = None
    ray: str | None = None  # the Ray cluster's address (ray_data.py), None: this machine alone


def bundle_digest(root: Path) -> str:
    from corescale.serve.manifest import MANIFEST

    return hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()


def queue_of(opened) -> int:
    """Inputs waiting for an instance, at most: four batches per instance (and at least 64)."""
    return max(4 * max_batch_of(opened) * len(opened.specs), 64)


def max_batch_of(opened) -> int:
    return max(int(opened.cfg.server.max_batch or 1), 1)


def make_work(opened, pool, tokens, written, dtype: str, output: Output, options: Options,
              stopping=lambda: False) -> ShardWork:
    """The shard work of `opened`'s instances in `pool` (the one-machine job's, and each Ray actor's)."""
    work = ShardWork(pool, tokens, written, dtype, opened.head.entry, opened.head, output, max_batch_of(opened),
                     options.columns.pair is not None, options.truncate, options.columns.id is not None, stopping)
    work.bound(queue_of(opened) // max_batch_of(opened))
    return work


def corpus_tokens(opened, options: Options):
    """The bundle's tokenizer with serve's per-text limits and no per-request ones (a corpus is no request)."""
    from corescale.serve.limits import Limits
    from corescale.serve.service import Options as ServeOptions
    from corescale.serve.service import front_parts

    unbounded = 1 << 62
    limits = Limits(payload_bytes=unbounded, max_inputs=unbounded, input_chars=options.max_input_chars,
                    request_chars=unbounded, request_tokens=unbounded, answer_floats=unbounded,
                    auto_truncate=options.truncate)
    tokens, _ = front_parts(opened, ServeOptions(limits=limits, max_inputs=unbounded))
    return tokens


def say(text: str) -> None:
    print(f"corescale embed: {text}", file=sys.stderr, flush=True)


class Stop(Exception):
    """A stop signal: the job ends with what is complete."""


class Job:
    def __init__(self, opened, work: Path, corpus: Corpus, output: Output, tokens, written, dtype: str,
                 options: Options, planned: Estimate, root: Path):
        self.opened, self.work, self.corpus, self.output, self.tokens = opened, work, corpus, output, tokens
        self.written, self.dtype, self.options, self.planned, self.root = written, dtype, options, planned, root
        self.task, self.head = opened.head.entry, opened.head
        self.queue = queue_of(opened)
        self.executor: dict[str, Any] = {"name": "local"}
        self.caught: int | None = None
        self.computed = self.rejected = self.tokens_done = 0
        self.quality: dict[str, float] | None = None
        self.progress: Any = None

    def run(self) -> int:
        from corescale.measure.trial import housekeeping_cpus
        from corescale.serve.metrics import Metrics
        from corescale.serve.pool import Pool
        from corescale.serve.supervisor import BATCH_DEADLINE_S

        done = self.output.done()
        pool = Pool(self.opened, self.work, Metrics(), self.queue, BATCH_DEADLINE_S, QUEUE_DEADLINE_S)
        self.shard_work = make_work(self.opened, pool, self.tokens, self.written, self.dtype, self.output,
                                    self.options, lambda: self.caught is not None)
        previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        began = time.monotonic()
        try:
            try:
                pool.start(self.opened.cfg.timeout)
            except RuntimeError as failed:
                print(f"corescale: error: {failed}", file=sys.stderr)
                return 1
            ready_s = time.monotonic() - began
            self.output.begin()
            started = time.monotonic()
            with housekeeping_cpus(self.opened.specs), self.bar(done):
                try:
                    asyncio.run(self.feed(done))
                except Stop:
                    pass
            wall_s = time.monotonic() - started
        finally:
            pool.fail_queued("the job stopped")
            pool.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.ended(done, ready_s, wall_s)

    def on_signal(self, number: int, frame) -> None:
        self.caught = number

    def bar(self, done: set[int]):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        total = self.planned.rows - min(len(done) * self.options.shard_rows, self.planned.rows)
        self.progress = Progress(TextColumn("embed"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,.0f}"
                                 " rows {task.fields[rate]}"), TimeRemainingColumn(), console=Console(stderr=True),
                                 auto_refresh=False, transient=True, disable=not self.options.progress)
        self.bar_task = self.progress.add_task("embed", total=max(total, 1), rate="")
        self.bar_started = time.monotonic()
        self.drawn = 0.0
        return self.progress

    def advance(self, rows: int, tokens: int) -> None:
        self.tokens_done += tokens
        elapsed = max(time.monotonic() - self.bar_started, 1e-9)
        done = self.computed + self.rejected
        self.progress.update(self.bar_task, advance=rows,
                             rate=f"{done / elapsed:,.0f} rows/s {self.tokens_done / elapsed:,.0f} tokens/s")
        if time.monotonic() - self.drawn >= 0.5:
            self.progress.refresh()
            self.drawn = time.monotonic()

    # --- the shards ------------------------------------------------------------------------------------------

    def shards(self, done: set[int]) -> Iterator[tuple[int, list[Row]]]:
        """Each shard not complete, with its rows (the complete ones' are passed over)."""
        size = self.options.shard_rows
        current: list[Row] = []
        index = 0
        for row in rows(self.corpus):
            shard = row.number // size
            if shard != index:
                if current:
                    yield index, current
                current, index = [], shard
            if shard not in done:
                current.append(row)
        if current:
            yield index, current

    async def feed(self, done: set[int]) -> None:
        source = self.shards(done)
        computing: deque[asyncio.Task] = deque()
        try:
            while True:
                self.check_stop()
                item = await asyncio.to_thread(next, source, None)
                if item is None:
                    break
                prepared = await asyncio.to_thread(self.shard_work.prepare, *item)
                computing.append(asyncio.create_task(self.compute(prepared)))
                while len(computing) >= IN_FLIGHT_SHARDS:
                    await self.finished(computing.popleft())
            while computing:
                await self.finished(computing.popleft())
        finally:
            for task in computing:
                task.cancel()

    async def finished(self, task: asyncio.Task) -> None:
        while not task.done():
            self.check_stop()
            await asyncio.wait([task], timeout=0.2)
        task.result()

    def check_stop(self) -> None:
        if self.caught is not None:
            raise Stop(signal.Signals(self.caught).name)

    async def compute(self, prepared: Prepared) -> None:
        done = await self.shard_work.compute(prepared)
        self.computed += done.computed
        self.rejected += done.rejected
        self.quality = self.quality or done.quality
        self.advance(len(prepared.numbers), done.tokens)

    # --- the end ---------------------------------------------------------------------------------------------

    def ended(self, done_before: set[int], ready_s: float, wall_s: float) -> int:
        from corescale import __version__

        written, rejected = self.output.counts()
        moved = changed(self.corpus)
        complete = self.caught is None and moved is None
        rate = self.computed / wall_s if wall_s > 0 else None
        run = {"rows_computed": self.computed, "rows_rejected": self.rejected, "tokens": self.tokens_done,
               "shards_before": len(done_before), "wall_s": wall_s, "ready_s": ready_s, "texts_per_s": rate,
               "interrupted": signal.Signals(self.caught).name if self.caught is not None else None}
        manifest = {
            "complete": complete, "corescale": __version__, "bundle": str(self.root),
            "bundle_manifest_sha256": bundle_digest(self.root), "model": self.opened.model,
            "backend": self.opened.cfg.backend.name, "precision": self.opened.cfg.precision,
            "task": self.task.name, "dtype": self.dtype, "columns": self.written.describe,
            "layout": self.opened.layout.to_dict(), "executor": self.executor,
            "order": "each shard holds its rows in input order; `row` is the row's number across the input files "
                     "in job.json's order (from 0), and joins a shard to the input and to the rejects",
            "rows_written": written, "rows_rejected": rejected, "shards": len(self.output.done()),
            "quality_of_dtype": self.quality, "estimate": self.planned.to_json(), "this_run": run}
        self.output.write_manifest(manifest)
        if rate:
            planned = self.planned.texts_per_s
            beside = f" (estimated {planned:,.0f}: measured ÷ estimate {rate / planned:.2f})" if planned else ""
            say(f"{self.computed:,} texts in {duration(wall_s)}: {rate:,.0f} texts/s{beside}")
        if rejected:
            say(f"{rejected:,} rows rejected, each with its reason: {self.output.folder}/rejects-*.parquet")
        if moved is not None:
            say(f"warning: {moved} during the job: run it again over a new folder")
        if self.caught is not None:
            say(f"interrupted ({signal.Signals(self.caught).name}): {len(self.output.done())} shard(s) complete in "
                f"{self.output.folder}; the same command again resumes")
            return 128 + self.caught
        say(f"{written:,} rows in {len(self.output.done())} shard(s): {self.output.folder}")
        return 0
