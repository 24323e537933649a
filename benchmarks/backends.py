"""Every backend side by side: latency, throughput, GFLOP/s and % of the machine's GEMM peak.

    python benchmarks/backends.py [--model bert-base] [--batch-sizes 1,8] [--threads 1,2] [--duration 5]
                                  [--backends pytorch,onnxruntime,...] [--output DIR] [OVERRIDES...]

`pytorch backend.linear=onednn` is eager PyTorch with every nn.Linear on torch's own oneDNN linear (the remedy
`corescale explain` suggests); its goal, checked against plain eager in the same run: at the largest batch size
>= 80 % of the peak and >= 1.8x plain eager's throughput.
One pinned instance per trial on `threads` cores (cores_per_instance=threads), trials one at a time through the
ordinary trial loop (benchmarks/_loop.py: fresh worker processes). The peak is the best of every GEMM library
measured on the same cores and thread count (machine/peak.py, cached per machine + software), so no cell can
exceed 100 %. Backends whose extra is not installed are listed and skipped. Prints a markdown table, the peak per
library, and the P2 goal: the best backend at the largest batch size reaches >= 80 % of that peak.
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
    "pytorch backend.linear=onednn": ["backend=pytorch", "backend.linear=onednn"],
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
    from _loop import measure

    records = measure({f"{name} bs{batch} {threads} thread(s)": [*base, *overrides]
                       for name, batch, threads, overrides in trials}, stop_at_failure=False)
    return [{"backend": name, "batch": batch, "threads": threads, "record": record.to_json()}
            for (name, batch, threads, _), (record,) in zip(trials, records.values())]


def peaks(rows: list[dict]) -> dict[int, dict]:
    """The machine's GEMM peak per thread count, as the trials recorded it (machine/peak.py: the best of every
    library on the same cores; cached, so every trial on the same cores and threads has the same entry)."""
    found: dict[int, dict] = {}
    for row in rows:
        specs = row["record"].get("specs") or []
        entry = (specs[0].get("peak") if specs else None) or {}
        if entry.get("gflops") and entry["gflops"] >= found.get(row["threads"], {}).get("gflops", 0.0):
            found[row["threads"]] = entry
    return found


def cells(record: dict) -> list[str]:
    if record["status"] != "ok":
        return ["failed: " + str(record.get("reason"))[:60], "", "", "", ""]
    m = record["metrics"]
    stages = ", ".join(f"{k} {v:.1f}" for k, v in record["instance_reports"][0]["stage_seconds"].items())
    share = f"{m['percent_of_peak']:.0f}%" if m.get("percent_of_peak") is not None else (
        "⚠ above peak" if m.get("peak_problem") else "")
    return [f"{m['latency_s']['p50'] * 1e3:.1f}", f"{m['throughput_samples_per_s']:.2f}", f"{m['gflops_per_s']:.1f}",
            share, stages + (" ⚠ contaminated" if m["contaminated"] else "")]


def markdown(rows: list[dict], title: str, skipped: list[str]) -> str:
    peak = peaks(rows)
    lines = [f"**{title}**", "",
             "| backend | batch | threads | latency p50 (ms) | samples/s | GFLOP/s | % of GEMM peak "
             "| load stages (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        lines.append("| " + " | ".join([row["backend"], str(row["batch"]), str(row["threads"]),
                                         *cells(row["record"])]) + " |")
    lines.append("\nGEMM peak per thread count (GFLOP/s, every library on the same cores; the best is the "
                 "yardstick):")
    for threads, entry in sorted(peak.items()):
        libraries = ", ".join(f"{name} {rate:.1f}" for name, rate in sorted(entry["libraries"].items(),
                                                                            key=lambda kv: -kv[1]))
        lines.append(f"- {threads} thread(s): **{entry['gflops']:.1f} ({entry['library']})** — {libraries}")
    ok = [r for r in rows if r["record"]["status"] == "ok" and r["threads"] in peak]
    if ok:
        largest = max(r["batch"] for r in ok)
        for threads in sorted({r["threads"] for r in ok}):
            candidates = [r for r in ok if r["batch"] == largest and r["threads"] == threads]
            if candidates:
                best = max(candidates, key=lambda r: r["record"]["metrics"]["gflops_per_s"])
                share = best["record"]["metrics"]["gflops_per_s"] / peak[threads]["gflops"]
                verdict = "met" if share >= GOAL else "NOT met"
                lines.append(f"\nP2 at bs{largest}, {threads} thread(s): best is {best['backend']} at "
                             f"**{share:.0%}** of the GEMM peak (goal ≥ {GOAL:.0%}: {verdict})")
    lines.extend(onednn_goal(ok, peak))
    if skipped:
        lines.append("\nskipped (extra not installed): " + "; ".join(skipped))
    return "\n".join(lines)


ONEDNN_GOAL_SPEEDUP = 1.8


def onednn_goal(ok: list[dict], peak: dict[int, dict]) -> list[str]:
    """backend.linear=onednn against plain eager at the largest batch size, per thread count."""
    lines = []
    for threads in sorted({r["threads"] for r in ok}):
        rows = {r["backend"]: r for r in ok if r["threads"] == threads and r["batch"] == max(
            x["batch"] for x in ok if x["threads"] == threads)}
        plain, onednn = rows.get("pytorch"), rows.get("pytorch backend.linear=onednn")
        if not plain or not onednn:
            continue
        m, p = onednn["record"]["metrics"], plain["record"]["metrics"]
        share = m["gflops_per_s"] / peak[threads]["gflops"]
        speedup = m["throughput_samples_per_s"] / p["throughput_samples_per_s"]
        met = share >= GOAL and speedup >= ONEDNN_GOAL_SPEEDUP
        lines.append(f"\nbackend.linear=onednn at bs{onednn['batch']}, {threads} thread(s): **{share:.0%}** of the "
                     f"GEMM peak, **{speedup:.2f}x** plain eager (goal >= {GOAL:.0%} and >= "
                     f"{ONEDNN_GOAL_SPEEDUP:g}x: {'met' if met else 'NOT met'})")
    return lines


def from_results(root: Path) -> list[dict]:
    """Rows of an earlier run of this script, read back from its output directory."""
    import json

    rows = []
    for path in sorted(root.glob("*/result.json")):
        record = json.loads(path.read_text())
        cfg = record["config"]
        backend = cfg["backend"]["name"] if isinstance(cfg["backend"], dict) else cfg["backend"]
        if isinstance(cfg["backend"], dict) and cfg["backend"].get("linear", "default") != "default":
            backend += f" backend.linear={cfg['backend']['linear']}"
        rows.append({"backend": backend, "batch": cfg["batch_size"], "threads": cfg["threads"], "record": record})
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
