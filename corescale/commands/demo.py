"""`corescale demo [words]` (what `make run` runs): the tune of the default model on this machine, then the
HTML report: bert-base, sequence 128, batch 1, objective throughput over PyTorch, ONNX Runtime and OpenVINO
(every precision and layout this CPU offers), within a 5-minute budget (baseline, search and final repeats).
Any `corescale tune` word overrides a default (model=bert-tiny, budget=10m, space.backend=[...], objective=latency
...)."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.overrides import override_key

ORDER = 5
# key -> the word used when the user gives none of `keys`
DEFAULTS = [
    (("model",), "model=bert-base"), (("sequence_length",), "sequence_length=128"),
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
