"""Query sets: the token ids each query holds (random ids of fixed or drawn lengths, or real text through a
tokenizer), and the padding policies that turn a group of queries into one [rows, length] call.

Built once in the parent (which checks everything a user gave before a worker starts) and saved to one .npz the
instances read; draws are seeded by the config's seed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from corescale.errors import UserError
from corescale.userfiles import MAX_CORPUS_BYTES, read_text
from corescale.workload.tasks import TASKS

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

BUCKET_EDGES = (16, 32, 64, 128, 256, 384, 512)
LOW_ID = 5  # random ids keep clear of special tokens


@dataclass
class QuerySet:
    ids: list[np.ndarray]  # one int64 array per query, unpadded
    origin: str  # what they came from, for the record
    type_ids: list[np.ndarray] | None = None  # segment ids of text pairs (a cross-encoder's query and document)
    groups: np.ndarray | None = None  # rerank: the query each row belongs to
    texts: list[str] | None = None  # the texts themselves, for tokenize=true (the tokenizer runs in the timed call)
    pairs: list[str] | None = None  # the second text of each (query, document) pair

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(q) for q in self.ids], dtype=np.int64)

    def save(self, path: Path) -> None:
        extra: dict[str, Any] = {}
        if self.type_ids is not None:
            extra["type_flat"] = np.concatenate(self.type_ids)
        if self.groups is not None:
            extra["groups"] = self.groups
        for name in ("texts", "pairs"):
            if getattr(self, name) is not None:
                extra[name] = np.array(getattr(self, name), dtype=str)
        np.savez(path, flat=np.concatenate(self.ids), lengths=self.lengths, origin=np.array(self.origin), **extra)

    @classmethod
    def load(cls, path) -> QuerySet:
        data = np.load(path)
        ends = np.cumsum(data["lengths"])[:-1]
        types = list(np.split(data["type_flat"], ends)) if "type_flat" in data else None
        texts, pairs = ([str(t) for t in data[n]] if n in data else None for n in ("texts", "pairs"))
        return cls(list(np.split(data["flat"], ends)), str(data["origin"]), types, data.get("groups"), texts, pairs)

    def items(self, chosen: list[int]) -> list:
        """The texts (or (query, document) pairs) of these rows, as a tokenizer takes them."""
        assert self.texts is not None, "tokenize=true needs a query set of texts (checked before any worker)"
        if self.pairs is not None:
            return [(self.texts[i], self.pairs[i]) for i in chosen]
        return [self.texts[i] for i in chosen]

    def rows(self, chosen: list[int], length: int, pad: int, token_types: bool) -> dict[str, np.ndarray]:
        """The model inputs of these rows, padded to `length`."""
        types = [self.type_ids[i] for i in chosen] if self.type_ids is not None else None
        return batch_inputs([self.ids[i] for i in chosen], length, pad, token_types, types)

    def summary(self) -> dict:
        lengths = self.lengths
        return {"origin": self.origin, "queries": len(lengths), "mean_length": float(lengths.mean()),
                "min_length": int(lengths.min()), "max_length": int(lengths.max()),
                "p50_length": float(np.percentile(lengths, 50)), "p90_length": float(np.percentile(lengths, 90))}


def uses_query_set(cfg: BenchmarkConfig) -> bool:
    """Whether queries differ from the closed loop's one fixed random batch."""
    return bool(cfg.workload.source or cfg.workload.lengths) or cfg.scenario != "offline"


def build_query_set(cfg: BenchmarkConfig, model) -> QuerySet:
    """Every check on the workload a user gave (files, fields, tokenizer) happens here, in the parent."""
    rng = np.random.default_rng(cfg.seed)
    count, limit = cfg.workload.samples, cfg.sequence_length
    if cfg.workload.source:
        from corescale.workload import corpus
        from corescale.workload.tokens import text_encoder

        if cfg.workload.source == corpus.BUILTIN:
            items, origin = corpus.workload_items(model.task, count)
        else:
            everything = read_texts(cfg.workload.source)
            items, origin = everything[:count], f"{cfg.workload.source} ({min(count, len(everything))} of " \
                f"{len(everything)} texts)"
        ids, types = text_encoder(cfg, model)(items)
        pairs = bool(items) and isinstance(items[0], tuple)
        return QuerySet(ids, origin, types if pairs else None, None, [i[0] if pairs else i for i in items],
                        [i[1] for i in items] if pairs else None)
    if cfg.workload.lengths:
        lengths = draw_lengths(cfg.workload.lengths, rng, count, limit)
        origin = f"random ids, lengths {cfg.workload.lengths}"
    else:
        keep = limit - int(round(cfg.padding_fraction * limit))
        lengths = np.full(count, keep, dtype=np.int64)
        origin = f"random ids, length {keep}"
    return QuerySet([rng.integers(LOW_ID, model.vocab_size, size=int(n), dtype=np.int64) for n in lengths], origin)


