"""Before a trial's instances start: the machine's GEMM peak on each instance's CPUs (machine/peak.py), from the
cache or measured in fresh processes pinned and configured exactly like the instances, all at once (as the
instances will run), so no framework or BLAS thread pool of the calibration lingers in a measured process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.machine import instance_env
from corescale.machine.lock import machine_lock
from corescale.machine.peak import PeakCache, peak_precision
from corescale.machine.placement import InstanceSpec
from corescale.measure.contamination import CONTAMINATION_THRESHOLD, foreign_fraction, foreign_seconds, read_cpu_times
from corescale.record.files import write_json_atomic

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

TIMEOUT_S = 180.0
BANDWIDTH = "bandwidth"  # the calibration process's word for "measure the triad, not a GEMM"


def with_peaks(specs: list[InstanceSpec], cfg: BenchmarkConfig, isa: dict, work_dir: Path, cache: PeakCache,
               force: bool = False,
               libraries: tuple[str, ...] = (), precision: str | None = None) -> list[InstanceSpec]:
    """The specs with their peak entries; measures (and caches) those the cache does not hold (all: force)."""
    precision = precision or peak_precision(cfg.precision, isa)
    cached = {spec.id: None if force else cache.get(spec.cpus, spec.threads, precision) for spec in specs}
    known = {i: entry for i, entry in cached.items() if entry is not None}
    todo = [spec for spec in specs if spec.id not in known]
    for spec, entry in zip(todo, _run_calibrations(todo, cfg, precision, work_dir, libraries)):
        store(cache, spec, entry)
        known[spec.id] = {**entry, "cached": False}
    bandwidth = with_bandwidth(specs, cfg, work_dir, cache, force)
    return [dataclasses.replace(spec, peak={"cached": True, **known[spec.id], "bandwidth": bandwidth[spec.id]})
            for spec in specs]


def with_bandwidth(specs: list[InstanceSpec], cfg: BenchmarkConfig, work_dir: Path, cache: PeakCache,
                   force: bool = False) -> dict:
    """The memory roof of each instance (machine/bandwidth.py), measured all at once like the instances run (they
    share the memory bus); from the cache where it holds them. A failed measurement is None, never cached."""
    known = {spec.id: None if force else cache.get_bandwidth(spec.cpus, spec.threads) for spec in specs}
    todo = [spec for spec in specs if known[spec.id] is None]
    for spec, entry in zip(todo, _run_calibrations(todo, cfg, BANDWIDTH, work_dir, ())):
        if not entry.get("gbps"):
            continue
        if not disturbed(entry):  # a disturbed one serves this run only
            cache.root.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache.bandwidth_path(spec.cpus, spec.threads), entry)
        known[spec.id] = {**entry, "cached": False}
    return {i: None if entry is None else {"cached": True, **entry} for i, entry in known.items()}


def store(cache: PeakCache, spec: InstanceSpec, entry: dict) -> None:
    """Caches a measured peak, written whole; a failed or disturbed calibration is never cached."""
    if not entry.get("gflops") or disturbed(entry):
        return
    cache.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cache.path(spec.cpus, spec.threads, entry["precision"]), entry)


def disturbed(entry: dict) -> str | None:
    """Why a measured entry must not be cached: other processes used its CPUs meanwhile (what is measured then is
    not the machine's peak, and the cache would hand it to every later run); None when it ran alone."""
    foreign = entry.get("foreign_load")
    if isinstance(foreign, (int, float)) and foreign > CONTAMINATION_THRESHOLD:
        return f"other processes used {foreign:.0%} of its CPUs while it was measured"
    return None


def measured_alone(measure) -> dict:
    """measure()'s entry, with the share of this process's CPUs that other processes used meanwhile."""
    import resource
    import time

    cpus = sorted(os.sched_getaffinity(0))

    def own() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    before, own_before, started = read_cpu_times(cpus), own(), time.monotonic()
    entry = measure()
    foreign = foreign_seconds(before, read_cpu_times(cpus), own() - own_before, cpus)
    return {**entry, "foreign_load": foreign_fraction(foreign, time.monotonic() - started, len(cpus))}


def _run_calibrations(specs: list[InstanceSpec], cfg: BenchmarkConfig, precision: str, work_dir: Path,
                      libraries: tuple[str, ...]) -> list[dict]:
    if not specs:
        return []
    preload = instance_env.preload_paths(cfg)
    with machine_lock():  # no other process measures meanwhile (held already inside a trial)
        running: list[tuple[subprocess.Popen, Path]] = []
        try:
            for spec in specs:
                out = work_dir / f"peak-{precision}-{spec.id}.json"
                process = instance_env.spawn(instance_env.Launch.of(cfg, spec, preload),
                                             "corescale.measure.calibrate", str(spec.threads), precision, str(out),
                                             ",".join(libraries), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                running.append((process, out))
            outputs = [(process, out, _finish(process)) for process, out in running]
        except BaseException:  # interrupted: none outlives it
            for process, _ in running:
                instance_env.kill(process)
            raise
    entries = []
    for process, out, err in outputs:
        try:
            entries.append(json.loads(out.read_text()))
        except (OSError, ValueError):
            tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"exit {process.returncode}"]
            entries.append({"precision": precision, "gflops": None, "library": None, "libraries": {},
                            "errors": {"calibration": tail[0][:300]}})
    return entries


def _finish(process: subprocess.Popen) -> bytes:
    """Its stderr once it has ended (killed after TIMEOUT_S)."""
    try:
        return process.communicate(timeout=TIMEOUT_S)[1]
    except subprocess.TimeoutExpired:
        instance_env.kill(process)
        return process.communicate()[1]


def main(argv: list[str]) -> int:
    """`python -m corescale.measure.calibrate THREADS PRECISION|bandwidth OUT.json [LIBRARIES]`: measure here (this
    process is pinned and configured like the instance it stands for), write the entry whole."""
    from corescale.machine.peak import gemm_peak

    threads, precision, out = int(argv[0]), argv[1], Path(argv[2])
    if precision == BANDWIDTH:
        from corescale.machine.bandwidth import triad

        write_json_atomic(out, measured_alone(lambda: triad(threads)))
        return 0
    libraries = tuple(name for name in (argv[3] if len(argv) > 3 else "").split(",") if name) or None
    write_json_atomic(out, measured_alone(lambda: gemm_peak(threads, precision, libraries)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
