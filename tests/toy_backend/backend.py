"""The toy model: hidden = activation(embedding[input_ids] @ weight), in numpy, seeded; at precision=fp16 (the toy
precision, tests/toy_precision) the matmul computes in float16."""

from __future__ import annotations

import numpy as np

from corescale.backends.base import TimedStages
from corescale.errors import UserError

ACTIVATION = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


class ToyBackend(TimedStages):
    name = "toy"

    def load(self, spec, cfg, threads: int, inputs) -> None:
        if cfg.backend.refuse != "no":
            raise UserError(f"the toy backend refuses to load: {cfg.backend.refuse}")
        with self.stage("build"):
            rng = np.random.default_rng(cfg.seed)
            hidden, vocab = spec.hidden, int(spec.config.get("vocab_size", 1024))
            self.embedding = rng.standard_normal((vocab, hidden)).astype(np.float32)
            self.weight = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
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
