"""The user's evaluation data (`quality.eval=FILE`): read, checked and tokenized in the parent before any worker
starts (one line for a file that cannot be used), and again in instance 0, which scores it after the timed window
(measure/evaluation.py) for the measured configuration and for the fp32 reference on the same tokens.

Kinds (workload/tasks.py EVALUATIONS; a task's `evaluates` says which it scores):
- retrieval: BEIR's layout, a folder holding `corpus.jsonl` (`_id`, `title`, `text`), `queries.jsonl` (`_id`,
  `text`) and `qrels/<split>.tsv` (`query-id`, `corpus-id`, `score`, a header line), or one JSONL file whose rows
  are `{"query": ..., "positives": [texts], "negatives": [texts]}` (each text a document of the corpus);
- pairs: a JSONL file of `{"sentence1", "sentence2", "score"}` (STS: gold similarity; a cross-encoder scores the
  pair, an embedder the cosine of the two);
- labels: a JSONL file of `{"text", "label"}` (the label a class name of the model's or its index).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corescale.errors import UserError
from corescale.workload.tasks import EVALUATIONS, TASKS

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig
    from corescale.workload.samples import QuerySet

BEIR_FILES = ("corpus.jsonl", "queries.jsonl")
MAX_ROWS = 50_000  # texts one evaluation may hold (each is run twice: the measured configuration and fp32)


@dataclass(frozen=True)
class EvalData:
    kind: str  # one of EVALUATIONS
    origin: str
    queries: list[str] = field(default_factory=list)  # retrieval
    documents: list[str] = field(default_factory=list)  # retrieval
    relevant: list[dict[int, float]] = field(default_factory=list)  # retrieval: per query, document -> grade
    first: list[str] = field(default_factory=list)  # pairs: sentence1; labels: the texts
    second: list[str] = field(default_factory=list)  # pairs: sentence2
    gold: list[Any] = field(default_factory=list)  # pairs: gold scores; labels: gold labels

    def items(self, pairs: bool) -> list:
        """The rows the model computes: queries then documents; both sentences of each pair (as one pair for a
        task that takes pairs); the texts."""
        if self.kind == "retrieval":
            return self.queries + self.documents
        if self.second:
            return list(zip(self.first, self.second)) if pairs else self.first + self.second
        return list(self.first)


def _jsonl(path: Path, what: str) -> list[dict]:
    rows, at = [], 0
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                at += 1
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                    rows.append(row)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"quality.eval: {what} {path} line {at} is not JSON lines of objects ({exc})") from None
    if not rows:
        raise UserError(f"quality.eval: {what} {path} holds no rows")
    if len(rows) > MAX_ROWS:
        raise UserError(f"quality.eval: {what} {path} holds {len(rows)} rows; at most {MAX_ROWS}")
    return rows


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"quality.eval: {where} has no text in \"{key}\"")
    return value


def read_eval(source: str) -> EvalData:
    """The evaluation data of `quality.eval=` (one line for anything it cannot use)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _beir(path)
    if not path.is_file():
        raise UserError(f"quality.eval={source} does not exist: give a BEIR folder (corpus.jsonl, queries.jsonl, "
                        "qrels/) or a JSONL file of retrieval, pair or label rows")
    rows = _jsonl(path, "file")
    keys = set(rows[0])
    if {"query", "positives"} <= keys:
        return _retrieval_rows(rows, str(path))
    if {"sentence1", "sentence2", "score"} <= keys:
        first = [_text(r, "sentence1", f"row {i + 1}") for i, r in enumerate(rows)]
        second = [_text(r, "sentence2", f"row {i + 1}") for i, r in enumerate(rows)]
        try:
            gold = [float(r["score"]) for r in rows]
        except (KeyError, TypeError, ValueError):
            raise UserError(f"quality.eval: {path}: every pair needs a numeric \"score\"") from None
        return EvalData("pairs", f"{path} ({len(rows)} pairs with gold scores)", first=first, second=second,
                        gold=gold)
    if {"text", "label"} <= keys:
        texts = [_text(r, "text", f"row {i + 1}") for i, r in enumerate(rows)]
        if any("label" not in r for r in rows):
            raise UserError(f"quality.eval: {path}: every row needs a \"label\"")
        return EvalData("labels", f"{path} ({len(rows)} labelled texts)", first=texts,
                        gold=[r["label"] for r in rows])
    raise UserError(f"quality.eval: {path}: rows must hold query and positives (retrieval), sentence1, sentence2 "
                    f"and score (pairs), or text and label (labels); the first holds {', '.join(sorted(keys))}")


