"""Multiple pinned streams on this machine: 2 pinned 1-core instances vs one 1-core and one 2-thread instance.

    python benchmarks/instances.py [--model bert-base] [--duration 10] [--repeats 1] [--output DIR]

P1 scaling efficiency = throughput(2 x 1 core) ÷ (2 x throughput(1 x 1 core)); goal ≥ 0.95. Trials run one at a
time through the ordinary trial loop (benchmarks/_loop.py: fresh pinned worker processes each); with --repeats
the setups alternate (A B C A B C ...) and the median throughput of each setup's clean runs (no foreign load
flagged on its pinned CPUs; all runs if none is clean) is reported. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

GOAL = 0.95
SETUPS = {  # name -> overrides
    "1 instance x 1 core": ["instances=1", "cores_per_instance=1"],
    "2 instances x 1 core (pinned)": ["instances=2", "cores_per_instance=1"],
    "1 instance x 2 threads": ["instances=1", "cores_per_instance=2"],
}


def run_setups(base: list[str], repeats: int) -> dict[str, list[dict]]:
    from _loop import measure

    records = measure({name: [*base, *extra] for name, extra in SETUPS.items()}, repeats)
    return {name: [record.to_json() for record in runs] for name, runs in records.items()}


def summarise(records: dict[str, list[dict]]) -> list[dict]:
    """Median per setup over its clean runs (no foreign load on the pinned CPUs), or over all if none is clean."""
    rows = []
    for name, runs in records.items():
        every = [r["metrics"] for r in runs]
        metrics = [m for m in every if not m["contaminated"]] or every
        rows.append({
            "setup": name,
            "throughput": statistics.median(m["throughput_samples_per_s"] for m in metrics),
            "p50_ms": statistics.median(m["max_instance_p50_s"] for m in metrics) * 1e3,
            "contaminated": sum(m["contaminated"] for m in every),
            "used": len(metrics),
            "runs": len(runs),
        })
    single = rows[0]["throughput"]
    for row in rows:
        row["vs_single"] = row["throughput"] / single
    return rows


def round_efficiencies(records: dict[str, list[dict]]) -> list[tuple[float, bool]]:
    """(P1 efficiency, clean) of each round: the pair against the single instance measured just before it."""
    single, pinned = (records[name] for name in list(SETUPS)[:2])
    return [(p["metrics"]["throughput_samples_per_s"] / (2 * s["metrics"]["throughput_samples_per_s"]),
             not (s["metrics"]["contaminated"] or p["metrics"]["contaminated"])) for s, p in zip(single, pinned)]


def markdown(rows: list[dict], title: str, rounds: list[float]) -> str:
    lines = [f"**{title}**", "",
             "| setup | throughput (samples/s) | latency p50 (ms, slowest instance) | vs 1 x 1 core "
             "| contaminated runs | runs used |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['setup']} | {row['throughput']:.2f} | {row['p50_ms']:.1f} | {row['vs_single']:.2f}x "
                     f"| {row['contaminated']}/{row['runs']} | {row['used']} |")
    single, pinned, threaded = (row["throughput"] for row in rows)
    efficiency = pinned / (2 * single)
    verdict = "met" if efficiency >= GOAL else "NOT met"
    lines += ["", f"P1 scaling efficiency (2 pinned 1-core instances ÷ 2 x one): **{efficiency:.3f}** "
                  f"(goal ≥ {GOAL}: {verdict})",
              f"2 pinned 1-core instances ÷ one 2-thread instance: **{pinned / threaded:.2f}x**"]
    if len(rounds) > 1:
        from corescale.record.repeats import Interval

        lines.append("P1 efficiency per round: " + ", ".join(
            f"{e:.3f}" + ("" if clean else " (contaminated)") for e, clean in rounds))
        across = Interval.of([e for e, _ in rounds])
        lines.append(f"P1 efficiency across rounds: {across.text('', 3).strip()}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--duration", type=float, default=10.0, help="timed window per trial (s)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds of the three setups")
    parser.add_argument("--output", help="results root (default: a new temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra corescale overrides, e.g. allocator=jemalloc")
    args = parser.parse_args(argv)
    out = Path(args.output or tempfile.mkdtemp(prefix="corescale-instances-"))
    base = [f"model={args.model}", f"batch_size={args.batch_size}", f"sequence_length={args.sequence_length}",
            f"duration={args.duration:g}", "calibrate=false", f"output_dir={out}", *args.overrides]
    records = run_setups(base, args.repeats)
    rows = summarise(records)
    title = (f"{args.model} bs{args.batch_size}/seq{args.sequence_length}, {args.duration:g} s windows, "
             f"{args.repeats} round(s), median of the clean runs per setup")
    print(markdown(rows, title, round_efficiencies(records)))
    print(f"\nresults: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