# --- lengths ----------------------------------------------------------------------------------------------------

def draw_lengths(spec: str, rng: np.random.Generator, count: int, limit: int) -> np.ndarray:
    """`uniform(A,B)` (inclusive) or a histogram file of `length,count` lines; lengths above `limit` are refused."""
    match = re.fullmatch(r"\s*uniform\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*", spec)
    if match:
        low, high = int(match.group(1)), int(match.group(2))
        if not 1 <= low <= high <= limit:
            raise UserError(f"workload.lengths={spec}: need 1 <= A <= B <= sequence_length={limit}")
        return rng.integers(low, high + 1, size=count)
    lengths, weights = read_histogram(spec, limit)
    weights = weights / weights.max()  # first to at most 1: counts near the float limit cannot sum to inf
    return rng.choice(lengths, size=count, p=weights / weights.sum())


def read_histogram(path: str, limit: int) -> tuple[np.ndarray, np.ndarray]:
    file = Path(os.path.expanduser(path))
    if not file.exists():
        raise UserError(f"workload.lengths='{path}' is neither uniform(A,B) nor a histogram file that exists")
    pairs = []
    for number, line in enumerate(read_text(file, "histogram file (workload.lengths)").split("\n"), 1):
        fields = [f for f in re.split(r"[,\s]+", line.strip()) if f]
        if not fields or fields[0].startswith("#") or not fields[0].isdigit() and number == 1:
            continue  # blank, comment or header
        try:
            length, weight = int(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise UserError(f"{path}:{number}: expected `length,count`, got '{line.strip()}'") from None
        if not 1 <= length <= limit or not weight >= 0 or not np.isfinite(weight):
            raise UserError(f"{path}:{number}: length must be 1..{limit} (sequence_length) and count a finite "
                            f"number >= 0 (got '{line.strip()}')")
        pairs.append((length, weight))
    if not pairs or sum(w for _, w in pairs) <= 0:
        raise UserError(f"histogram file {path} holds no `length,count` line with a count > 0")
    lengths, weights = zip(*pairs)
    return np.array(lengths), np.array(weights, dtype=float)


# --- text -------------------------------------------------------------------------------------------------------

def split_source(source: str) -> tuple[Path, str | None]:
    """`file.jsonl:field` -> (file, field); a colon that is part of an existing file's name stays in it."""
    path = Path(os.path.expanduser(source))
    if path.exists() or ":" not in source:
        return path, None
    head, _, name = source.rpartition(":")
    return Path(os.path.expanduser(head)), name or None


def read_texts(source: str) -> list[str]:
    path, name = split_source(source)
    kind = path.suffix.lower()
    if not path.exists():
        raise UserError(f"workload file '{path}' does not exist; give file.txt, file.jsonl:FIELD or file.csv:COLUMN")
    if kind in (".jsonl", ".csv") and not name:
        raise UserError(f"workload={source}: say which {'field' if kind == '.jsonl' else 'column'} holds the text "
                        f"(workload={path}:NAME)")
    if kind not in (".jsonl", ".csv") and name:
        raise UserError(f"workload={source}: a field applies to .jsonl and .csv files only")
    text = read_text(path, "workload file", MAX_CORPUS_BYTES)
    if kind == ".jsonl" and name:
        texts = _jsonl_field(path, text, name)
    elif kind == ".csv" and name:
        texts = _csv_column(path, text, name)
    else:
        texts = [line.removesuffix("\r") for line in text.split("\n") if line.strip()]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserError(f"workload file '{path}' holds no text" + (f" in '{name}'" if name else ""))
    return texts


def query_texts(cfg: BenchmarkConfig) -> tuple[list, str]:
    """The queries sent as text (endpoint=): the workload file's first workload.samples texts, or the built-in
    corpus's (no workload, or workload=builtin); for a pair task (task=rerank) the built-in rerank sets, each a
    (query, texts) pair sent whole; and where they came from."""
    from corescale.workload import corpus

    count = cfg.workload.samples
    if cfg.task is not None and TASKS[cfg.task].pairs:
        if cfg.workload.source and cfg.workload.source != corpus.BUILTIN:
            raise UserError(f"task={cfg.task} over HTTP sends the built-in rerank sets (a query and the texts it "
                            "ranks); a workload file holds texts only: leave workload= out")
        sets = corpus.rerank_sets(max(count // corpus.RERANK_CANDIDATES, 2), corpus.RERANK_CANDIDATES)
        return [(s.query, s.documents) for s in sets], (
            f"built-in rerank sets ({len(sets)} queries x {corpus.RERANK_CANDIDATES} texts, one query per request)")
    if cfg.workload.source and cfg.workload.source != corpus.BUILTIN:
        found = read_texts(cfg.workload.source)
        return found[:count], f"{cfg.workload.source} ({min(count, len(found))} of {len(found)} texts)"
    chosen, origin = corpus.workload_items("embed", count)
    return chosen, origin


def text_summary(queries: list, origin: str) -> dict:
    """The record's `queries` of texts sent as they are (their lengths in characters, a rerank query's and its
    texts' together: the server tokenizes)."""
    chars = np.array([len(q) if isinstance(q, str) else len(q[0]) + sum(map(len, q[1])) for q in queries])
    return {"origin": origin, "queries": len(queries), "mean_chars": float(chars.mean()),
            "min_chars": int(chars.min()), "max_chars": int(chars.max()), "p50_chars": float(np.percentile(chars, 50)),
            "p90_chars": float(np.percentile(chars, 90))}


def _jsonl_field(path: Path, text: str, name: str) -> list[str]:
    texts = []
    for number, line in enumerate(text.split("\n"), 1):  # JSON Lines end at \n only (U+2028 is text)
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            raise UserError(f"{path}:{number} is not a JSON line") from None
        if not isinstance(row, dict) or name not in row:
            keys = ", ".join(row) if isinstance(row, dict) else "none"
            raise UserError(f"{path}:{number} lacks the field '{name}'; its fields: {keys}")
        if not isinstance(row[name], str):
            raise UserError(f"{path}:{number}: field '{name}' is {type(row[name]).__name__} "
                            f"{json.dumps(row[name])[:40]}, not a text (a JSON string)")
        texts.append(row[name])
    return texts


def _csv_column(path: Path, text: str, name: str) -> list[str]:
    reader = csv.DictReader(io.StringIO(text, newline=""))  # newlines inside quoted fields stay in them
    try:
        if reader.fieldnames is None or name not in reader.fieldnames:
            columns = ", ".join(reader.fieldnames or []) or "none"
            raise UserError(f"{path} has no column '{name}'; its columns: {columns}")
        return [row[name] or "" for row in reader]
    except csv.Error as exc:  # e.g. a field beyond the csv module's size limit
        raise UserError(f"{path}:{reader.line_num}: not a CSV row ({exc})") from None


# --- padding ----------------------------------------------------------------------------------------------------

def padded_length(lengths, pad: str, limit: int) -> int:
    """What a call over queries of these lengths is padded to: the longest (max, sorted) or its bucket's edge."""
    longest = int(max(lengths))
    if pad != "bucket" or longest > limit:  # corescale serve: up to the model's length, past the measured one
        return longest
    return min([edge for edge in BUCKET_EDGES if edge >= longest] + [limit])


def batch_inputs(queries: list[np.ndarray], length: int, pad_id: int, token_types: bool,
                 types: list[np.ndarray] | None = None) -> dict[str, np.ndarray]:
    ids = np.full((len(queries), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(queries), length), dtype=np.int64)
    segments = np.zeros_like(ids)
    for row, query in enumerate(queries):
        ids[row, :len(query)] = query
        mask[row, :len(query)] = 1
        if types is not None:
            segments[row, :len(query)] = types[row]
    inputs = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        inputs["token_type_ids"] = segments
    return inputs


def offline_batches(lengths: np.ndarray, batch: int, pad: str, seed: int) -> list[list[int]]:
    """The closed loop's batches over a query set: in draw order (max), grouped by length bucket (bucket, each
    batch from one bucket) or length-sorted (sorted); every query once, the last batch of a group topped up by
    wrapping. The batches come in a seeded random order, so a window that covers only some of them is not
    biased towards the short (or long) ones."""
    order = np.arange(len(lengths))
    if pad == "sorted":
        order = np.argsort(lengths, kind="stable")
    if pad == "bucket":
        edges = np.searchsorted(BUCKET_EDGES, lengths)
        groups = [order[edges == e] for e in np.unique(edges)]
    else:
        groups = [order]
    batches = [list(map(int, np.resize(g[i:i + batch], batch))) for g in groups
               for i in range(0, len(g), batch)]
    permutation = np.random.default_rng(seed).permutation(len(batches))
    return [batches[i] for i in permutation]


def pad_id(model) -> int:
    return int(model.config.get("pad_token_id") or 0)
