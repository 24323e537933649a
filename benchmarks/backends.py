"""Every backend side by side: latency, throughput, GFLOP/s and % of the measured SGEMM peak.

    python benchmarks/backends.py [--model bert-base] [--batch-sizes 1,8] [--threads 1,2] [--duration 5]
                                  [--backends pytorch,onnxruntime,...] [--output DIR] [OVERRIDES...]

One pinned instance per trial on `threads` cores (cores_per_instance=threads), trials one at a time through the
ordinary runner (fresh worker processes, SGEMM calibrated on the same cores and thread count). Backends whose
extra is not installed are listed and skipped. Prints a markdown table and the P2 goal: the best backend at the
largest batch size reaches >= 80 % of the SGEMM peak (the best SGEMM calibration of the run per thread count).
`--table-from DIR` prints the table of an earlier run again.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

GOAL = 0.80
# name in the table -> overrides; the ONNX Runtime row uses its transformer fusions (its best configuration)
BACKENDS = {
    "pytorch": ["backend=pytorch"],
    "torchscript": ["backend=torchscript"],
    "torch_compile": ["backend=torch_compile"],
    "onnxruntime": ["backend=onnxruntime", "backend.fusion=true"],
    "openvino": ["backend=openvino"],
    "tensorflow": ["backend=tensorflow"],
    "tensorflow_graph": ["backend=tensorflow_graph"],
    "tensorflow_xla": ["backend=tensorflow_xla"],
}


def grid(args) -> tuple[list[tuple[str, int, int, list[str]]], list[str]]:
    """(backend, batch size, threads, overrides) for each trial, and the backends skipped for a missing extra."""
    from corescale.backends import check_available
    from corescale.errors import UserError

    trials, skipped = [], []
    for name in args.backends:
        if name not in BACKENDS:
            raise SystemExit(f"unknown backend '{name}'; choose from {', '.join(BACKENDS)}")
        try:
            check_available(BACKENDS[name][0].split("=")[1])
        except UserError as exc:
            skipped.append(f"{name} ({exc})")
            continue
        for threads in args.threads:
            for batch in args.batch_sizes:
                trials.append((name, batch, threads, [*BACKENDS[name], f"batch_size={batch}", f"threads={threads}",
                                                      f"cores_per_instance={threads}"]))
    return trials, skipped


def run(trials, base: list[str]) -> list[dict]:
    from corescale.machine import environment
    from corescale.measure.runner import prepare_trial
    from corescale.overrides import compose
    from corescale.trials.local import run_trial

    host = environment.capture()
    rows = []
    for number, (name, batch, threads, overrides) in enumerate(trials, 1):
        print(f"[{number}/{len(trials)}] {name} bs{batch} {threads} thread(s) ...", file=sys.stderr, flush=True)
        trial = prepare_trial(compose([*base, *overrides]))
        outcome = run_trial(trial, host)  # under the machine lock
        rows.append({"backend": name, "batch": batch, "threads": threads, "record": outcome.record.to_json()})
    return rows


def peaks(rows: list[dict]) -> dict[int, float]:
    """The SGEMM peak per thread count: the best of the trials' calibrations on the same cores and thread count
    (a calibration disturbed by other load only comes out lower)."""
    best: dict[int, float] = {}
    for row in rows:
        gflops = (row["record"].get("metrics") or {}).get("sgemm_peak_gflops")
        if gflops:
            best[row["threads"]] = max(best.get(row["threads"], 0.0), gflops)
    return best


def cells(record: dict, peak: float | None) -> list[str]:
    if record["status"] != "ok":
        return ["failed: " + str(record.get("reason"))[:60], "", "", "", ""]
    m = record["metrics"]
    stages = ", ".join(f"{k} {v:.1f}" for k, v in record["instances"][0]["stage_seconds"].items())
    return [f"{m['latency_s']['p50'] * 1e3:.1f}", f"{m['throughput_samples_per_s']:.2f}", f"{m['gflops_per_s']:.1f}",
            f"{m['gflops_per_s'] / peak:.0%}" if peak else "",
            stages + (" ⚠ contaminated" if m["contaminated"] else "")]


def markdown(rows: list[dict], title: str, skipped: list[str]) -> str:
    peak = peaks(rows)
    lines = [f"**{title}**", "",
             "| backend | batch | threads | latency p50 (ms) | samples/s | GFLOP/s | % of SGEMM peak "
             "| load stages (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        lines.append("| " + " | ".join([row["backend"], str(row["batch"]), str(row["threads"]),
                                         *cells(row["record"], peak.get(row["threads"]))]) + " |")
    lines.append("\nSGEMM peak (best calibration per thread count): "
                 + ", ".join(f"{t} thread(s) {g:.1f} GFLOP/s" for t, g in sorted(peak.items())))
    ok = [r for r in rows if r["record"]["status"] == "ok" and r["threads"] in peak]
    if ok:
        largest = max(r["batch"] for r in ok)
        for threads in sorted({r["threads"] for r in ok}):
            candidates = [r for r in ok if r["batch"] == largest and r["threads"] == threads]
            if candidates:
                best = max(candidates, key=lambda r: r["record"]["metrics"]["gflops_per_s"])
                share = best["record"]["metrics"]["gflops_per_s"] / peak[threads]
                verdict = "met" if share >= GOAL else "NOT met"
                lines.append(f"\nP2 at bs{largest}, {threads} thread(s): best is {best['backend']} at "
                             f"**{share:.0%}** of the SGEMM peak (goal ≥ {GOAL:.0%}: {verdict})")
    if skipped:
        lines.append("\nskipped (extra not installed): " + "; ".join(skipped))
    return "\n".join(lines)


def from_results(root: Path) -> list[dict]:
    """Rows of an earlier run of this script, read back from its output directory."""
    import json

    rows = []
    for path in sorted(root.glob("*/result.json")):
        record = json.loads(path.read_text())
        cfg = record["config"]
        rows.append({"backend": cfg["backend"], "batch": cfg["batch_size"], "threads": cfg["threads"],
                     "record": record})
    order = list(BACKENDS)
    return sorted(rows, key=lambda r: (order.index(r["backend"]) if r["backend"] in order else len(order),
                                       r["threads"], r["batch"]))


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8])
    parser.add_argument("--threads", type=int_list, default=[1, 2])
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--duration", type=float, default=5.0, help="timed window per trial (s)")
    parser.add_argument("--backends", type=lambda s: s.split(","), default=list(BACKENDS))
    parser.add_argument("--output", help="results root (default: a new temp dir)")
    parser.add_argument("--table-from", metavar="DIR", help="only print the table of an earlier run's --output")
    parser.add_argument("overrides", nargs="*", help="extra corescale overrides, e.g. cache_dir=/tmp/cache")
    args = parser.parse_args(argv)
    if args.table_from:
        print(markdown(from_results(Path(args.table_from)), f"results in {args.table_from}", []))
        return 0
    out = Path(args.output or tempfile.mkdtemp(prefix="corescale-backends-"))
    base = [f"model={args.model}", f"sequence_length={args.sequence_length}", f"duration={args.duration:g}",
            "min_iterations=3", f"output_dir={out}", *args.overrides]
    trials, skipped = grid(args)
    rows = run(trials, base)
    title = f"{args.model}, seq {args.sequence_length}, one pinned instance, {args.duration:g} s windows"
    print(markdown(rows, title, skipped))
    print(f"\nresults: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
