"""`corescale explain`'s worker: one pinned process that loads a backend exactly as a benchmark instance does,
warms up, then alternates rounds of measured calls (nothing attached) and profiled calls (explain/profilers.py),
so drift on a busy machine falls on both alike. Writes one JSON file: the measured latencies and each profiled
call's ops. Run as `python -m corescale.explain.worker JOB.json OUT.json`; these calls are profiling
runs, never timing results.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig
    from corescale.measure.protocol import Job

ROUNDS = 3


def run(job: Job, out: Path) -> dict:
    from corescale.backends import create_backend, framework_report
    from corescale.explain import profilers
    from corescale.measure.timing import warm_up
    from corescale.workload.inputs import make_inputs

    cfg, spec, model = job.config, job.instance, job.model
    os.sched_setaffinity(0, list(spec.cpus))  # before any framework creates its thread pool
    inputs = make_inputs(model, spec.batch_size, cfg.sequence_length, cfg.seed, cfg.padding_fraction)
    backend = create_backend(cfg.backend.name)
    backend.load(model, cfg, spec.threads, inputs)
    prepared = backend.prepare(inputs)

    def call():
        return backend.forward(prepared)

    warm = warm_up(call, cfg.warmup)
    profiler = profilers.open_profiler(cfg.backend.name, backend, prepared, out.parent)
    per_round = max(2, -(-cfg.min_iterations // ROUNDS))
    budget_s = cfg.duration / (2 * ROUNDS)
    latencies = []
    for _ in range(ROUNDS):
        began, done = time.perf_counter(), 0
        while done < per_round or time.perf_counter() - began < budget_s:
            start = time.perf_counter_ns()
            call()
            latencies.append((time.perf_counter_ns() - start) / 1e3)
            done += 1
        for _ in range(done):
            profiler.call()
    calls = profiler.finish()
    rates = linear_remedy(cfg, model, spec.batch_size)
    return {"latencies_us": latencies, "calls": calls, "linear_rates": rates,
            "profiler": profilers.check_profiler(cfg.backend.name).name, "framework": framework_report(backend),
            "stage_seconds": dict(backend.timings), "warmup_iterations": len(warm.durations_ns),
            "warmup_converged": warm.converged}


def linear_remedy(cfg: BenchmarkConfig, model, batch_size: int) -> dict | None:
    """A backend whose linears can run as torch's prepacked oneDNN linear (its entry's onednn_linear), at a
    precision backend.linear=onednn holds for: the model's linear shapes through torch's default linear and through
    that linear (backend.linear=onednn), measured here, after the profile: the evidence for or against it."""
    from corescale.backends import onednn_linear_at

    if not onednn_linear_at(cfg.backend.name, cfg.precision):
        return None
    from corescale.machine import onednn

    if not onednn.available():
        return None
    d, f = model.hidden, model.intermediate
    shapes = [(d, d, 4 * model.layers), (d, f, model.layers), (f, d, model.layers)]
    return onednn.linear_rates(batch_size * cfg.sequence_length, shapes, repeats=2)


def main(argv: list[str]) -> int:
    from corescale.measure import protocol
    from corescale.record.files import write_json_atomic

    out = Path(argv[1])
    message: protocol.Profiled | protocol.WorkerFailure
    try:
        message = protocol.Profiled(run(protocol.Job.read(argv[0]), out))
    except BaseException as exc:  # the parent reports it
        message = protocol.WorkerFailure.of(exc)
    write_json_atomic(out, json.loads(protocol.encode(message)))
    return 0 if isinstance(message, protocol.Profiled) else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
