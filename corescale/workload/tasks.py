"""The tasks a model's measured call may compute, one entry each (as backends have theirs): the head it needs,
its output and how a route turns it into scores, whether it takes (query, document) pairs, its quality metrics and
default gate, its HTTP routes per API, its TEI model type. Every other module reads an entry; none branches on a
task's name (tests/test_layout.py). docs/tasks.md says how to add one.

Light (no framework, no later stage): the config, the HTTP keys and every stage read it. What is heavy (a route's
request schema and handler, the metrics' computation, an HTTP check's request and answer) is named as a
"module:attribute" hook, imported by the stage that uses it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from corescale.errors import RegistrationError, UserError

# the user's evaluation data (`quality.eval=FILE`, workload/evaluation.py) by kind: its metrics, each better higher;
# the gate may bound each or its drop from fp32 (`ndcg_at_10_drop<=0.005`)
EVALUATIONS = {"retrieval": ("recall_at_10", "ndcg_at_10"), "pairs": ("spearman",), "labels": ("accuracy",)}
DROP = "_drop"
BATCH_CHANGE = "batch_change"  # any task's: the largest per-text change in a second batching (lower is better)
HEADS = ("tokens", "pooled", "logits")  # the last hidden state; one vector per text (pooling); the logits of a
# classification head (workload/heads.py builds each, every backend computes it inside its measured call)
APIS = ("openai", "tei")  # the HTTP APIs a route belongs to (http_keys.HTTP_APIS)
DIRECTIONS = ("higher", "lower")  # a metric is better when higher or lower
_HOOK = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_TERM = re.compile(r"\s*([a-z0-9_]+)\s*(>=|<=|:)")


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-logits))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Along the last axis (one row of class logits, or a batch of rows)."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


SCORES = {"sigmoid": sigmoid, "softmax": softmax}  # a task's scores from its logits (raw_scores=true: the logits)


@dataclass(frozen=True)
class Route:
    """One HTTP route of a task: served by `corescale serve`, sent by the HTTP measurement when it has a request."""

    api: str  # one of APIS
    path: str  # POSTed to
    schema: str  # "module:Class": the request body (a pydantic model, serve/routes.py)
    handler: str  # "module:function": async (front, body) -> the answer (serve/routes.py)
    request: str | None = None  # "module:function": (query, model) -> the JSON payload of one measured query
    answer: str | None = None  # "module:function": (payload) -> the embedding's length or None; raises
    # measure/http/api.BadAnswer unless it answers one query. None with request: not driven over HTTP
    about: tuple[str, ...] = ("/info",)  # GET paths where a server of this API describes itself

    @property
    def driven(self) -> bool:
        return self.request is not None


_REQUIRED: Any = object()  # a fact not given: register() names every one missing


@dataclass(frozen=True)
class Task:
    """Every fact about one task; docs/tasks.md explains each."""

    name: str = _REQUIRED
    noun: str = _REQUIRED  # what a model of the task is ("sentence embedder")
    head: str = _REQUIRED  # one of HEADS
    output: str = _REQUIRED  # the measured call's output name (an exported graph's too)
    tei_type: str = _REQUIRED  # GET /info's model_type key (TEI's name)
    pairs: bool = False  # its texts are (query, document) pairs: quality, calibration and HTTP sets are built so
    labels: tuple[str, ...] = ()  # logits: a preset's labels (its head is random); one label: one score per text
    scores: str | None = None  # logits: SCORES' name of what its routes answer
    metrics: tuple[tuple[str, str], ...] = ()  # (metric, direction): its quality check (none: judged by raw drift)
    gate: str = ""  # the default min_quality (its metrics)
    judge: str | None = None  # "module:function": (out, ref, groups) -> {metric: value} (measure/quality.py)
    evaluates: tuple[str, ...] = ()  # the kinds of user evaluation data it scores (`quality.eval=FILE`: EVALUATIONS)
    routes: tuple[Route, ...] = ()
    corpus: str | None = None  # "module:attribute": how `corescale embed` writes its outputs (embed/columns.py)

    @property
    def judged(self) -> bool:
        """Judged by quality on real text (else by raw drift, as a plain encoder)."""
        return bool(self.metrics)

    @property
    def directions(self) -> dict[str, str]:
        return dict(self.metrics)

    def route(self, api: str) -> Route | None:
        """The route that sends this task over `api` in the HTTP measurement (None: not driven there)."""
        return next((r for r in self.routes if r.api == api and r.driven), None)

    def scored(self, logits: np.ndarray, raw: bool) -> np.ndarray:
        return logits if raw or self.scores is None else SCORES[self.scores](logits)

    def check(self) -> None:
        """Raises RegistrationError naming every missing or malformed fact."""
        missing = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is _REQUIRED]
        if missing:
            raise RegistrationError(f"task '{self.name if self.name is not _REQUIRED else '?'}' is incomplete: "
                                    f"{', '.join(f'{m} missing' for m in missing)} (docs/tasks.md lists every fact)")
        problems = []
        if self.head not in HEADS:
            problems.append(f"head must be one of {', '.join(HEADS)} (got {self.head!r})")
        if (self.head == "logits") != bool(self.labels):
            problems.append("labels are given exactly for a logits head")
        if self.scores is not None and (self.scores not in SCORES or self.head != "logits"):
            problems.append(f"scores must be None or, for a logits head, one of {', '.join(SCORES)}")
        if not all(isinstance(m, tuple) and len(m) == 2 and m[1] in DIRECTIONS for m in self.metrics):
            problems.append(f"metrics must be (name, {' | '.join(DIRECTIONS)}) pairs (got {self.metrics!r})")
        if not set(self.evaluates) <= set(EVALUATIONS):
            problems.append(f"evaluates must be some of {', '.join(EVALUATIONS)} (got {self.evaluates!r})")
        if bool(self.metrics) != (self.judge is not None):
            problems.append("a judge is given exactly when there are metrics")
        unknown = [m.group(1) for m in _TERM.finditer(self.gate) if m.group(1) not in self.directions]
        if unknown:
            problems.append(f"gate names {', '.join(unknown)}, not among its metrics")
        hooks = {"judge": self.judge, "corpus": self.corpus} | {
            f"route {r.path} {f}": getattr(r, f) for r in self.routes
            for f in ("schema", "handler", "request", "answer")}
        problems += [f"{fact} is not 'module:attribute' (got {hook!r})" for fact, hook in hooks.items()
                     if hook is not None and not _HOOK.fullmatch(hook)]
        for route in self.routes:
            if route.api not in APIS or not route.path.startswith("/"):
                problems.append(f"route {route.path!r}: api must be one of {', '.join(APIS)}, the path start with /")
            if (route.request is None) != (route.answer is None):
                problems.append(f"route {route.path}: request and answer are given together")
        if problems:
            raise RegistrationError(f"task '{self.name}' is malformed: {'; '.join(problems)}")


def check_gate_type(gate: Any) -> None:
    """`min_quality` is METRIC:BOUND terms or a {METRIC: BOUND} mapping (its metrics: workload/quality.py)."""
    if not (gate is None or isinstance(gate, str) or isinstance(gate, dict) and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in gate.items())):
        raise UserError(f"min_quality must be METRIC:BOUND terms (\"cosine_p1:0.99\", comma-separated) or "
                        f"{{METRIC:BOUND,...}} (got {gate!r})")


def resolve(hook: str) -> Any:
    """The attribute a "module:attribute" hook names (imported on first use)."""
    from importlib import import_module

    module, attribute = hook.split(":")
    return getattr(import_module(module), attribute)


TASKS: dict[str, Task] = {}  # name -> entry, in the order a model's declared task is looked for


def register(task: Task) -> None:
    task.check()
    taken = {(r.api, r.path): t.name for t in TASKS.values() for r in t.routes if t.name != task.name}
    clash = [(r.path, taken[r.api, r.path]) for r in task.routes if (r.api, r.path) in taken]
    if clash:
        raise RegistrationError(f"task '{task.name}': route {clash[0][0]} is taken by task '{clash[0][1]}'")
    TASKS[task.name] = task


def get(name: str) -> Task:
    """The entry of `task=NAME` (one line for an unknown name)."""
    if name not in TASKS:
        raise UserError(f"unknown task '{name}'; allowed: {', '.join(TASKS)}")
    return TASKS[name]


def of_head(head: str, labels: int = 0) -> str | None:
    """The first registered task that a model with this head declares (logits: one label is a single score, several
    are classes); None when no task has it."""
    return next((t.name for t in TASKS.values() if t.head == head and (head != "logits" or
                                                                          (len(t.labels) == 1) == (labels == 1))), None)


_SERVE = "corescale.serve.routes:"
_SENT = "corescale.measure.http.api:"
_CORPUS = "corescale.embed.columns:"
_RERANK_METRICS = ("ndcg_at_10_mean", "ndcg_at_10_min", "kendall_tau_mean", "kendall_tau_min", "top1_agreement")
for _task in (
    Task("embed", "sentence embedder", "pooled", "sentence_embedding", "embedding",
         metrics=(("cosine_min", "higher"), ("cosine_p1", "higher"), ("cosine_mean", "higher"),
                  ("recall_at_10", "higher")),
         gate="cosine_p1>=0.99,recall_at_10>=0.95", judge="corescale.measure.quality:embed_metrics",
         evaluates=("retrieval", "pairs"),
         routes=(Route("openai", "/v1/embeddings", _SERVE + "Embeddings", _SERVE + "embeddings",
                       _SENT + "embeddings_request", _SENT + "embeddings_answer", ("/v1/models", "/info")),
                 Route("tei", "/embed", _SERVE + "Embed", _SERVE + "embed", _SENT + "texts_request",
                       _SENT + "vectors_answer")), corpus=_CORPUS + "VECTORS"),
    Task("rerank", "cross-encoder (reranker)", "logits", "logits", "reranker", pairs=True, labels=("score",),
         scores="sigmoid", metrics=tuple((m, "higher") for m in _RERANK_METRICS),
         gate="ndcg_at_10_mean>=0.98,top1_agreement>=0.95", judge="corescale.measure.quality:rerank_metrics",
         evaluates=("pairs",),
         routes=(Route("tei", "/rerank", _SERVE + "Rerank", _SERVE + "rerank", _SENT + "rerank_request",
                       _SENT + "ranked_answer"),), corpus=_CORPUS + "SCORES"),
    Task("classify", "sequence classifier", "logits", "logits", "classifier",
         labels=("negative", "neutral", "positive"), scores="softmax",
         metrics=(("label_agreement", "higher"), ("max_probability_diff", "lower")),
         gate="label_agreement>=0.99,max_probability_diff<=0.05", judge="corescale.measure.quality:classify_metrics",
         evaluates=("labels",),
         routes=(Route("tei", "/predict", _SERVE + "Predict", _SERVE + "predict", _SENT + "texts_request",
                       _SENT + "labelled_answer"),), corpus=_CORPUS + "LABELS"),
    # a plain encoder's last hidden state is judged by raw drift (reference=, drift_tolerance=), as before tasks
    Task("encode", "plain encoder", "tokens", "last_hidden_state", "embedding",
         routes=(Route("tei", "/embed_all", _SERVE + "Embed", _SERVE + "embed_all"),)),
):
    register(_task)
