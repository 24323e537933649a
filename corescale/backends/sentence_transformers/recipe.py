"""The deployment snippet of the sentence-transformers peer: the out-of-box call it measured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corescale.workload.tasks import TASKS

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def snippet(cfg: BenchmarkConfig, threads: int, model: str) -> str:
    embed = cfg.task is None or TASKS[cfg.task].head == "pooled"  # SentenceTransformer, else CrossEncoder
    load = ("from sentence_transformers import SentenceTransformer", 'model = SentenceTransformer(MODEL_DIR, '
            'device="cpu")', f"vectors = model.encode(TEXTS, batch_size={cfg.batch_size})") if embed else (
        "from sentence_transformers import CrossEncoder", 'model = CrossEncoder(MODEL_DIR, device="cpu")',
        f"scores = model.predict(PAIRS, batch_size={cfg.batch_size})")
    lines = ["import torch", load[0], "", model.rstrip(), f"torch.set_num_threads({threads})", load[1], load[2]]
    return "\n".join(lines) + "\n"
