"""One corpus job: the bundle's instances started as `corescale serve` starts them (serve/pool.py: pinned, warm,
restarted when one dies), fed shard by shard.

Order: the corpus's files and columns, the bundle (every check serve makes), the task's output types and the
output folder are checked first (bad input: one line, exit 2, no worker started, nothing written); the estimate is
printed; the instances start; then each shard not yet complete is read, tokenized in a thread, its texts sorted by
length (so that the batcher's batches carry little padding) and sent in batches of the bundle's max batch, with
at most the bundle's queue of inputs waiting; while one shard computes the next is read and tokenized. A shard is
written whole (output.py) with its rows back in input order. A text that cannot be computed goes to the shard's
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corescale.embed import columns as written_columns
from corescale.embed.corpus import Columns, Corpus, Row, changed, discover, rows
from corescale.embed.estimate import Estimate, duration, estimate
from corescale.embed.output import Output
from corescale.errors import UserError

SHARD_ROWS = 8192  # rows per output shard: the length-sorting window, and at most what a kill makes a rerun redo
SAMPLE_ROWS = 2000  # the first rows tokenized for the estimate
RETRIES = 3  # a batch whose instance died is sent again this often, then its texts are rejected
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


@dataclass
class Prepared:
    """One shard read and tokenized: the rows to compute (in length order), the rejected ones."""

    index: int
    numbers: list[int]
    ids: list[Any]
    encoded: Any  # serve/tokens.py Encoded, of the rows in `order`
    order: list[int]  # positions (in numbers) of the computed rows
    rejects: list[tuple[int, Any, str]] = field(default_factory=list)  # (row number, id, reason)


def bundle_digest(root: Path) -> str:
    from corescale.serve.manifest import MANIFEST

    return hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()


def run(bundle_path: str, input_path: str, output_path: str, options: Options) -> int:
    from corescale.machine.scratch import scratch
    from corescale.record.files import read_result
    from corescale.serve import bundle as bundles
    from corescale.serve.opened import COPY_DIR, Trust, open_bundle
    from corescale.workload.tasks import TASKS, resolve

    corpus = discover(input_path, options.columns)
    with scratch("embed") as work:
        opened = open_bundle(bundle_path, work, options.trust or Trust(), options.key)
        task = opened.head.entry
        if task.corpus is None:
            able = ", ".join(t.name for t in TASKS.values() if t.corpus)
            raise UserError(f"embed: this bundle's task '{task.name}' ({task.noun}) has no corpus job; tasks with "
                            f"one: {able}")
        written = resolve(task.corpus)
        dtype = options.dtype or written.dtypes[0]
        if dtype not in written.dtypes:
            raise UserError(f"embed: --dtype {dtype} is not written for task '{task.name}'; allowed: "
                            f"{', '.join(written.dtypes)}")
        if task.pairs and options.columns.pair is None:
            raise UserError(f"embed: this bundle's task '{task.name}' scores (query, text) pairs: name the second "
                            "text's column with --pair-column")
        if not task.pairs and options.columns.pair is not None:
            raise UserError(f"embed: --pair-column is for a task that scores pairs; this bundle's '{task.name}' "
                            "takes one text")
        root = Path(bundle_path).expanduser().resolve()
        identity = {"bundle": bundle_digest(root), "corpus": corpus.identity(), "task": task.name, "dtype": dtype,
                    "truncate": options.truncate, "shard_rows": options.shard_rows}
        output = Output.open(output_path, identity)
        tokens = corpus_tokens(opened, options)
        record = read_result(work / COPY_DIR / bundles.RECORD)
        planned = planned_estimate(record, corpus, tokens, options)
        for line in planned.lines():
            say(f"estimate: {line}")
        job = Job(opened, work, corpus, output, tokens, written, dtype, options, planned, root)
        return job.run()


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


def planned_estimate(record, corpus: Corpus, tokens, options: Options) -> Estimate:
    """The estimate from the first SAMPLE_ROWS rows' real tokens."""
    sample: list[Any] = []
    for row in rows(corpus):
        if row.problem is None:
            sample.append(row.text)
        if len(sample) >= SAMPLE_ROWS:
            break
    encoded, _ = tokens.encode_each(sample, options.truncate, options.columns.pair is not None)
    return estimate(record, corpus, [len(r) for r in encoded.rows], options.catalog)


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
        self.max_batch = max(int(opened.cfg.server.max_batch or 1), 1)
        self.queue = max(4 * self.max_batch * len(opened.specs), 64)  # inputs waiting for an instance, at most
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
        self.pool = pool
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

    def prepare(self, index: int, shard: list[Row]) -> Prepared:
        numbers = [row.number for row in shard]
        ids = [row.id for row in shard]
        rejects = [(row.number, row.id, row.problem) for row in shard if row.problem is not None]
        readable = [i for i, row in enumerate(shard) if row.problem is None]
        encoded, problems = self.tokens.encode_each([shard[i].text for i in readable], self.options.truncate,
                                                     self.options.columns.pair is not None)
        rejects += [(numbers[readable[j]], ids[readable[j]], reason) for j, reason in problems.items()]
        kept = [readable[j] for j in range(len(readable)) if j not in problems]
        by_length = sorted(range(len(kept)), key=lambda k: len(encoded.rows[k]))
        encoded.rows = [encoded.rows[k] for k in by_length]
        if encoded.types is not None:
            encoded.types = [encoded.types[k] for k in by_length]
        return Prepared(index, numbers, ids, encoded, [kept[k] for k in by_length], rejects)

    async def feed(self, done: set[int]) -> None:
        self.slots = asyncio.Semaphore(max(self.queue // self.max_batch, 2))
        source = self.shards(done)
        computing: deque[asyncio.Task] = deque()
        try:
            while True:
                self.check_stop()
                item = await asyncio.to_thread(next, source, None)
                if item is None:
                    break
                prepared = await asyncio.to_thread(self.prepare, *item)
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
        encoded = prepared.encoded
        chunks = [range(start, min(start + self.max_batch, len(encoded.rows)))
                  for start in range(0, len(encoded.rows), self.max_batch)]
        results = await asyncio.gather(*(self.batch(encoded, list(chunk)) for chunk in chunks))
        outputs: dict[int, np.ndarray] = {}
        rejects = list(prepared.rejects)
        for chunk, found in zip(chunks, results):
            for k, output in zip(chunk, found):
                position = prepared.order[k]
                if isinstance(output, str):
                    rejects.append((prepared.numbers[position], prepared.ids[position], output))
                else:
                    outputs[position] = output
        await asyncio.to_thread(self.write, prepared, outputs, rejects)
        self.computed += len(outputs)
        self.rejected += len(rejects)
        self.advance(len(prepared.numbers), encoded.tokens)

    async def batch(self, encoded, chunk: list[int], tries: int = RETRIES) -> list[np.ndarray | str]:
        """The outputs of the rows at `chunk`, each an array or the reason it has none."""
        from corescale.serve.pool import BatchFailed, InstanceDied, Request

        loop = asyncio.get_running_loop()
        async with self.slots:
            self.pool.admit(len(chunk))
            request = Request([encoded.rows[k] for k in chunk], loop, loop.create_future(),
                              None if encoded.types is None else [encoded.types[k] for k in chunk])
            self.pool.submit(request)
            try:
                found = await request.future
            except InstanceDied as exc:
                if tries <= 1 or self.caught is not None:
                    return [f"the instance computing it died {RETRIES} times: {exc}"] * len(chunk)
                failed: Exception | None = exc
            except BatchFailed as exc:
                failed = exc
            else:
                return [row if np.isfinite(row).all() else "the model gave a non-finite output (NaN or inf)"
                        for row in found]
        if isinstance(failed, BatchFailed):
            if len(chunk) == 1:
                return [f"the model could not compute it: {failed}"]
            return [out for k in chunk for out in await self.batch(encoded, [k], 1)]  # which row it was
        return await self.batch(encoded, chunk, tries - 1)

    def write(self, prepared: Prepared, outputs: dict[int, np.ndarray], rejects: list[tuple[int, Any, str]]) -> None:
        import pyarrow as pa

        positions = sorted(outputs)
        columns: dict[str, Any] = {"row": pa.array([prepared.numbers[p] for p in positions], pa.int64())}
        if self.options.columns.id is not None:
            columns["id"] = id_array([prepared.ids[p] for p in positions])
        stacked = np.stack([outputs[p] for p in positions]) if positions else np.zeros((0, 0), np.float32)
        if positions:
            columns.update(self.written.make(self.task, self.head, stacked, self.dtype))
            if self.quality is None and self.dtype != "float32":
                self.quality = written_columns.quality_of(stacked, self.dtype)
        table = pa.table(columns) if positions else None
        rejects.sort()
        rejected = pa.table({"row": pa.array([r[0] for r in rejects], pa.int64()),
                             "id": id_array([r[1] for r in rejects]),
                             "reason": pa.array([r[2] for r in rejects], pa.string())}) if rejects else None
        if table is None:
            table = pa.table({"row": pa.array([], pa.int64())})
        self.output.write_shard(prepared.index, table, rejected)

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
            "layout": self.opened.layout.to_dict(),
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


def id_array(values: list[Any]):
    """The ids as the input typed them; as text where they mix types."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())
