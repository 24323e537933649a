"""One front or several (`corescale serve BUNDLE --fronts N`): the requests/s a closed loop of connections gets, its
latency, and the CPU each request costs the fronts; DIR/fronts.json.

    python benchmarks/fronts.py BUNDLE [--fronts 1,2] [--rounds 3] [--connections 32] [--seconds 10]
                                       [--texts N] [--max-words W] [--wrk PATH] [--output DIR]

The load is wrk's (a C load generator: `apt-get install wrk`), not ours: C connections, each sending one POST /embed
(the next of the built-in texts, at their real lengths, `truncate` as benchmarks/serve.py sends them) as soon as
its last answer came (a closed loop: what the service can answer, not an SLO's
rate). Each round starts the service with each N in turn (1 2 1 2 ...: the machine's load drifts, so the layouts
are compared within a round), loads it 2 s unrecorded, then for --seconds; the fronts' CPU is their /metrics
`corescale_front_cpu_seconds` (every front's, summed) before and after, wrk's own CPU is read too: on a small
machine the load generator, the fronts and the instances share the cores. Use a bundle whose instances are fast
(a small model): then the fronts are what limits the requests/s, which is what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cold_start import cpu_model  # noqa: E402
from serve import ROOT, front_cpu, serving  # noqa: E402

from corescale.serve.metrics import OTHERS_EVERY_S  # noqa: E402
from corescale.workload.corpus import texts  # noqa: E402

SCRIPT = """bodies = {{{bodies}}}
next_body = 0
request = function()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", nil, {{["Content-Type"] = "application/json"}}, bodies[next_body])
end
"""
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_run(wrk: str, url: str, script: Path, connections: int, seconds: float) -> dict:
    """wrk's figures for one load: requests, requests/s, latency percentiles (ms), errors, its own CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    said = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
                           f"{url}/embed"], capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = {"wrk_cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}
    found["requests"] = int(re.search(r"(\d+) requests in", said).group(1))
    found["requests_per_s"] = float(re.search(r"Requests/sec:\s+([\d.]+)", said).group(1))
    for percent in (50, 90, 99):
        value, unit = re.search(rf"\s{percent}%\s+([\d.]+)(us|ms|s)", said).groups()
        found[f"p{percent}_ms"] = float(value) * UNITS[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", said)
    found["non_2xx"] = int(errors.group(1)) if errors else 0
    found["socket_errors"] = said.count("Socket errors")
    return found


def one_layout(bundle: Path, fronts: int, script: Path, args, log: Path) -> dict:
    with serving(ROOT, bundle, log, "--fronts", str(fronts), "--max-queue", "8192") as (url, *_):
        wrk_run(args.wrk, url, script, args.connections, 2)  # unrecorded: every connection open, caches warm
        time.sleep(OTHERS_EVERY_S * 1.5)  # every front's metrics written since
        cpu = front_cpu(url)
        run = wrk_run(args.wrk, url, script, args.connections, args.seconds)
        time.sleep(OTHERS_EVERY_S * 1.5)
        cpu = front_cpu(url) - cpu
    return {"fronts": fronts, **run, "front_cpu_s": cpu, "front_cpu_ms_per_request": 1e3 * cpu / run["requests"],
            "load_1min": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--fronts", default="1,2", help="the front counts to compare (default 1,2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--texts", type=int, default=256, help="built-in texts, one per request in turn (256)")
    parser.add_argument("--max-words", type=int, default=10**6,
                        help="only the texts of at most this many words (short queries: where a front limits)")
    parser.add_argument("--wrk", default=shutil.which("wrk"), help="wrk's path (default: wrk on PATH)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if not args.wrk:
        parser.error("wrk is not installed: apt-get install wrk (or give --wrk PATH)")
    out = args.output or Path(tempfile.mkdtemp(prefix="corescale-fronts-"))
    out.mkdir(parents=True, exist_ok=True)
    script = out / "post.lua"
    chosen = [text for text in texts(args.texts) if len(text.split()) <= args.max_words]
    bodies = [json.dumps(json.dumps({"inputs": text, "truncate": True})) for text in chosen]
    script.write_text(SCRIPT.format(bodies=", ".join(bodies)))
    counts = [int(n) for n in args.fronts.split(",")]
    runs = []
    for round_ in range(args.rounds):
        for fronts in counts:
            run = {"round": round_, **one_layout(args.bundle.resolve(), fronts, script, args,
                                                 out / f"serve-{fronts}-{round_}.log")}
            runs.append(run)
            print(f"{fronts} front(s), round {round_}: {run['requests_per_s']:.0f} requests/s, p50 "
                  f"{run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms, fronts {run['front_cpu_ms_per_request']:.3f} "
                  f"CPU-ms/request, wrk {run['wrk_cpu_s'] / args.seconds:.2f} cores, errors "
                  f"{run['non_2xx'] + run['socket_errors']}", file=sys.stderr, flush=True)
            time.sleep(1.0)
    median = {str(n): {key: statistics.median(r[key] for r in runs if r["fronts"] == n)
                       for key in ("requests_per_s", "p50_ms", "p99_ms", "front_cpu_ms_per_request")} for n in counts}
    result = {"bundle": str(args.bundle), "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "texts": len(chosen),
              "mean_words": statistics.mean(len(text.split()) for text in chosen),
              "connections": args.connections, "seconds": args.seconds, "runs": runs, "median": median}
    (out / "fronts.json").write_text(json.dumps(result, indent=1))
    for n, values in median.items():
        print(f"{n} front(s) median: {values['requests_per_s']:.0f} requests/s, p50 {values['p50_ms']:.2f} ms, "
              f"p99 {values['p99_ms']:.2f} ms, {values['front_cpu_ms_per_request']:.3f} front CPU-ms/request")
    print(f"wrote {out / 'fronts.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
