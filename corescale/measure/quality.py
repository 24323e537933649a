"""The quality check of one trial, in its worker after the timed window: the measured backend's task outputs on
the quality set (workload/quality.py) against the fp32 PyTorch reference's, in the task's own terms. A model file
has no PyTorch model: its reference is the file itself, run at fp32 by the first backend that loads it
(backends.quality_reference: ONNX Runtime for an ONNX file).

The reference outputs are cached (`cache_dir/reference/<key>.npy`, keyed by the model, its head, the set's tokens,
the seed and the libraries that compute it), so a worker whose reference was computed before loads no PyTorch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from corescale.workload.quality import set_digest
from corescale.workload.samples import QuerySet, pad_id
from corescale.workload.tasks import TASKS, resolve, softmax

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

BATCH = 16  # rows per call: padded to the longest in each length-sorted group, as a service would
OTHER_BATCH = 7  # the second batching's rows per call (batch dependence: reduced precisions only)


def outputs(backend, model, queries: QuerySet, other: bool = False) -> np.ndarray:
    """The backend's task output for every row, in row order; `other`: in a second batching (longest first, in
    groups of OTHER_BATCH: other companions, other padding)."""
    order = np.argsort(queries.lengths, kind="stable")
    order, batch = (order[::-1], OTHER_BATCH) if other else (order, BATCH)
    found: dict[int, np.ndarray] = {}
    for start in range(0, len(order), batch):
        chosen = [int(i) for i in order[start:start + batch]]
        length = int(max(queries.lengths[chosen]))
        inputs = queries.items(chosen) if getattr(backend, "takes_text", False) and queries.texts else \
            queries.rows(chosen, length, pad_id(model), model.takes_token_type_ids)
        result = backend.to_numpy(backend.forward(backend.prepare(inputs)))
        for row, index in enumerate(chosen):
            found[index] = result[row]
    return np.stack([found[i] for i in range(len(order))]).astype(np.float32)


def reference_key(cfg: BenchmarkConfig, model, queries: QuerySet) -> str:
    from corescale.backends import entry, quality_reference
    from corescale.workload.models import source_files

    libraries = entry(quality_reference(model)).libraries
    referred = model.reference_spec
    files = source_files(referred) if referred is not None else source_files(model)
    identity = {"model": (referred or model).identity(), "files": files, "seed": cfg.seed,
                "set": set_digest(queries), "libraries": {n: _version(n) for n in libraries}, "version": 1}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def reference_file(cfg: BenchmarkConfig, model, queries: QuerySet) -> Path:
    """Where the reference's outputs on `queries` are cached."""
    return Path(os.path.expanduser(cfg.cache_dir)) / "reference" / f"{reference_key(cfg, model, queries)}.npy"


def reference_outputs(cfg: BenchmarkConfig, model, threads: int, queries: QuerySet) -> tuple[np.ndarray, bool]:
    """(the fp32 reference's outputs, whether they came from the cache)."""
    from corescale.backends import OPTIONS, create_backend, quality_reference
    from corescale.machine.precisions import REFERENCE

    file = reference_file(cfg, model, queries)
    if file.is_file():
        try:
            return np.load(file), True
        except (OSError, ValueError):
            pass  # unreadable: computed again, and replaced
    name = quality_reference(model)
    referred = model.reference_spec or model  # reference=DIR: its PyTorch model under the file's head
    ref_cfg = dataclasses.replace(cfg, model=referred.name, backend=OPTIONS[name](), precision=REFERENCE,
                                  reference=None, pooling=None, normalize=None)
    reference = create_backend(name)
    reference.load(referred, ref_cfg, threads, queries.rows([0], int(queries.lengths[0]), pad_id(referred),
                                                             referred.takes_token_type_ids))
    found = outputs(reference, referred, queries)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".", suffix=".npy")
    with os.fdopen(fd, "wb") as handle:
        np.save(handle, found)
    os.chmod(tmp, 0o644)
    os.replace(tmp, file)
    return found, False


