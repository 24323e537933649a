"""One shard's work, the same on one machine (job.py) and in each Ray Data actor (ray_data.py): its rows tokenized
and sorted by length (so that batches carry little padding), sent through a pool of the bundle's instances
(serve/pool.py) in batches of the bundle's max batch, written whole with its rows back in input order, and what
could not be computed in its rejects with the reason."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corescale.embed import columns as written_columns
from corescale.embed.corpus import Row
from corescale.embed.output import Output

RETRIES = 3  # a batch whose instance died is sent again this often, then its texts are rejected
PROBE_TEXT = "corescale"  # computed once where a shard holds no computed row: the output columns' types


@dataclass
class Prepared:
    """One shard read and tokenized: the rows to compute (in length order), the rejected ones."""

    index: int
    numbers: list[int]
    ids: list[Any]
    encoded: Any  # serve/tokens.py Encoded, of the rows in `order`
    order: list[int]  # positions (in numbers) of the computed rows
    rejects: list[tuple[int, Any, str]] = field(default_factory=list)  # (row number, id, reason)


@dataclass(frozen=True)
class Done:
    """What one shard's work gave: rows computed, rejected, their tokens, the quantized type's cost (None: none)."""

    index: int
    computed: int
    rejected: int
    tokens: int
    quality: dict[str, float] | None


class ShardWork:
    def __init__(self, pool, tokens, written, dtype: str, task, head, output: Output, max_batch: int,
                 pairs: bool, truncate: bool, has_id: bool, stopping: Callable[[], bool] = lambda: False):
        self.pool, self.tokens, self.written, self.dtype = pool, tokens, written, dtype
        self.task, self.head, self.output, self.max_batch = task, head, output, max_batch
        self.pairs, self.truncate, self.has_id, self.stopping = pairs, truncate, has_id, stopping
        self.slots: asyncio.Semaphore | None = None
        self.in_flight = max(max_batch, 1)
        self.template: Any = None  # a zero-row table of the output's columns, once one is known
        self.quality_done = dtype == "float32"

    def prepare(self, index: int, shard: list[Row]) -> Prepared:
        numbers = [row.number for row in shard]
        ids = [row.id for row in shard]
        rejects = [(row.number, row.id, row.problem) for row in shard if row.problem is not None]
        readable = [i for i, row in enumerate(shard) if row.problem is None]
        encoded, problems = self.tokens.encode_each([shard[i].text for i in readable], self.truncate, self.pairs)
        rejects += [(numbers[readable[j]], ids[readable[j]], reason) for j, reason in problems.items()]
        kept = [readable[j] for j in range(len(readable)) if j not in problems]
        by_length = sorted(range(len(kept)), key=lambda k: len(encoded.rows[k]))
        encoded.rows = [encoded.rows[k] for k in by_length]
        if encoded.types is not None:
            encoded.types = [encoded.types[k] for k in by_length]
        return Prepared(index, numbers, ids, encoded, [kept[k] for k in by_length], rejects)

    def bound(self, batches: int) -> None:
        """At most `batches` batches in flight through the pool (what its queue holds)."""
        self.in_flight = max(batches, 2)

    async def compute(self, prepared: Prepared) -> Done:
        """The shard computed and written (in a thread: the Parquet write releases the GIL)."""
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.in_flight)
        encoded = prepared.encoded
        chunks = [list(range(start, min(start + self.max_batch, len(encoded.rows))))
                  for start in range(0, len(encoded.rows), self.max_batch)]
        results = await asyncio.gather(*(self.batch(encoded, chunk) for chunk in chunks))
        outputs: dict[int, np.ndarray] = {}
        rejects = list(prepared.rejects)
        for chunk, found in zip(chunks, results):
            for k, output in zip(chunk, found):
                position = prepared.order[k]
                if isinstance(output, str):
                    rejects.append((prepared.numbers[position], prepared.ids[position], output))
                else:
                    outputs[position] = output
        if not outputs and self.template is None:
            await self.probe()
        quality = await asyncio.to_thread(self.write, prepared, outputs, rejects)
        return Done(prepared.index, len(outputs), len(rejects), encoded.tokens, quality)

    async def batch(self, encoded, chunk: list[int], tries: int = RETRIES) -> list[np.ndarray | str]:
        """The outputs of the rows at `chunk`, each an array or the reason it has none."""
        from corescale.serve.pool import BatchFailed, InstanceDied, Request

        assert self.slots is not None
        loop = asyncio.get_running_loop()
        async with self.slots:
            self.pool.admit(len(chunk))
            request = Request([encoded.rows[k] for k in chunk], loop, loop.create_future(),
                              None if encoded.types is None else [encoded.types[k] for k in chunk])
            self.pool.submit(request)
            try:
                found = await request.future
            except InstanceDied as exc:
                if tries <= 1 or self.stopping():
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

    async def probe(self) -> None:
        """The output columns' types from one short text (a shard with no computed row is written with them, so
        that every shard of a job has one schema)."""
        text: Any = (PROBE_TEXT, PROBE_TEXT) if self.pairs else PROBE_TEXT
        encoded, _ = self.tokens.encode_each([text], True, self.pairs)
        found = await self.batch(encoded, [0])
        if not isinstance(found[0], str):
            self.template = self.made(np.stack([found[0]])).slice(0, 0)

    def made(self, stacked: np.ndarray):
        """The output columns of `stacked` (the model's outputs, one row each)."""
        import pyarrow as pa

        return pa.table(self.written.make(self.task, self.head, stacked, self.dtype))

    def table(self, numbers: list[int], ids: list[Any], positions: list[int], made):
        """The shard's table: `row`, the ids where named, the output columns `made` of the rows at `positions`."""
        import pyarrow as pa

        columns: dict[str, Any] = {"row": pa.array([numbers[p] for p in positions], pa.int64())}
        if self.has_id:
            columns["id"] = id_array([ids[p] for p in positions]) if positions else id_array(ids).slice(0, 0)
        return pa.table({**columns, **{name: made.column(name) for name in made.column_names}})

    def write(self, prepared: Prepared, outputs: dict[int, np.ndarray],
              rejects: list[tuple[int, Any, str]]) -> dict[str, float] | None:
        """The shard and its rejects written; the quantized type's cost where this is the first shard measured."""
        import pyarrow as pa

        quality = None
        positions = sorted(outputs)
        if positions:
            stacked = np.stack([outputs[p] for p in positions])
            made = self.made(stacked)
            if self.template is None:
                self.template = made.slice(0, 0)
            if not self.quality_done:
                quality = written_columns.quality_of(stacked, self.dtype)
                self.quality_done = quality is not None
        else:  # no row computed: the columns' types from the probe (or, where it failed too, none)
            made = self.template if self.template is not None else pa.table({})
        table = self.table(prepared.numbers, prepared.ids, positions, made)
        rejects.sort()
        rejected = pa.table({"row": pa.array([r[0] for r in rejects], pa.int64()),
                             "id": id_array([r[1] for r in rejects]),
                             "reason": pa.array([r[2] for r in rejects], pa.string())}) if rejects else None
        self.output.write_shard(prepared.index, table, rejected)
        return quality


def id_array(values: list[Any]):
    """The ids as the input typed them; as text where they mix types."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())
