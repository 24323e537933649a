"""The toy model: hidden = activation(embedding[input_ids] @ weight), in numpy, seeded; at precision=fp16 (the toy
precision, tests/toy_precision) the matmul computes in float16."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from corescale.backends.base import TimedStages
from corescale.errors import UserError
from toy_backend.artifact import FILE, cache_root

ACTIVATION = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


class ToyBackend(TimedStages):
    name = "toy"

    def load(self, spec, cfg, threads: int, inputs) -> None:
        if cfg.backend.refuse != "no":
            raise UserError(f"the toy backend refuses to load: {cfg.backend.refuse}")
        if cfg.backend.weights not in ("memory", "file"):
            raise UserError(f"backend.weights is memory or file (got {cfg.backend.weights})")
        hidden, vocab = spec.hidden, int(spec.config.get("vocab_size", 1024))
        with self.stage("build"):
            if cfg.backend.weights == "file":
                self.model_path = cache_root(cfg) / f"{cfg.seed}-{vocab}-{hidden}" / FILE
                if not self.model_path.is_file():
                    save(self.model_path, *weights(cfg.seed, vocab, hidden))
                with np.load(self.model_path) as saved:
                    self.embedding, self.weight = saved["embedding"], saved["weight"]
            else:
                self.embedding, self.weight = weights(cfg.seed, vocab, hidden)
            self.activation, self.threads = ACTIVATION[cfg.backend.activation], threads
            self.dtype = np.float16 if cfg.precision == "fp16" else np.float32

    def prepare(self, inputs):
        return np.asarray(inputs["input_ids"])

    def forward(self, ids):
        hidden = self.embedding[ids].astype(self.dtype) @ self.weight.astype(self.dtype)
        return self.activation(hidden.astype(np.float32))

    def to_numpy(self, output) -> np.ndarray:
        return np.asarray(output, dtype=np.float32)

    def info(self) -> dict:
        return {"framework": "numpy", "version": np.__version__, "threads": self.threads}


def weights(seed: int, vocab: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((vocab, hidden)).astype(np.float32)
    return embedding, (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)


def save(path: Path, embedding: np.ndarray, weight: np.ndarray) -> None:
    """Written whole (a private temporary file renamed into place): instances that build it together agree."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.npz")
    np.savez(tmp, embedding=embedding, weight=weight)
    os.replace(tmp, path)