def reference_name(model) -> str:
    """How the record names the reference."""
    from corescale.backends import quality_reference

    name = f"{quality_reference(model)} fp32"
    if model.reference is not None:
        return f"{name} on reference={model.reference_spec.name} (the file's head, the same tokens)"
    return f"{name} on the model file itself (no PyTorch model)" if model.model_file else name


def unknown_quality(cfg: BenchmarkConfig, model) -> str | None:
    """Why a model file's quality cannot be judged (None: it can): with no reference=DIR, a file measured as it
    is (fp32, or quantized already) would only be compared with itself."""
    from corescale.machine.precisions import REFERENCE

    if model.model_file is None or model.reference is not None:
        return None
    if model.quantization is None and cfg.precision != REFERENCE:
        return None  # the backend reduces the file's precision: the file at fp32 is a true reference
    what = "quantized already" if model.quantization else "measured as it is"
    return (f"unknown: the model file is {what}, and against itself it would score 1.0; give reference=DIR (the "
            "fp32 model directory or hub id it was exported or quantized from)")


# --- metrics ----------------------------------------------------------------------------------------------------

def _rows_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.where(norms == 0, 1.0, norms)


def embed_metrics(out: np.ndarray, ref: np.ndarray, groups: np.ndarray | None = None) -> dict[str, float]:
    cosine = _rows_cosine(out, ref)
    return {"cosine_min": float(cosine.min()), "cosine_p1": float(np.percentile(cosine, 1)),
            "cosine_mean": float(cosine.mean()), "recall_at_10": neighbour_recall(out, ref, 10)}


def neighbour_recall(out: np.ndarray, ref: np.ndarray, k: int = 10) -> float:
    """Mean share of each row's k nearest neighbours (cosine, itself excluded) under the reference that the
    measured outputs find too."""
    def neighbours(x: np.ndarray) -> np.ndarray:
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        sim = unit @ unit.T
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :k]

    k = min(k, len(out) - 1)
    a, b = neighbours(out.astype(np.float64)), neighbours(ref.astype(np.float64))
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


def ndcg_at(scores: np.ndarray, reference: np.ndarray, k: int = 10) -> float:
    """NDCG@k of the measured order, each document's gain graded by its reference rank (n for the first, 1 for
    the last): 1.0 exactly when the top k keep the reference's order."""
    n = len(reference)
    gain = np.empty(n)
    gain[np.argsort(-reference, kind="stable")] = np.arange(n, 0, -1)
    discount = 1.0 / np.log2(np.arange(2, min(k, n) + 2))
    measured = gain[np.argsort(-scores, kind="stable")][:k]
    ideal = np.sort(gain)[::-1][:k]
    return float((measured * discount).sum() / (ideal * discount).sum())


def rerank_metrics(out: np.ndarray, ref: np.ndarray, groups: np.ndarray | None) -> dict[str, float]:
    from scipy.stats import kendalltau

    assert groups is not None, "a rerank quality set names each row's query"
    out, ref = out.reshape(len(out), -1)[:, 0], ref.reshape(len(ref), -1)[:, 0]
    ndcg, tau, top = [], [], []
    for query in np.unique(groups):
        rows = groups == query
        a, b = out[rows], ref[rows]
        ndcg.append(ndcg_at(a, b))
        statistic = kendalltau(a, b).statistic
        tau.append(1.0 if np.isnan(statistic) and np.array_equal(a, b) else float(statistic))
        top.append(float(np.argmax(a) == np.argmax(b)))
    return {"ndcg_at_10_mean": float(np.mean(ndcg)), "ndcg_at_10_min": float(np.min(ndcg)),
            "kendall_tau_mean": float(np.mean(tau)), "kendall_tau_min": float(np.min(tau)),
            "top1_agreement": float(np.mean(top))}


