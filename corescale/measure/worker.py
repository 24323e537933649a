"""One instance: pinned process that loads a backend, warms up, waits for the common start, and measures.

Run as `python -m corescale.measure.worker SPEC.json` by the launcher. Protocol with the parent:
- control lines (JSON) go to the original stdout; library noise is sent to stderr;
- the parent writes `start <perf_counter_ns>` (or `abort`) on stdin once every instance is ready.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback

# No framework imports at module level: affinity and threads are set before any framework loads.


class Control:
    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # frameworks that print to stdout must not corrupt the control channel

    def send(self, event: str, **fields) -> None:
        self.out.write(json.dumps({"event": event, **fields}, default=str) + "\n")

    def wait_start(self) -> int | None:
        line = sys.stdin.readline().split()
        return int(line[1]) if line and line[0] == "start" else None


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_instance(job: dict, control: Control) -> None:
    from corescale.config import BenchmarkConfig
    from corescale.machine import environment, instance_env
    from corescale.machine.placement import InstanceSpec
    from corescale.measure import contamination
    from corescale.workload.models import ModelSpec

    cfg = BenchmarkConfig.from_dict(job["config"])
    spec = InstanceSpec.from_json(job["instance"])
    cpus = list(spec.cpus)
    os.sched_setaffinity(0, cpus)  # before any framework creates its thread pool
    threads = spec.threads
    model = ModelSpec(**job["model"])

    from corescale.backends import create_backend
    from corescale.measure.timing import timed_loop, warm_up
    from corescale.workload.inputs import make_inputs

    # a sweep passes the SGEMM rate it already calibrated on the same CPUs and thread count
    peak = (spec.sgemm_gflops or environment.sgemm_gflops(threads)) if cfg.calibrate else None
    inputs = make_inputs(model, spec.batch_size, cfg.sequence_length, cfg.seed, cfg.padding_fraction)
    backend = create_backend(cfg.backend.name)
    load_start = time.perf_counter()
    backend.load(model, cfg, threads, inputs)
    load_seconds = time.perf_counter() - load_start
    instance_env.verify_mapped(cfg, environment.mapped_libraries(), spec.id)  # asked for = really in
    prepared = backend.prepare(inputs)

    def call():
        return backend.forward(prepared)

    control.send("loaded", load_seconds=load_seconds)
    warm = warm_up(call, cfg.warmup, progress=lambda n: control.send("warmup", done=n))
    control.send("ready", warmup_iterations=len(warm.durations_ns), converged=warm.converged)
    start_ns = control.wait_start()
    if start_ns is None:
        return
    cpu_before = process_cpu_seconds()
    stat_before = contamination.read_cpu_times(cpus)
    samples = timed_loop(call, start_ns, cfg.duration, cfg.min_iterations,
                         progress=lambda n: control.send("progress", done=n))
    stat_after = contamination.read_cpu_times(cpus)
    own_cpu = process_cpu_seconds() - cpu_before
    import numpy as np

    np.savez(spec.samples_path, starts_ns=samples.starts_ns, ends_ns=samples.ends_ns,
             warmup_ns=np.asarray(warm.durations_ns, dtype=np.int64))
    wall = (samples.ends_ns[-1] - start_ns) / 1e9
    threads_cpus = instance_env.thread_affinities()
    output = backend.to_numpy(call())
    drift = None
    if cfg.reference:
        from corescale.measure.drift import compare_with_reference

        drift = compare_with_reference(cfg, model, threads, inputs, output)
    control.send(
        "result",
        instance=spec.id,
        load_seconds=load_seconds,
        stage_seconds=dict(backend.timings),
        warmup_iterations=len(warm.durations_ns),
        warmup_converged=warm.converged,
        cpu_seconds=own_cpu,
        wall_seconds=wall,
        foreign_cpu_seconds=contamination.foreign_seconds(stat_before, stat_after, own_cpu),
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        sgemm_gflops=peak,
        affinity=sorted(set().union(*threads_cpus.values())),  # every CPU any of its threads may use
        thread_affinity={str(tid): cpus for tid, cpus in threads_cpus.items()},
        framework=backend.info(),
        mapped_libraries=environment.mapped_libraries(),
        thread_count=environment.os_thread_count(),
        output_shape=list(output.shape),
        output_checksum=float(np.abs(output).astype(np.float64).sum()),
        drift=drift,
    )


def main(argv: list[str]) -> int:
    control = Control()
    with open(argv[0]) as handle:
        job = json.load(handle)
    try:
        run_instance(job, control)
    except BaseException as exc:  # report everything to the parent, which decides what to show
        from corescale.errors import UserError

        control.send("error", user_error=isinstance(exc, UserError), message=str(exc) or type(exc).__name__,
                     traceback=traceback.format_exc())
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
