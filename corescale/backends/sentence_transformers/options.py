"""Options of the sentence-transformers backend (`backend=sentence_transformers`): none. It is the peer baseline of
embed and rerank tunes (docs/tasks.md): the measured call is what a user's code calls on the texts themselves,
`SentenceTransformer(dir).encode(texts)` or `CrossEncoder(dir).predict(pairs)`, tokenizer and head inside."""

from __future__ import annotations

from dataclasses import dataclass

from corescale.backends.options import BackendEntry, BackendOptions, CheckedSettings
from corescale.errors import UserError

LOADS = ("local", "packaged")  # model sources that are a directory sentence-transformers loads


@dataclass
class SentenceTransformersOptions(BackendOptions):
    name: str = "sentence_transformers"

    def check(self, cfg: CheckedSettings) -> None:
        if not (cfg.tokenize and cfg.workload.source):
            raise UserError("backend=sentence_transformers times encode()/predict() on text, its tokenizer inside: "
                            "give workload=builtin (or workload=FILE) and tokenize=true")

    def check_model(self, model) -> None:
        if model.source not in LOADS or not model.path:
            raise UserError(f"backend=sentence_transformers needs a model directory it can load (a Sentence-"
                            f"Transformers or cross-encoder folder, or model=all-minilm-l6-v2); model '{model.name}' "
                            f"is a {model.source}")


SENTENCE_TRANSFORMERS = BackendEntry(
    options=SentenceTransformersOptions,
    backend="corescale.backends.sentence_transformers.backend:SentenceTransformersBackend",
    extra=None, requires=("torch", "sentence_transformers"), precisions=("fp32",), openmp=True, forkable=True,
    worker_modules=("torch", "transformers", "sentence_transformers",
                    "corescale.backends.sentence_transformers.backend"),
    artifacts=(), profiler=None, libraries=("torch", "transformers", "sentence-transformers"), recorded=(),
    snippet="corescale.backends.sentence_transformers.recipe:snippet", onednn_linear=False,
    heads=("pooled", "logits"),
    peer_calls=(("embed", "sentence-transformers encode()"), ("rerank", "sentence-transformers CrossEncoder.predict()"),
                ("classify", "sentence-transformers CrossEncoder.predict()")))
