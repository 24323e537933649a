"""The corpus: a Parquet, JSONL or CSV file, or a folder of them (every such file under it, in path order), read as
a stream of rows (bounded memory whatever its size), each row numbered across the files in that order.

Checked before any worker starts: the path exists, its files are of a known kind and readable, and each has the
text column (and the pair's, the id's when named). A row that cannot be read as text (a line that is not JSON,
invalid UTF-8, a null or a number where the text should be) is not an error of the job: it goes to the rejects with
its reason, as a text the model cannot take does (job.py)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from corescale.errors import UserError

KINDS = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}  # file suffix -> reader
READ_ROWS = 4096  # rows per read from a file
CSV_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class Source:
    """One input file, as it was when the job began (a resumed job must read the same bytes)."""

    path: Path
    kind: str
    size: int
    mtime_ns: int
    rows: int | None = None  # from its metadata (Parquet), else None

    def identity(self) -> dict[str, Any]:
        return {"path": str(self.path), "kind": self.kind, "size": self.size, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class Columns:
    text: str = "text"
    pair: str | None = None  # the second text of a (query, document) pair (a reranker's)
    id: str | None = None  # kept beside each output row

    @property
    def named(self) -> list[str]:
        return [c for c in (self.id, self.text, self.pair) if c is not None]


@dataclass
class Row:
    """One input row: its text (a pair's two), its id, or why it cannot be read."""

    number: int
    text: str | tuple[str, str] | None
    id: Any = None
    problem: str | None = None


@dataclass(frozen=True)
class Corpus:
    files: tuple[Source, ...]
    columns: Columns
    rows: int | None  # known from the files' metadata (Parquet), else None

    def identity(self) -> dict[str, Any]:
        return {"files": [f.identity() for f in self.files], "columns": vars(self.columns)}

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def discover(path: str | Path, columns: Columns) -> Corpus:
    """The corpus at `path`, every file checked (readable, the columns there); UserError naming what is wrong."""
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"embed: INPUT {str(root)[:300]} does not exist")
    allowed = ", ".join(sorted(KINDS))
    if root.is_dir():
        found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in KINDS
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
        if not found:
            raise UserError(f"embed: INPUT {str(root)[:300]} holds no {allowed} file")
    else:
        if root.suffix.lower() not in KINDS:
            raise UserError(f"embed: INPUT {root.name[:200]} is not a corpus file; allowed: {allowed}")
        found = [root]
    sources = []
    for file in found:
        stat = file.stat()
        source = Source(file.resolve(), KINDS[file.suffix.lower()], stat.st_size, stat.st_mtime_ns)
        sources.append(dataclasses.replace(source, rows=header_check(source, columns)))
    counts = [source.rows for source in sources]
    rows = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    return Corpus(tuple(sources), columns, rows)


def header_check(source: Source, columns: Columns) -> int | None:
    """The file's columns hold the named ones; its row count where its metadata says it."""
    try:
        names, rows = HEADERS[source.kind](source.path)
    except (OSError, ValueError) as exc:
        raise UserError(f"embed: cannot read {source.path.name[:200]} as {source.kind}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
    missing = [c for c in columns.named if c not in names]
    if missing:
        shown = ", ".join(n[:60] for n in names[:20]) or "none"
        raise UserError(f"embed: {source.path.name[:200]} has no column '{missing[0][:80]}' (its columns: {shown}); "
                        "name the text with --text-column, the id with --id-column")
    return rows


def parquet_header(path: Path) -> tuple[list[str], int | None]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return list(meta.schema.names), meta.num_rows


def jsonl_header(path: Path) -> tuple[list[str], int | None]:
    """The keys of the first object (JSON Lines: one object per line)."""
    with open(path, "rb") as file:
        for line in file:
            if line.strip():
                first = orjson.loads(line)
                if not isinstance(first, dict):
                    raise ValueError("its first line is not a JSON object")
                return list(first), None
    return [], None


def csv_header(path: Path) -> tuple[list[str], int | None]:
    import pyarrow.csv as pacsv

    reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES))
    return list(reader.schema.names), None


HEADERS = {"parquet": parquet_header, "jsonl": jsonl_header, "csv": csv_header}


def rows(corpus: Corpus, start: int = 0) -> Iterator[Row]:
    """Every row from number `start` on, in order; rows before it are passed over (a Parquet file's by its
    metadata, a JSON Lines file's lines undecoded, a CSV file's read)."""
    number = 0
    for source in corpus.files:
        if source.rows is not None and number + source.rows <= start:
            number += source.rows
            continue
        for batch in READERS[source.kind](source, corpus.columns, max(start - number, 0)):
            if isinstance(batch, int):  # rows the reader passed over
                number += batch
                continue
            if number + len(batch) <= start:
                number += len(batch)
                continue
            for row in batch:
                if number >= start:
                    row.number = number
                    yield row
                number += 1


