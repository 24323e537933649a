"""Server scenario on this machine: offline samples/s vs LoadGen server max QPS at a p99 SLO.

    python benchmarks/server.py [--model bert-base] [--sequence-length 128] [--duration 10] [--output DIR]
                                [OVERRIDES ...]       e.g. backend=onnxruntime precision=int8 (the tune's choice)

For each layout (1 instance x 2 cores, 2 instances x 1 core) the closed loop (offline) at batch 8 gives
samples/s. The server layout (--server-layout, default the latency layout 1 x 2 cores: on a 1-core instance one
bert-base query alone takes ~410 ms, leaving nothing of a 500 ms SLO for queueing) is then searched under Poisson
arrivals (target_qps=auto) at p99 <= 130 ms and <= 500 ms with dynamic batching (max_batch 8) and, at the last
SLO, with max_batch 1. Prints server ÷ offline (MLPerf v4.1 CPU anchor: 0.77-0.81 at 130 ms) against the same
layout's and the best layout's offline rate, and the effect of dynamic batching. A markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

LAYOUTS = {"1 x 2 cores": ["instances=1", "cores_per_instance=2"],
           "2 x 1 core": ["instances=2", "cores_per_instance=1"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--duration", type=float, default=10.0, help="offline window and LoadGen min duration (s)")
    parser.add_argument("--min-queries", type=int, default=500, help="LoadGen min query count per test")
    parser.add_argument("--slos", default="130,500")
    parser.add_argument("--server-layout", default="1 x 2 cores", choices=list(LAYOUTS))
    parser.add_argument("--precision", type=float, default=0.15, help="server.search_precision")
    parser.add_argument("--max-steps", type=int, default=5, help="server.max_steps")
    parser.add_argument("--output", default=None)
    parser.add_argument("overrides", nargs="*", help="the deployment: backend=, precision=, backend.* ...")
    args = parser.parse_args()

    from _loop import max_valid_qps, measure

    from corescale.overrides import compose

    out = args.output or tempfile.mkdtemp(prefix="corescale-server-bench-")
    base = [f"model={args.model}", f"sequence_length={args.sequence_length}", f"duration={args.duration}",
            f"output_dir={out}", "calibrate=false", f"server.min_query_count={args.min_queries}",
            f"server.search_precision={args.precision}", f"server.max_steps={args.max_steps}", "timeout=900",
            *args.overrides]
    measured = measure({f"offline {name}": [*base, *layout, "batch_size=8"] for name, layout in LAYOUTS.items()})
    offline = {name: measured[f"offline {name}"][0].metrics.throughput_samples_per_s for name in LAYOUTS}
    best = max(offline, key=offline.get)
    chosen = args.server_layout
    cfg = compose([*base, *LAYOUTS[chosen]])
    rows = []
    slos = [float(s) for s in args.slos.split(",")]
    runs = [(slo, 8) for slo in slos] + [(slos[-1], 1)]
    for slo, max_batch in runs:
        print(f"server {chosen} p99 <= {slo:g} ms, max_batch {max_batch} ...", file=sys.stderr, flush=True)
        qps, outcome = max_valid_qps(cfg, slo, max_batch=max_batch, max_queue_ms=5.0)
        server = outcome.record.server
        rows.append({"slo_ms": slo, "max_batch": max_batch, "max_valid_qps": qps,
                     "knee_qps": server.knee_qps if server else None, "steps": len(server.steps) if server else 0,
                     "p99_ms": server.latency_ms.get("p99") if server else None,
                     "mean_rows": server.batching.mean_rows if server else None,
                     "parent_cores": server.parent.cores_used if server else None, "path": str(outcome.path),
                     "reason": outcome.record.reason, "unreachable": server.unreachable if server else None})
    print(f"model {args.model}, seq {args.sequence_length} {' '.join(args.overrides)}; results under {out}\n")
    print("| layout | offline samples/s (batch 8) |\n|---|---|")
    for name, rate in offline.items():
        print(f"| {name}{' (best)' if name == best else ''} | {rate:.2f} |")
    print(f"\nserver layout: {chosen}\n")
    print("| SLO p99 | max_batch | max valid QPS | ÷ offline, same layout | ÷ best offline | p99 at max (ms) | "
          "mean rows | knee QPS | LoadGen tests | parent cores |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        qps = r["max_valid_qps"]
        same = f"{qps / offline[chosen]:.2f}" if qps else "-"
        best_ratio = f"{qps / offline[best]:.2f}" if qps else "-"
        print(f"| {r['slo_ms']:g} ms | {r['max_batch']} | {qps or 'none'} | {same} | {best_ratio} | "
              f"{r['p99_ms'] or float('nan'):.1f} | {r['mean_rows'] or float('nan'):.2f} | {r['knee_qps'] or '-'} | "
              f"{r['steps']} | {r['parent_cores'] or float('nan'):.3f} |")
    for r in rows:
        if r["unreachable"] or r["reason"]:
            print(f"\np99 <= {r['slo_ms']:g} ms, max_batch {r['max_batch']}: {r['unreachable'] or r['reason']}")
    one = [r for r in rows if r["max_batch"] == 1]
    batched = [r for r in rows if r["max_batch"] == 8 and r["slo_ms"] == one[0]["slo_ms"]] if one else []
    if one and batched and one[0]["max_valid_qps"] and batched[0]["max_valid_qps"]:
        print(f"\ndynamic batching at p99 <= {one[0]['slo_ms']:g} ms: max_batch 8 / max_batch 1 = "
              f"{batched[0]['max_valid_qps'] / one[0]['max_valid_qps']:.2f}")
    Path(out, "server-benchmark.json").write_text(json.dumps({"offline": offline, "server": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