def classify_metrics(out: np.ndarray, ref: np.ndarray, groups: np.ndarray | None = None) -> dict[str, float]:
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    return {"label_agreement": float(np.mean(out.argmax(1) == ref.argmax(1))),
            "max_probability_diff": float(np.abs(softmax(out) - softmax(ref)).max())}


def task_metrics(task: str, out: np.ndarray, ref: np.ndarray, groups: np.ndarray | None) -> dict[str, float]:
    """The task's metrics (its judge) of the measured outputs against the reference's."""
    entry = TASKS[task]
    found = resolve(str(entry.judge))(out, ref, groups)
    assert set(found) == set(entry.directions), "every metric the task declares is measured"
    return found


def check(cfg: BenchmarkConfig, model, threads: int, backend, queries: QuerySet) -> dict:
    """The quality section of an instance's report (the parent applies the gate)."""
    import time

    began = time.perf_counter()
    evaluation = {"evaluation": evaluate(cfg, model, threads, backend)} if cfg.quality_eval else {}
    unknown = unknown_quality(cfg, model)
    if unknown is not None:
        return {"task": model.task, "metrics": {}, "rows": len(queries.ids), "origin": queries.origin,
                "reference": "none", "unknown": unknown, "seconds": time.perf_counter() - began, **evaluation}
    measured = outputs(backend, model, queries)
    reference, cached = reference_outputs(cfg, model, threads, queries)
    return {"task": model.task, "metrics": task_metrics(model.task, measured, reference, queries.groups),
            "rows": len(queries.ids), "origin": queries.origin, "reference": reference_name(model),
            "reference_cached": cached, "batch_change": batch_change(cfg, model, backend, queries, measured),
            "seconds": time.perf_counter() - began, **evaluation}


def batch_change(cfg: BenchmarkConfig, model, backend, queries: QuerySet, measured: np.ndarray) -> float | None:
    """The largest change of one text's output when the quality set runs in a second batching (dynamic int8's
    activation scales come from the whole batch): 1 - cosine for a vector, the absolute change for logits; None
    at a precision that is not reduced (its outputs do not depend on their companions)."""
    from corescale.machine.precisions import PRECISIONS

    if not PRECISIONS[cfg.precision].reduced and model.quantization is None:
        return None
    again = outputs(backend, model, queries, other=True)
    a, b = measured.reshape(len(measured), -1), again.reshape(len(again), -1)
    if a.shape[1] == 1 or TASKS[model.task].head == "logits":
        return float(np.abs(a - b).max())
    return float(1.0 - _rows_cosine(a, b).min())


def evaluate(cfg: BenchmarkConfig, model, threads: int, backend) -> dict:
    """The evaluation section of the quality report: both configurations' metrics and the drop."""
    import time

    from corescale.measure.evaluation import LIBRARIES, score
    from corescale.workload.evaluation import build_eval_set

    began = time.perf_counter()
    data, rows = build_eval_set(cfg, model)
    labels = model.head.labels
    measured = score(data.kind, outputs(backend, model, rows), data, labels)
    reference = None
    if unknown_quality(cfg, model) is None:
        found, _ = reference_outputs(cfg, model, threads, rows)
        reference = score(data.kind, found, data, labels)
    return {"kind": data.kind, "origin": rows.origin, "rows": len(rows.ids), "libraries": LIBRARIES,
            "measured": measured, "reference": reference,
            "drop": {m: reference[m] - v for m, v in measured.items()} if reference else None,
            "seconds": time.perf_counter() - began}


def main(argv: list[str]) -> int:
    """`python -m corescale.measure.quality JOB`: the reference's outputs on the job's quality set, computed on its
    instance's CPUs and threads into the cache (gate.reference_first: before a served trial's instances start)."""
    from corescale.measure.protocol import Job

    job = Job.read(argv[0])
    os.sched_setaffinity(0, list(job.instance.cpus))
    assert job.files.quality is not None, "the job names its quality set"
    reference_outputs(job.config, job.model, job.instance.threads, QuerySet.load(job.files.quality))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
