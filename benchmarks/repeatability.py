"""Are corescale's intervals calibrated? Independent runs of one configuration, each with `repeats=R`: each run's
headline 95 % interval (across its repeats) should contain the mean of the OTHER runs' point estimates in about
93 % of runs (goal >= 90 %). Within-run intervals over one run's calls are printed beside them for contrast: those
are far too narrow, because run-to-run variation (which CPU, memory layout, neighbours) is not in them.

    python benchmarks/repeatability.py [--runs 10] [--repeats 5] [--model bert-base] [--batch-size 1]
                                       [--sequence-length 32] [--duration 3] [OVERRIDES...]

Each run is a real `corescale run repeats=R` (fresh worker processes per repeat). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL = 0.90


def one_run(base: list[str], out: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "corescale.cli", "run", *base, f"output_dir={out}", "--no-progress"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {proc.stderr[-2000:]}")
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/result.json"))]


def summarise(records: list[dict]) -> dict:
    from corescale.record.repeats import across_repeats
    from corescale.record.trial import TrialRecord

    typed = [TrialRecord.from_json(r) for r in records]
    summary = across_repeats(typed)
    within = typed[0].metrics.latency_s  # the first repeat's own interval over its calls
    return {"p50": summary.p50_ms, "throughput": summary.throughput,
            "within_p50": (within.p50_ci95_low * 1e3, within.p50_ci95_high * 1e3), "first_p50": within.p50 * 1e3}


def coverage(runs: list[dict], figure: str) -> list[bool]:
    hits = []
    for i, run in enumerate(runs):
        others = [r[figure].mean for j, r in enumerate(runs) if j != i]
        target = sum(others) / len(others)
        hits.append(run[figure].low is not None and run[figure].low <= target <= run[figure].high)
    return hits


def within_coverage(runs: list[dict]) -> list[bool]:
    hits = []
    for i, run in enumerate(runs):
        others = [r["first_p50"] for j, r in enumerate(runs) if j != i]
        target = sum(others) / len(others)
        hits.append(run["within_p50"][0] <= target <= run["within_p50"][1])
    return hits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--output", help="results root (default: a new temp dir)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    root = Path(args.output or tempfile.mkdtemp(prefix="corescale-repeatability-"))
    base = [f"model={args.model}", f"batch_size={args.batch_size}", f"sequence_length={args.sequence_length}",
            f"duration={args.duration:g}", f"repeats={args.repeats}", "calibrate=false", *args.overrides]
    runs = []
    for n in range(args.runs):
        print(f"[{n + 1}/{args.runs}] corescale run {' '.join(base)} ...", file=sys.stderr, flush=True)
        runs.append(summarise(one_run(base, root / f"run-{n}")))
    p50_hits, tput_hits, within_hits = coverage(runs, "p50"), coverage(runs, "throughput"), within_coverage(runs)
    lines = [f"**{args.model} bs{args.batch_size}/seq{args.sequence_length}, {args.runs} runs x repeats="
             f"{args.repeats}, {args.duration:g} s windows**", "",
             "| run | p50 ms (across repeats, 95 % CI) | holds the others' mean | samples/s (95 % CI) "
             "| holds | first repeat's within-run p50 CI | holds |", "|---:|---|:-:|---|:-:|---|:-:|"]
    for i, run in enumerate(runs):
        p50, tput, (lo, hi) = run["p50"], run["throughput"], run["within_p50"]
        lines.append(f"| {i + 1} | {p50.mean:.2f} ({p50.low:.2f} – {p50.high:.2f}) | {'yes' if p50_hits[i] else 'no'} "
                     f"| {tput.mean:.2f} ({tput.low:.2f} – {tput.high:.2f}) | {'yes' if tput_hits[i] else 'no'} "
                     f"| {lo:.2f} – {hi:.2f} | {'yes' if within_hits[i] else 'no'} |")
    share = (sum(p50_hits) + sum(tput_hits)) / (2 * len(runs))
    lines += ["", f"Across-repeat intervals hold the other runs' mean in **{sum(p50_hits)}/{len(runs)}** (p50) and "
                  f"**{sum(tput_hits)}/{len(runs)}** (throughput) runs: {share:.0%} (goal ≥ {GOAL:.0%}: "
                  f"{'met' if share >= GOAL else 'NOT met'}); within-run p50 intervals: "
                  f"{sum(within_hits)}/{len(runs)}."]
    print("\n".join(lines))
    print(f"\nresults: {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
