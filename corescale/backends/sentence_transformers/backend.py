"""The sentence-transformers peer: the call a user's code makes, timed whole (tokenizer, model, head).

- embed: `SentenceTransformer(dir, device="cpu").encode(texts, batch_size=B, normalize_embeddings=...)`
- rerank / classify: `CrossEncoder(dir, device="cpu").predict(pairs, batch_size=B)` (one label: its default
  sigmoid, a monotone map of the logit, so the rank metrics judge it as the reference's logits)

Its truncation is set to corescale's `sequence_length`, so both sides see the same tokens. Token ids (the
closing output check) run through the same modules without the tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from corescale.backends.base import TimedStages
from corescale.backends.pytorch.backend import set_torch_threads

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


class SentenceTransformersBackend(TimedStages):
    name = "sentence_transformers"
    takes_text = True  # the closed loop and the quality check hand it the texts, not token ids

    def load(self, spec, cfg: BenchmarkConfig, threads, inputs) -> None:
        set_torch_threads(threads, cfg.interop_threads)
        self.batch, self.head = cfg.batch_size, spec.head
        self.pooled = spec.head.entry.head == "pooled"  # an embedder; else a cross-encoder's logits
        with self.stage("build_model"):
            if self.pooled:
                from sentence_transformers import SentenceTransformer

                self.embedder = SentenceTransformer(spec.path, device="cpu")
                self.embedder.max_seq_length = cfg.sequence_length
                self.model = self.embedder
            else:
                from sentence_transformers import CrossEncoder

                self.ranker = CrossEncoder(spec.path, device="cpu", max_length=cfg.sequence_length)
                self.model = self.ranker.model
        self.model.eval()

    def prepare(self, inputs):
        if isinstance(inputs, list):  # texts or (query, document) pairs: the call tokenizes them
            return inputs
        return {name: torch.from_numpy(array) for name, array in inputs.items()}

    def forward(self, prepared):
        if isinstance(prepared, list):
            if self.pooled:
                return self.embedder.encode(prepared, batch_size=self.batch, show_progress_bar=False,
                                            normalize_embeddings=self.head.normalize)
            return self.ranker.predict(prepared, batch_size=self.batch, show_progress_bar=False)
        with torch.inference_mode():
            if self.pooled:
                vector = self.embedder(prepared)["sentence_embedding"]
                return torch.nn.functional.normalize(vector, dim=1) if self.head.normalize else vector
            return self.ranker.activation_fn(self.model(**prepared).logits)

    def to_numpy(self, output) -> np.ndarray:
        found = output.float().numpy() if isinstance(output, torch.Tensor) else np.asarray(output, dtype=np.float32)
        return found.reshape(len(found), -1)

    def info(self) -> dict:
        import sentence_transformers

        return {"framework": "sentence-transformers", "version": sentence_transformers.__version__,
                "torch": torch.__version__, "num_threads": torch.get_num_threads(),
                "num_interop_threads": torch.get_num_interop_threads(),
                "call": "SentenceTransformer.encode" if self.pooled else "CrossEncoder.predict"}
