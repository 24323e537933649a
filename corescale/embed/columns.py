"""What a task's outputs become in a corpus job's shards: each task names one `Written` here (workload/tasks.py
`corpus`), with the output types it can write. A task without one (the plain encoder's token states) has no
corpus job.

Vectors (the sentence embedder's): float32 as the model gives them (L2-normalised when its head normalises), or
int8 (each vector scaled by its own largest magnitude to ±127; `scale` holds that magnitude ÷ 127, so
`int8 × scale` is the vector again), or binary (one bit per dimension, set where the value is positive, packed
big-endian as numpy.packbits and sentence-transformers' "ubinary" pack them). What int8 or binary costs is measured
on the job's first shard (`quality_of`) and recorded in the manifest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

NEIGHBOURS = 10  # recall@10 of a quantized shard's nearest neighbours against the float32 ones
QUALITY_ROWS = 2000  # the first shard's rows the quality of a quantized type is measured on


@dataclass(frozen=True)
class Written:
    """How one task's outputs are written: `dtypes` it can write (the first is the default), `make(task, head,
    rows, dtype)` -> {column: pyarrow array}."""

    dtypes: tuple[str, ...]
    make: Callable[..., dict[str, Any]]
    describe: str  # what a row of the shard holds, for the manifest


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), np.float32(1e-12))


def as_int8(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, each row's scale): row ≈ int8 × scale."""
    scale = np.maximum(np.abs(rows).max(axis=-1), np.float32(1e-12)) / np.float32(127)
    return np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8), scale.astype(np.float32)


def as_bits(rows: np.ndarray) -> np.ndarray:
    return np.packbits(rows > 0, axis=-1)


def vector_columns(task, head, rows: np.ndarray, dtype: str) -> dict[str, Any]:
    import pyarrow as pa

    rows = rows.astype(np.float32, copy=False)
    width = rows.shape[-1]
    if dtype == "int8":
        values, scale = as_int8(rows)
        return {"embedding": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), pa.int8()), width),
                "scale": pa.array(scale, pa.float32())}
    if dtype == "binary":
        bits = as_bits(rows)
        return {"embedding": pa.array([row.tobytes() for row in bits], pa.binary(bits.shape[-1]))}
    return {"embedding": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), pa.float32()), width)}


def label_columns(task, head, rows: np.ndarray, dtype: str) -> dict[str, Any]:
    import pyarrow as pa

    scores = task.scored(rows.reshape(len(rows), -1).astype(np.float64), False).astype(np.float32)
    labels = list(head.labels) or [f"LABEL_{i}" for i in range(scores.shape[-1])]
    best = scores.argmax(axis=-1)
    return {"label": pa.array([labels[i] if i < len(labels) else f"LABEL_{i}" for i in best], pa.string()),
            "scores": pa.FixedSizeListArray.from_arrays(pa.array(scores.reshape(-1), pa.float32()),
                                                        scores.shape[-1])}


def score_columns(task, head, rows: np.ndarray, dtype: str) -> dict[str, Any]:
    import pyarrow as pa

    logits = rows.reshape(len(rows), -1)[:, 0].astype(np.float64)
    return {"score": pa.array(task.scored(logits, False).astype(np.float32), pa.float32())}


VECTORS = Written(("float32", "int8", "binary"), vector_columns,
                  "embedding: the text's vector (float32; int8 with its scale; or bits packed as numpy.packbits)")
LABELS = Written(("float32",), label_columns, "label: the most likely class; scores: every class's probability")
SCORES = Written(("float32",), score_columns, "score: the pair's relevance (the sigmoid of its logit)")


def quality_of(rows: np.ndarray, dtype: str) -> dict[str, float] | None:
    """What writing `rows` (float32 vectors) as `dtype` costs: the cosine of each vector read back against the
    float32 one (min, mean; int8), and recall@10 of each row's nearest neighbours among the rows (by cosine;
    binary: by Hamming distance) against float32's. None for float32."""
    if dtype == "float32" or len(rows) < 2:
        return None
    exact = unit(rows[:QUALITY_ROWS].astype(np.float32))
    k = min(NEIGHBOURS, len(exact) - 1)
    truth = neighbours(exact @ exact.T, k)
    if dtype == "int8":
        values, scale = as_int8(rows[:QUALITY_ROWS].astype(np.float32))
        back = unit(values.astype(np.float32) * scale[:, None])
        cosine = (back * exact).sum(axis=-1)
        found = neighbours(back @ back.T, k)
        return {"cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()),
                f"recall_at_{k}": recall(found, truth), "rows": len(exact)}
    signs = (exact > 0).astype(np.float32) * 2 - 1  # Hamming distance ranks as the dot product of ±1 vectors
    return {f"recall_at_{k}": recall(neighbours(signs @ signs.T, k), truth), "rows": len(exact)}


def neighbours(similarity: np.ndarray, k: int) -> np.ndarray:
    similarity = similarity.copy()
    np.fill_diagonal(similarity, -np.inf)
    return np.argsort(-similarity, axis=-1, kind="stable")[:, :k]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, truth)]))