def shard_rows(corpus: Corpus, index: int, size: int) -> list[Row]:
    """The rows of shard `index` (rows index x size up to the next shard's first)."""
    return list(itertools.islice(rows(corpus, index * size), size))


def count_rows(corpus: Corpus) -> int:
    """The corpus's rows, exactly (Parquet: its metadata; JSON Lines: its lines that are not blank; CSV: parsed)."""
    return sum(source.rows if source.rows is not None else
               sum(b if isinstance(b, int) else len(b) for b in READERS[source.kind](source, corpus.columns, 1 << 62))
               for source in corpus.files)


def as_text(value: Any, column: str) -> tuple[str | None, str | None]:
    """(the text, or None and why not)."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            return None, f"column {column}: invalid UTF-8 at byte {exc.start}"
    if value is None:
        return None, f"column {column}: no text (null or missing)"
    return None, f"column {column}: a {type(value).__name__}, not a string"


def made(values: dict[str, Any], columns: Columns) -> Row:
    text, problem = as_text(values.get(columns.text), columns.text)
    if columns.pair is not None and problem is None:
        second, problem = as_text(values.get(columns.pair), columns.pair)
        pair = (text, second) if problem is None else None
        return Row(0, pair, values.get(columns.id) if columns.id else None, problem)  # type: ignore[arg-type]
    return Row(0, text, values.get(columns.id) if columns.id else None, problem)


def arrow_rows(batch, columns: Columns) -> list[Row]:
    lists = {name: batch.column(name).to_pylist() for name in columns.named}
    return [made({name: lists[name][i] for name in columns.named}, columns) for i in range(batch.num_rows)]


def parquet_rows(source: Source, columns: Columns, skip: int = 0) -> Iterator[list[Row] | int]:
    """Its rows in batches; the row groups wholly within the first `skip` rows passed over unread (their count)."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(source.path)
    groups: list[int] = []
    passed = 0
    for group in range(file.metadata.num_row_groups):
        size = file.metadata.row_group(group).num_rows
        if not groups and passed + size <= skip:
            passed += size
        else:
            groups.append(group)
    if passed:
        yield passed
    if groups:
        for batch in file.iter_batches(batch_size=READ_ROWS, row_groups=groups, columns=columns.named):
            yield arrow_rows(batch, columns)


def csv_rows(source: Source, columns: Columns, skip: int = 0) -> Iterator[list[Row] | int]:
    """Text columns read as bytes, decoded here: a row of invalid UTF-8 is rejected, not the file. The first
    `skip` rows are read (a CSV text may hold a line break) and passed over undecoded."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    texts = [c for c in (columns.text, columns.pair) if c is not None]
    reader = pacsv.open_csv(source.path, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                            convert_options=pacsv.ConvertOptions(include_columns=columns.named,
                                                                 column_types={c: pa.binary() for c in texts}))
    for batch in reader:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            yield batch.num_rows
            continue
        yield arrow_rows(batch, columns)


def jsonl_rows(source: Source, columns: Columns, skip: int = 0) -> Iterator[list[Row] | int]:
    """One object per line (blank lines are no rows); a line that is not a JSON object is a rejected row. The
    first `skip` rows are passed over undecoded (their count said before the first batch)."""
    batch: list[Row] = []
    passed = 0
    with open(source.path, "rb") as file:
        for line_number, line in enumerate(file, 1):
            if not line.strip():
                continue
            if passed < skip:
                passed += 1
                continue
            try:
                values = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                batch.append(Row(0, None, None, f"{source.path.name[:100]} line {line_number}: not JSON ({exc})"))
            else:
                batch.append(made(values, columns) if isinstance(values, dict) else
                             Row(0, None, None, f"{source.path.name[:100]} line {line_number}: not a JSON object"))
            if len(batch) >= READ_ROWS:
                if passed:
                    yield passed
                    passed = skip = 0
                yield batch
                batch = []
    if passed:
        yield passed
    if batch:
        yield batch


READERS = {"parquet": parquet_rows, "jsonl": jsonl_rows, "csv": csv_rows}


def changed(corpus: Corpus) -> str | None:
    """What differs in the files since `discover` (a file replaced during the job), or None."""
    for source in corpus.files:
        try:
            stat = os.stat(source.path)
        except OSError:
            return f"{source.path.name} is gone"
        if (stat.st_size, stat.st_mtime_ns) != (source.size, source.mtime_ns):
            return f"{source.path.name} changed"
    return None
