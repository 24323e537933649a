"""Do more threads keep more cores busy? One pinned instance with 1 thread on 1 core, then 2 threads on 2 cores,
per backend: CPU seconds per wall second of the instance during the timed window ("busy cores").

    python benchmarks/threads.py [--backends pytorch,onnxruntime] [--repeats 3] [--output DIR] [OVERRIDES...]

The tests check what the tool guarantees whatever the load (the thread count reaches the framework, every thread
stays on the instance's CPUs and together they cover them); how busy those threads keep the cores depends on the
machine's other load, so it is measured here. Trials run through the ordinary loop with `repeats` (fresh pinned
worker processes each, round by round: 1t 2t 1t 2t ...); the median over each setup's clean runs (no foreign load
flagged on its pinned CPUs; all runs if none is clean) is reported. Goal: 2 threads ≥ GOAL x the busy cores of 1.
Backends whose extra is not installed are skipped. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

GOAL = 1.3
THREADS = (1, 2)
DEFAULTS = ["model=bert-tiny", "batch_size=4", "sequence_length=128", "duration=3", "calibrate=false"]


def busy_cores(record: dict) -> float:
    inst = record["instance_reports"][0]
    return inst["cpu_seconds"] / inst["wall_seconds"]


def measure(backend: str, base: list[str]) -> dict[int, list[dict]]:
    from corescale.trials.sweep import plan_sweep, run_sweep

    planned = plan_sweep([[*base, f"backend={backend}", f"threads={t}", f"cores_per_instance={t}"] for t in THREADS])
    state = run_sweep(planned, resume=False)
    return {t: [record.to_json() for record in state.records_of(item)] for t, item in zip(THREADS, planned)}


def median_busy(records: list[dict]) -> tuple[float, int]:
    """Median busy cores over the clean runs (all runs if none is clean), and how many runs were contaminated."""
    contaminated = [r for r in records if r["metrics"]["contaminated"]]
    used = [r for r in records if not r["metrics"]["contaminated"]] or records
    return statistics.median(busy_cores(r) for r in used), len(contaminated)


def main(argv=None) -> int:
    from corescale.backends import OPTIONS, check_available
    from corescale.errors import UserError

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="pytorch,onnxruntime")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of 1 thread then 2 threads")
    parser.add_argument("--output", help="results root (default: a new temp dir)")
    parser.add_argument("overrides", nargs="*", help=f"corescale overrides (they win over {' '.join(DEFAULTS)})")
    args = parser.parse_args(argv)
    out = Path(args.output or tempfile.mkdtemp(prefix="corescale-threads-"))
    base = [*DEFAULTS, f"repeats={args.repeats}", f"output_dir={out}", *args.overrides]
    shown = " ".join(word for word in base if not word.startswith("output_dir="))
    lines = [f"**{shown}: median of the clean runs**", "",
             "| backend | busy cores, 1 thread | busy cores, 2 threads | ratio | goal | contaminated runs |",
             "|---|---:|---:|---:|---|---:|"]
    for backend in args.backends.split(","):
        if backend not in OPTIONS:
            raise SystemExit(f"unknown backend '{backend}'")
        try:
            check_available(backend)
        except UserError as exc:
            print(f"skipped {backend}: {exc}", file=sys.stderr)
            continue
        runs = measure(backend, base)
        (one, dirty_one), (two, dirty_two) = (median_busy(runs[t]) for t in THREADS)
        ratio = two / one
        lines.append(f"| {backend} | {one:.2f} | {two:.2f} | {ratio:.2f}x | {'met' if ratio >= GOAL else 'NOT met'} "
                     f"(≥ {GOAL}x) | {dirty_one + dirty_two}/{sum(map(len, runs.values()))} |")
    print("\n".join(lines))
    print(f"\nresults: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
