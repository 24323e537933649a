"""Harness overhead: corescale's timed loop vs a bare hand loop around model(**inputs), same process.

    python benchmarks/harness_overhead.py                       # bert-base, bs 1, seq 128, 2 threads
    python benchmarks/harness_overhead.py --model bert-tiny --rounds 4 --seconds 2

Blocks alternate in ABBA order (bare, corescale, corescale, bare, ...) so drift on a shared machine hits both
alike. Prints the ratio of medians with a bootstrap 95 % interval (goal <= 1.01).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from corescale.backends import create_backend
from corescale.config import BenchmarkConfig, WarmupConfig
from corescale.measure.timing import timed_loop, warm_up
from corescale.record.stats import Measurement, bootstrap_ratio_ci
from corescale.workload.inputs import make_inputs
from corescale.workload.models import build_torch_model, resolve_model


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
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0, help="per block")
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

    def run_harness():
        harness.extend(timed_loop(lambda: backend.forward(prepared), time.perf_counter_ns(), args.seconds,
                                  1).durations_ns.tolist())

    def run_bare():
        bare.extend(bare_loop(bare_model, bare_inputs, args.seconds))

    for round_ in range(args.rounds):
        for block in ((run_bare, run_harness) if round_ % 2 == 0 else (run_harness, run_bare)):
            block()
    b, h = Measurement.from_ns(bare), Measurement.from_ns(harness)
    ratio, low, high = bootstrap_ratio_ci(b.samples, h.samples)
    print(f"model {args.model} bs {args.batch_size} seq {args.sequence_length} threads {args.threads}")
    print(f"bare loop : {b}")
    print(f"corescale : {h}")
    verdict = "PASS" if ratio <= 1.01 else ("within noise" if low <= 1.01 else "FAIL")
    print(f"ratio of medians corescale / bare = {ratio:.4f}, 95 % CI [{low:.4f}, {high:.4f}] (goal <= 1.01) "
          f"-> {verdict}")
    print(f"mean ratio {h.mean / b.mean:.4f}; per-block medians bare {np.median(bare) / 1e6:.2f} ms")


if __name__ == "__main__":
    main()
