"""`corescale demo [words]` (what `make run` runs): the tune of the default model's service on this machine, then
the HTML report: the trained all-MiniLM-L6-v2 sentence embedder served under a p99 SLO of 100 ms to queries of the
built-in real text (256 texts at their own lengths, up to 128 tokens), objective server_qps (the highest Poisson
arrival rate whose p99 meets the SLO) over PyTorch, ONNX Runtime and OpenVINO (every precision and layout this CPU
offers) and the dynamic batcher's knobs (max batch, queue delay, token budget, padding), each configuration gated
on its embeddings' quality against fp32 PyTorch (min_quality: cosine p1 >= 0.99, recall@10 >= 0.95), beside
out-of-box PyTorch served the same way, within a 5-minute budget (baseline, search and final repeats); the bundle
it writes is that service (`corescale serve DIR`). Any `corescale tune` word overrides a default (model=bert-base,
budget=10m, space.backend=[...], slo_p99_ms=50, tune.priors=none: start as on a CPU no prior holds for ...);
`objective=throughput` tunes the offline closed loop at batch 1 with the tokenizer timed instead, beside
sentence-transformers' own encode() (tune/peer.py). The seed study's bert-base is `corescale study instances`."""

from __future__ import annotations

from corescale.commands import add_common
from corescale.overrides import override_key

ORDER = 5
# key -> the word used when the user gives none of `keys`
DEFAULTS = [
    (("model",), "model=all-minilm-l6-v2"), (("workload", "workload.source"), "workload=builtin"),
    (("workload.samples",), "workload.samples=256"), (("sequence_length",), "sequence_length=128"),
    (("tune.screen",), "tune.screen=1"), (("budget",), "budget=5m"),
    (("backend", "space.backend"), "space.backend=[pytorch,onnxruntime,openvino]"),
]
# the service (the default objective): its SLO; each QPS search at LoadGen's fewest queries that judge a p99, to
# 10 % in at most 6 LoadGen tests (the final repeats, not one long search, give the interval: the default 5 % in
# up to 12 tests took minutes for out-of-box PyTorch alone on a shared 2-core machine), two finalists twice each:
# a 5-minute budget then screens more than the baseline and the final stage cost
SERVICE = [(("slo_p99_ms",), "slo_p99_ms=100"), (("duration",), "duration=2"),
           (("server.min_query_count",), "server.min_query_count=459"),
           (("server.search_precision",), "server.search_precision=0.1"), (("server.max_steps",), "server.max_steps=6"),
           (("tune.top_k",), "tune.top_k=2"), (("tune.repeats",), "tune.repeats=2")]
# objective=throughput (or latency, cost): the offline closed loop at batch 1, the tokenizer inside every call
OFFLINE = [(("tokenize",), "tokenize=true"), (("batch_size", "space.batch_size"), "batch_size=1"),
           (("duration",), "duration=3")]


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
    objective = next((w.split("=", 1)[1] for w in words if override_key(w) == "objective" and "=" in w), None)
    served = objective == "server_qps" or (objective is None and not given & {"scenario", "tokenize"})
    defaults = DEFAULTS + (SERVICE if served else OFFLINE)
    return [word for keys, word in defaults if not given & set(keys)] + list(words)


def handle(args) -> int:
    from corescale.commands.tune import run_tune

    return run_tune(demo_words(args.overrides), args)
