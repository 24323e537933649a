"""`corescale demo [words]` (what `make run` runs): the tune of the default model on this machine, then the
HTML report: the trained all-MiniLM-L6-v2 sentence embedder on the built-in real text (256 texts, up to 128 tokens),
the tokenizer inside every timed call, batch 1, objective throughput over PyTorch, ONNX Runtime and OpenVINO (every
precision and layout this CPU offers), each configuration gated on its embeddings' quality against fp32 PyTorch
(min_quality: cosine p1 >= 0.99, recall@10 >= 0.95), beside out-of-box PyTorch and the peer baseline
(sentence-transformers' own encode(), tune/peer.py), within a 5-minute budget (baselines, search and final repeats).
Any `corescale tune` word overrides a default (model=bert-base task=encode, budget=10m,
space.backend=[...], objective=latency ...); the seed study's bert-base is `corescale study instances`."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.overrides import override_key

ORDER = 5
# key -> the word used when the user gives none of `keys`
DEFAULTS = [
    (("model",), "model=all-minilm-l6-v2"), (("workload", "workload.source"), "workload=builtin"),
    (("tokenize",), "tokenize=true"), (("workload.samples",), "workload.samples=256"),
    (("sequence_length",), "sequence_length=128"),
    (("batch_size", "space.batch_size"), "batch_size=1"), (("duration",), "duration=3"),
    (("tune.screen",), "tune.screen=1"), (("budget",), "budget=5m"),
    (("backend", "space.backend"), "space.backend=[pytorch,onnxruntime,openvino]"),
]


def register(sub) -> None:
    parser = sub.add_parser("demo", help="tune the default model on this machine (a few minutes) and write the "
                                         "HTML report")
    add_common(parser)
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("overrides", nargs="*", help="any corescale tune word, e.g. model=bert-tiny budget=10m")
    parser.set_defaults(handler=handle)


def demo_words(words: list[str]) -> list[str]:
    """The demo's defaults, less those the user set, then the user's words."""
    given = {override_key(w) for w in words}
    return [word for keys, word in DEFAULTS if not given & set(keys)] + list(words)


def handle(args) -> int:
    from corescale.commands.tune import run_tune

    return run_tune(demo_words(args.overrides), args)
