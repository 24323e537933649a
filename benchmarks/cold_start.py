"""Cold start of `corescale serve BUNDLE`: process start -> ready line, and -> the first answered request (200), on a
warm and a cold artifact cache, with the CPU seconds the service (front and instances) spent to get there;
DIR/cold_start.json.

    python benchmarks/cold_start.py BUNDLE [--rounds 3] [--baseline CHECKOUT] [--cache warm,cold] [--output DIR]

Each round starts this checkout's service, then (--baseline) the other checkout's, on the same bundle, one after
the other (A B A B ...: the machine's load drifts, so before/after are compared within a round). The clock is
benchmarks/serve.py's (`serving`: from just before the process is started to its ready line, then to the 200 of
one POST /embed). `cold`: the bundle's files are dropped from the page cache first (posix_fadvise DONTNEED on each
file: only the bundle's pages, nothing else on a shared machine), so the verified copy reads them from disk, and
the compiled-model cache is a new empty folder, so the instances compile what a restart imports (OpenVINO's
compiled model); `warm` is a restart's: one unrecorded start per checkout fills both first. The CPU seconds are
the service's own (its process and its instances, from /proc) at the first answer: less sensitive to other
processes than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import ROOT, descendants_cpu, evict, serving  # noqa: E402 (benchmarks/serve.py: the same clock)


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start(checkout: Path, bundle: Path, log: Path, cache: str, compiled: Path) -> dict:
    """`cold`: the bundle out of the page cache and an empty compiled-model cache (a first start on this machine);
    `warm`: the bundle in the page cache and `compiled` holding what an earlier start compiled (a restart)."""
    if cache == "cold":
        evict(bundle)
        compiled = Path(tempfile.mkdtemp(prefix="cold-", dir=compiled.parent))
    load = os.getloadavg()[0]
    with serving(checkout, bundle, log, compiled=compiled) as (url, process, ready, first, front):
        cpu = process_cpu(process.pid) + descendants_cpu(process.pid)
    return {"ready_s": ready, "first_200_s": first, "cpu_s": cpu, "load_1min": load, "front": front}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, started right after this one each round")
    parser.add_argument("--cache", default="warm,cold", help="warm, cold or both (default warm,cold)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    out = args.output or Path(tempfile.mkdtemp(prefix="corescale-cold-start-"))
    out.mkdir(parents=True, exist_ok=True)
    checkouts = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    runs = []
    if "warm" in args.cache.split(","):
        for name, checkout in checkouts:  # a restart's caches: the bundle read, the models compiled
            one_start(checkout, args.bundle.resolve(), out / f"serve-{name}-first.log", "warm",
                      out / f"compiled-{name}")
    for round_ in range(args.rounds):
        for cache in args.cache.split(","):
            for name, checkout in checkouts:
                log = out / f"serve-{name}-{cache}-{round_}.log"
                compiled = out / f"compiled-{name}"
                run = {"checkout": name, "cache": cache, "round": round_, **one_start(checkout, args.bundle.resolve(),
                                                                                      log, cache, compiled)}
                runs.append(run)
                print(f"{name:8s} {cache} round {round_}: ready {run['ready_s']:.2f} s, first 200 "
                      f"{run['first_200_s']:.2f} s, {run['cpu_s']:.2f} CPU-s (load {run['load_1min']:.1f})",
                      file=sys.stderr, flush=True)
                time.sleep(1.0)  # the stopped service's instances gone before the next start
    summary = {}
    for name, _ in checkouts:
        for cache in args.cache.split(","):
            mine = [r for r in runs if r["checkout"] == name and r["cache"] == cache]
            summary[f"{name}/{cache}"] = {key: statistics.median(r[key] for r in mine)
                                          for key in ("ready_s", "first_200_s", "cpu_s", "load_1min")}
    result = {"bundle": str(args.bundle), "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "runs": runs,
              "median": summary}
    (out / "cold_start.json").write_text(json.dumps(result, indent=1))
    for key, values in summary.items():
        print(f"{key:16s} median: ready {values['ready_s']:.2f} s, first 200 {values['first_200_s']:.2f} s, "
              f"{values['cpu_s']:.2f} CPU-s, load {values['load_1min']:.1f}")
    print(f"wrote {out / 'cold_start.json'}", file=sys.stderr)
    return 0


def cpu_model() -> str:
    """The CPU's name with its family and model (a guest's name alone may be just "AMD EPYC")."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', 'unknown')} (family {fields.get('cpu family', '?')} model " \
           f"{fields.get('model', '?')})"


if __name__ == "__main__":
    sys.exit(main())
