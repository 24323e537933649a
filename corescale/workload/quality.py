"""Quality in the task's terms: the gate (`min_quality=`) over each task's metrics, and the real text the check
runs on (the quality set), all light: built and checked in the parent before any worker starts.

The measured backend's outputs on the quality set are compared with the fp32 PyTorch reference's
(measure/quality.py; the task's judge). The default gates (each task's entry, workload/tasks.py) and why
(docs/tasks.md):
- embed: cosine p1 >= 0.99 (99 % of texts keep their direction within 8 degrees) and recall@10 >= 0.95 (a text's ten
  nearest neighbours in the set change by at most one in two queries on average): what a search index notices;
- rerank: NDCG@10 >= 0.98 against the reference's order (graded by the reference's ranks) and the same top
  document for >= 95 % of queries: what a user of the reranked list sees;
- classify: the same label for >= 99 % of texts and no class probability moving by more than 0.05.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from corescale.errors import UserError
from corescale.workload import corpus
from corescale.workload.samples import QuerySet
from corescale.workload.tasks import BATCH_CHANGE, DROP, EVALUATIONS, TASKS
from corescale.workload.tokens import text_encoder, tokenizer_dir

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig
_TERM = re.compile(r"\s*([a-z0-9_]+)\s*(>=|<=|:)\s*([0-9.eE+-]+)\s*")


@dataclass(frozen=True)
class Bound:
    metric: str
    op: str  # ">=" or "<="
    value: float

    def holds(self, measured: float) -> bool:
        return bool(measured >= self.value if self.op == ">=" else measured <= self.value)  # NaN fails

    def text(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_gate(gate: str | dict | None, task: str, evaluated: str | None = None) -> list[Bound]:
    """`min_quality` (None: the task's default) as bounds: "m>=v,m<=v", "m:v" (the direction is the metric's) or a
    {metric: bound} mapping; one line for a metric of another task or bad syntax. `evaluated`: the kind of the
    user's evaluation data (quality.eval), whose metrics and their drop from fp32 (`<metric>_drop`) it may bound."""
    entry = TASKS[task]
    extra = EVALUATIONS.get(evaluated or "", ())
    metrics = {**{m: "higher" for m in extra}, **{f"{m}{DROP}": "lower" for m in extra}, BATCH_CHANGE: "lower",
               **entry.directions}
    spec = entry.gate if gate is None else gate
    if isinstance(spec, dict):
        spec = ",".join(f"{k}:{v}" for k, v in spec.items())
    bounds = []
    for term in filter(str.strip, spec.split(",")):
        match = _TERM.fullmatch(term)
        if not match:
            raise UserError(f"min_quality term '{term.strip()}' is not METRIC:BOUND, METRIC>=BOUND or METRIC<=BOUND")
        metric, op, raw = match.groups()
        if not entry.judged:
            raise UserError(f"min_quality applies to tasks {', '.join(t for t in TASKS if TASKS[t].judged)}; "
                            f"task={task} is judged by raw drift (reference=pytorch, drift_tolerance=)")
        if metric not in metrics:
            other = [t for t in TASKS if metric in TASKS[t].directions]
            where = f" (a metric of task {', '.join(other)})" if other else ""
            raise UserError(f"min_quality names '{metric}'{where}, not a metric of task={task}; allowed: "
                            f"{', '.join(metrics)}")
        try:
            value = float(raw)
        except ValueError:
            raise UserError(f"min_quality term '{term.strip()}': '{raw}' is not a number") from None
        if not np.isfinite(value):
            raise UserError(f"min_quality term '{term.strip()}': the bound must be finite")
        wanted = ">=" if metrics[metric] == "higher" else "<="
        op = wanted if op == ":" else op
        if op != wanted:
            raise UserError(f"min_quality: {metric} is better {metrics[metric]}, so bound it with {wanted}")
        bounds.append(Bound(metric, op, value))
    return bounds


# --- the quality set -------------------------------------------------------------------------------------------

def quality_texts(cfg: BenchmarkConfig, task: str) -> tuple[list, str]:
    """The texts (a pair task's: (query, document) pairs) the check runs on, and their origin: the user's text
    file when given (not for a pair task, whose pairs are built), else the built-in corpus."""
    if not TASKS[task].pairs and cfg.workload.source and cfg.workload.source != corpus.BUILTIN:
        from corescale.workload.samples import read_texts

        texts = read_texts(cfg.workload.source)[:cfg.quality_samples]
        return texts, f"{cfg.workload.source} ({len(texts)} texts)"
    return corpus.workload_items(task, cfg.quality_samples)


def build_quality_set(cfg: BenchmarkConfig, model) -> QuerySet:
    """The quality set's token ids (and type ids, and the rerank query of each row), checked in the parent."""
    items, origin = quality_texts(cfg, model.task)
    folder, named = tokenizer_dir(cfg, model)
    candidates = corpus.RERANK_CANDIDATES
    groups = np.repeat(np.arange(len(items) // candidates), candidates) if TASKS[model.task].pairs else None
    if folder is None:  # a preset with no tokenizer that fits: seeded random ids of the texts' lengths
        rng = np.random.default_rng(cfg.seed)
        lengths = [min(cfg.sequence_length, max(2, len(str(t).split()) * 4 // 3)) for t in items]
        ids = [rng.integers(5, model.vocab_size, size=n, dtype=np.int64) for n in lengths]
        return QuerySet(ids, f"{origin}; random ids of the texts' lengths (model '{cfg.model}' has no tokenizer)",
                        groups=groups)
    ids, types = text_encoder(cfg, model)(items)
    pairs = bool(items) and isinstance(items[0], tuple)  # the texts too: a backend that tokenizes takes them
    texts, seconds = ([a for a, _ in items], [b for _, b in items]) if pairs else ([str(t) for t in items], None)
    return QuerySet(ids, f"{origin}, through {named}", type_ids=types if model.takes_token_type_ids else None,
                    groups=groups, texts=texts, pairs=seconds)


def set_digest(queries: QuerySet) -> str:
    digest = hashlib.sha256()
    for row in queries.ids:
        digest.update(row.tobytes() + b"|")
    for row in queries.type_ids or []:
        digest.update(row.tobytes() + b"|")
    return digest.hexdigest()[:24]
