"""Harness overhead: corescale's timed loop vs a bare hand loop around model(**inputs), same process.

    python benchmarks/harness_overhead.py                       # bert-base, bs 1, seq 128, 2 threads
    python benchmarks/harness_overhead.py --model bert-tiny --rounds 4 --seconds 2

Blocks alternate (bare, corescale, bare, corescale, ...) so drift on a shared machine hits both alike.
Prints the ratio of medians (goal <= 1.01).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from corescale.backends import create_backend
from corescale.config import BenchmarkConfig, WarmupConfig
from corescale.inputs import make_inputs
from corescale.models import build_torch_model, resolve_model
from corescale.stats import Measurement
from corescale.timing import timed_loop, warm_up


def bare_loop(model, inputs, seconds: float) -> list[int]:
    durations = []
    deadline = time.perf_counter() + seconds
    with torch.inference_mode():
        while time.perf_counter() < deadline:
            start = time.perf_counter_ns()
            model(**inputs)
            durations.append(time.perf_counter_ns() - start)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=len(__import__("os").sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="per block")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    spec = resolve_model(args.model)
    cfg = BenchmarkConfig(model=args.model, batch_size=args.batch_size, sequence_length=args.sequence_length,
                          threads=args.threads)
    inputs = make_inputs(spec, args.batch_size, args.sequence_length, seed=0)
    backend = create_backend("pytorch")
    backend.load(spec, cfg, args.threads, inputs)
    prepared = backend.prepare(inputs)
    bare_model = build_torch_model(spec, seed=0)
    bare_inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}

    warm_up(lambda: backend.forward(prepared), WarmupConfig())
    bare_loop(bare_model, bare_inputs, 2.0)
    bare, harness = [], []
    for _ in range(args.rounds):
        bare += bare_loop(bare_model, bare_inputs, args.seconds)
        samples = timed_loop(lambda: backend.forward(prepared), time.perf_counter_ns(), args.seconds, 1)
        harness += samples.durations_ns.tolist()
    b, h = Measurement.from_ns(bare), Measurement.from_ns(harness)
    ratio = h.median / b.median
    print(f"model {args.model} bs {args.batch_size} seq {args.sequence_length} threads {args.threads}")
    print(f"bare loop : {b}")
    print(f"corescale : {h}")
    print(f"ratio of medians corescale / bare = {ratio:.4f} (goal <= 1.01) -> {'PASS' if ratio <= 1.01 else 'FAIL'}")
    print(f"mean ratio {h.mean / b.mean:.4f}; per-block medians bare {np.median(bare) / 1e6:.2f} ms")


if __name__ == "__main__":
    main()