def _retrieval_rows(rows: list[dict], origin: str) -> EvalData:
    documents: dict[str, int] = {}
    queries, relevant = [], []
    for number, row in enumerate(rows, 1):
        queries.append(_text(row, "query", f"row {number}"))
        grades = {}
        for key, grade in (("positives", 1.0), ("negatives", 0.0)):
            texts = row.get(key, [])
            if not isinstance(texts, list) or not all(isinstance(t, str) and t.strip() for t in texts):
                raise UserError(f"quality.eval: row {number}: \"{key}\" must be a list of texts")
            for text in texts:
                grades[documents.setdefault(text, len(documents))] = grade
        if not any(grades.values()):
            raise UserError(f"quality.eval: row {number} names no positive document")
        relevant.append({d: g for d, g in grades.items() if g > 0})
    return EvalData("retrieval", f"{origin} ({len(queries)} queries, {len(documents)} documents)", queries=queries,
                    documents=list(documents), relevant=relevant)


def _beir(folder: Path) -> EvalData:
    missing = [f for f in BEIR_FILES if not (folder / f).is_file()]
    qrels = sorted((folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
    if missing or not qrels:
        raise UserError(f"quality.eval={folder} is not in BEIR's layout: it lacks "
                        f"{', '.join(missing + ([] if qrels else ['qrels/*.tsv']))}")
    qrel = next((q for q in qrels if q.stem == "test"), qrels[0])
    corpus = {str(r.get("_id")): " ".join(filter(None, (r.get("title"), _text(r, "text", f"document {r.get('_id')}"))))
              for r in _jsonl(folder / "corpus.jsonl", "corpus")}
    asked = {str(r.get("_id")): _text(r, "text", f"query {r.get('_id')}")
             for r in _jsonl(folder / "queries.jsonl", "queries")}
    judged: dict[str, dict[str, float]] = {}
    with open(qrel, encoding="utf-8", newline="") as handle:
        for number, line in enumerate(csv.reader(handle, delimiter="\t"), 1):
            if number == 1 and line[:1] == ["query-id"] or not line:
                continue
            try:
                query, document, grade = line[0], line[1], float(line[2])
            except (IndexError, ValueError):
                raise UserError(f"quality.eval: {qrel} line {number} is not query-id, corpus-id, score") from None
            if query not in asked or document not in corpus:
                named, where = (f"query-id {query}", "queries") if query not in asked else \
                    (f"corpus-id {document}", "corpus")
                raise UserError(f"quality.eval: {qrel.name} line {number} names {named}, which {where}.jsonl does "
                                "not hold")
            judged.setdefault(query, {})[document] = grade
    order = {d: i for i, d in enumerate(corpus)}
    kept = [q for q in asked if any(g > 0 for g in judged.get(q, {}).values())]
    if not kept:
        raise UserError(f"quality.eval: {qrel} judges no query relevant to any document")
    return EvalData("retrieval", f"{folder} ({len(kept)} queries with relevance in {qrel.name}, {len(corpus)} "
                    "documents)", queries=[asked[q] for q in kept], documents=list(corpus.values()),
                    relevant=[{order[d]: g for d, g in judged[q].items() if g > 0} for q in kept])


def build_eval_set(cfg: BenchmarkConfig, model) -> tuple[EvalData, QuerySet]:
    """The evaluation data and its rows through the model's tokenizer (one line where the task cannot score it)."""
    from corescale.workload.samples import QuerySet
    from corescale.workload.tokens import text_encoder, tokenizer_dir

    data = read_eval(str(cfg.quality_eval))
    entry = TASKS[model.task]
    if data.kind not in entry.evaluates:
        raise UserError(f"quality.eval={cfg.quality_eval} holds {data.kind} data; task={model.task} scores "
                        f"{', '.join(entry.evaluates) or 'no evaluation data'} (of {', '.join(EVALUATIONS)})")
    folder, named = tokenizer_dir(cfg, model)
    if folder is None:
        raise UserError(f"quality.eval needs the model's tokenizer; model '{cfg.model}' has none: give "
                        "workload.tokenizer=DIR")
    items = data.items(entry.pairs)
    ids, types = text_encoder(cfg, model)(items)
    pairs = bool(items) and isinstance(items[0], tuple)
    texts, seconds = ([a for a, _ in items], [b for _, b in items]) if pairs else ([str(t) for t in items], None)
    return data, QuerySet(ids, f"{data.origin}, through {named}",
                          type_ids=types if model.takes_token_type_ids else None, texts=texts, pairs=seconds)
