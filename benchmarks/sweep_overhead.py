"""Sweep overhead (P4): wall time of an 8-trial bert-tiny sweep ÷ the sum of its measurement windows, for a
PyTorch sweep and for an ONNX Runtime sweep (goal for the latter: ≤ 1.15 on 2 cores).

    python benchmarks/sweep_overhead.py [--duration 10] [--no-calibrate] [--fresh] [--backend NAME] [--output DIR]

--fresh starts every worker as a new interpreter (CORESCALE_FORKSERVER=0) instead of forking it from a
pre-imported server, to show what the fork servers save. --backend runs one sweep only.

Runs each sweep in this process through corescale.trials.sweep.run_sweep (exactly what `corescale run -m` does),
times every worker event, and prints where the time went: CLI start, sweep planning, per-trial process start +
imports (+ calibration), model load, warm-up, start barrier, window, tail, stop + aggregate, and the
write/bookkeeping between trials. Per trial, also what its workers imported (each instance report's `imports`:
the worker's own import time, the time its fork server took once, the frameworks held after load).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from corescale.measure.launcher import START_DELAY_NS

START_DELAY_S = START_DELAY_NS / 1e9  # the launcher's own constant, not a copy
GRID = ["model=bert-tiny", "batch_size=1,2", "sequence_length=32,64", "instances=1,2"]
BACKENDS = ("pytorch", "onnxruntime")
GOAL = 1.15


def cli_start_seconds() -> float:
    """What `corescale ...` costs before a sweep starts: interpreter, imports, argument parsing."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "corescale.cli", "--help"], check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window per trial (s)")
    parser.add_argument("--no-calibrate", action="store_true", help="skip peak calibration (calibrate=false)")
    parser.add_argument("--fresh", action="store_true", help="no fork servers: every worker starts fresh")
    parser.add_argument("--backend", choices=BACKENDS, help="one sweep only (default: one per backend)")
    parser.add_argument("--output", help="results root (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.fresh:
        os.environ["CORESCALE_FORKSERVER"] = "0"
    out = Path(args.output or tempfile.mkdtemp(prefix="corescale-overhead-"))
    cli = cli_start_seconds()
    ratios, code = {}, 0
    for backend in [args.backend] if args.backend else BACKENDS:
        ratio, failed = sweep(backend, args, out / backend, cli)
        ratios[backend], code = ratio, code or failed
    print()
    for backend, ratio in ratios.items():
        goal = f" (goal <= {GOAL}: {'met' if ratio <= GOAL else 'not met'})" if backend == "onnxruntime" else ""
        print(f"P4 {backend:<12} = {ratio:.2f}{goal}")
    return code


def sweep(backend: str, args, out: Path, cli: float) -> tuple[float, int]:
    """One sweep over GRID on `backend`; prints its stages and returns (P4, 1 if a trial failed)."""
    from corescale.analysis import store
    from corescale.overrides import expand_sweep
    from corescale.record.files import read_result
    from corescale.trials.local import Listener
    from corescale.trials.sweep import plan_sweep, run_sweep

    overrides = [*GRID, f"backend={backend}", f"duration={args.duration:g}", f"output_dir={out}",
                 f"calibrate={'false' if args.no_calibrate else 'true'}"]
    events: dict[int, dict[str, float]] = defaultdict(dict)  # trial -> last time of each event kind

    class Timer(Listener):
        def worker_event(self, item, instance, event) -> None:
            events[item.number][event["event"]] = time.time()

    began = time.time()
    state = run_sweep(plan_sweep(expand_sweep(overrides)), Timer(), resume=False)
    wall = time.time() - began
    frame = store.load(out, latest=False).frame.sort_values("finished_at", ignore_index=True)
    records = {row["run"]: read_result(row["path"]).to_json() for _, row in frame.iterrows()}

    stages = defaultdict(float)
    print(f"\n{backend} sweep\n{'trial':<14} {'start+imp':>9} {'imports':>7} {'server':>6} {'load':>6} {'warmup':>7} "
          f"{'window':>7} {'tail':>6} {'stop':>6} {'peak':>8}  frameworks")
    for number, (_, row) in enumerate(frame.iterrows(), 1):
        print(trial_row(row, records[row["run"]], events[number], stages, args.no_calibrate))
    first = records[frame["run"].iloc[0]]
    first_start = first["finished_at"] - first["elapsed_s"]
    trial_time = sum(r["elapsed_s"] for r in records.values())
    waited = sum(r.get("lock_wait_s", 0.0) for r in records.values())
    planning = first_start - began - first.get("lock_wait_s", 0.0)
    stages["sweep planning (compose + checks + environment, once)"] = planning
    stages["write results + bookkeeping between trials"] = wall - trial_time - planning - waited
    stages["CLI start (python + imports, measured apart)"] = cli
    total = wall + cli - waited  # time spent on other processes' trials is not this sweep's overhead
    windows = stages["measurement windows"]
    print(f"\n{len(frame)} trials, duration={args.duration:g} s each, calibrate={not args.no_calibrate}; "
          f"results in {out}\n")
    for name, value in sorted(stages.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<58} {value:8.2f} s  {value / total:6.1%}")
    print(f"  {'total (CLI start + sweep wall)':<58} {total:8.2f} s")
    if waited:
        print(f"  (not counted: {waited:.2f} s waiting for other processes' trials on this machine, machine lock)")
    ratio = total / windows if windows else float("inf")
    instances = [i for r in records.values() for i in r.get("instance_reports") or []]
    forked = sum(1 for i in instances if (i.get("launch") or {}).get("forked_from"))
    print(f"\nworkers forked from a server: {forked} of {len(instances)}")
    print(f"{backend} sweep overhead (P4) = wall / sum of windows = {total:.1f} / {windows:.1f} = {ratio:.2f}")
    return ratio, 1 if state.failed else 0


def trial_row(row, record: dict, seen: dict[str, float], stages: dict[str, float], no_calibrate: bool) -> str:
    """One trial's line; its stages are added to `stages`."""
    t0 = record["finished_at"] - record["elapsed_s"]
    load = (record.get("metrics") or {}).get("load_seconds", 0.0)
    window = row["window_s"] or 0.0
    start_imports = seen["loaded"] - t0 - load
    warmup = seen["started"] - seen["loaded"]
    tail = seen["result"] - (seen["started"] + START_DELAY_S + window)
    stop = record["finished_at"] - seen["result"]
    for name, value in (("process start or fork + imports (+ peak calibration)", start_imports),
                        ("model load (export or cached artifact, session/compile)", load),
                        ("warm-up (+ waiting for the slowest instance)", warmup),
                        ("start barrier delay (fixed part; its two calls are in the tail)", START_DELAY_S),
                        ("measurement windows", window),
                        ("tail: last call past the window, output check", tail),
                        ("stop processes + aggregate", stop)):
        stages[name] += value
    imported = [inst.get("imports") or {} for inst in record.get("instance_reports") or []]
    own, server = (max((sum((i.get(key) or {}).values()) for i in imported), default=0.0)
                   for key in ("seconds", "fork_server_seconds"))  # the worker's imports; its fork server's, once
    frameworks = sorted({f for i in imported for f in i.get("frameworks") or []})
    peaks = [(spec.get("peak") or {}).get("cached") for spec in record.get("specs") or []]
    peak = "off" if no_calibrate else ("cached" if peaks and all(peaks) else "measured")
    label = f"b{row['batch_size']} s{row['sequence_length']} i{row['instances']}"
    return (f"{label:<14} {start_imports:9.2f} {own:7.2f} {server:6.2f} {load:6.2f} {warmup:7.2f} {window:7.2f} "
            f"{tail:6.2f} {stop:6.2f} {peak:>8}  {','.join(frameworks)}")


if __name__ == "__main__":
    sys.exit(main())
