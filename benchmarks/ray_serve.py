"""Issue 33's Ray Serve figures: `corescale deploy --target ray` against `corescale serve` on the same cores and
bundle, and a 2-node local Ray cluster against the sum of its nodes; DIR/ray_serve.json.

    python benchmarks/ray_serve.py --two BUNDLE --one BUNDLE [--slo 100] [--duration 5] [--min-queries 200]
                                   [--rounds 2] [--start-qps 50] [--output DIR] [--note TEXT]

--two: a bundle whose layout uses both cores (e.g. instances=2 cores_per_instance=1); --one: a one-core block
(instances=1 cores_per_instance=1) for the 2-node cluster. Each figure is the highest rate at which every request
got 200, p99 <= --slo and the answered rate kept up (benchmarks/serve.py's open-loop Poisson load and search, one
built-in text per POST /embed, latency from the scheduled send time), on this machine's CPUs.

1. Same cores, same bundle: `corescale serve --two`, then `corescale deploy --two --target ray` (a private local
   cluster on loopback), alternated --rounds times in one run (the shared machine's load drifts; each round's
   ratio is reported). At each max rate: CPU milliseconds per request of each part, from /proc: serve's front
   (its process) and instances; Ray's proxy (ray::ProxyActor), the replicas' fronts (ray::ServeReplica), the
   instances, and the rest of Ray (raylet, GCS, controller, ...).
2. 2-node: a loopback cluster whose node a is pinned to CPU 0 and node b to CPU 1 (1 CPU each), --one deployed
   (one replica each, the head's proxy in front); then node a alone, node b alone (a one-node cluster each):
   cluster ÷ (a + b).
The load generator runs in this process on every CPU: on 2 cores it competes with what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import uvloop

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
sys.path.insert(0, str(BENCHMARKS))
import serve as serve_bench  # noqa: E402  (benchmarks/serve.py: the open-loop load and the search)

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
ROLES = (("ray::ProxyActor", "proxy"), ("ray::ServeReplica", "replica fronts"), ("corescale.measure.worker",
                                                                                    "instances"))


def cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ray_cpu(marker: str) -> dict[str, float]:
    """CPU seconds by part of every process of one Ray session (its RAY_TMPDIR in the environment)."""
    parts: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker.encode() not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = next((name for prefix, name in ROLES if prefix in cmdline), "ray other")
        parts[role] = parts.get(role, 0.0) + cpu_of(int(entry))
    return parts


def serve_cpu(pid: int) -> dict[str, float]:
    return {"front": cpu_of(pid), "instances": serve_bench.descendants_cpu(pid)}


def step(url: str, qps: float, texts: list[str], args, cpu) -> dict:
    count = max(args.min_queries, int(qps * args.duration))
    before, began = cpu(), time.monotonic()
    found = uvloop.run(serve_bench.offered(url, texts, qps, count, seed=len(texts)))
    wall, after = time.monotonic() - began, cpu()
    found.update(qps=qps, wall_s=wall, cpu_ms_per_request={k: (v - before.get(k, 0.0)) / count * 1e3
                                                           for k, v in after.items()})
    found["passed"] = bool(found["ok"] == count and found["p99_ms"] <= args.slo
                           and found["answered_qps"] >= 0.95 * found["scheduled_qps"])
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(found["cpu_ms_per_request"].items()))
    print(f"  {qps:7.2f} QPS: p50 {found['p50_ms']:6.1f} p99 {found['p99_ms']:7.1f} ms, {found['ok']}/{count} ok, "
          f"answered {found['answered_qps']:.2f} QPS; CPU ms/request: {parts} -> "
          f"{'pass' if found['passed'] else 'miss'}", file=sys.stderr, flush=True)
    return found


def searched(name: str, url: str, texts: list[str], args, cpu, start: float) -> dict:
    print(f"{name} at {url} ...", file=sys.stderr, flush=True)
    best, steps = serve_bench.search(lambda qps: step(url, qps, texts, args, cpu), start)
    at_best = max((s for s in steps if s["passed"]), key=lambda s: s["qps"], default=None)
    return {"name": name, "max_qps": best, "at_max": at_best, "steps": steps}


@contextmanager
def started(command: list[str], log: Path, env: dict[str, str]):
    """A `corescale serve|deploy` process (this checkout), its URL once ready; stopped with SIGTERM."""
    from corescale.measure.http.contract import url_in
    from corescale.measure.http.managed import stop, wait_ready

    with open(log, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "corescale.cli", *command, "--port", "0"],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    try:
        yield url_in(wait_ready(process, log, 600)), process
    finally:
        _, said = stop(process)
        with open(log, "a") as kept:
            kept.write(said)


@contextmanager
def cluster(cpus: list[int]):
    """A loopback Ray cluster of one node per CPU in `cpus`, each pinned to it (1 CPU each); (address, marker)."""
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    saved = {k: os.environ.get(k) for k in [*RAY_ENV, "RAY_TMPDIR"]}
    os.environ.update(RAY_ENV, RAY_TMPDIR=str(tmp))
    before = os.sched_getaffinity(0)
    nodes = Cluster()
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            try:
                nodes.add_node(num_cpus=1, include_dashboard=False, node_ip_address="127.0.0.1")
            finally:
                os.sched_setaffinity(0, before)
        nodes.wait_for_nodes()
        yield nodes.address, f"RAY_TMPDIR={tmp}"
    finally:
        nodes.shutdown()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        shutil.rmtree(tmp, ignore_errors=True)


def on_ray(name: str, bundle: Path, out: Path, texts: list[str], args, start: float, address: str | None = None,
           marker: str | None = None) -> dict:
    tmp = None
    if marker is None:
        tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        marker = f"RAY_TMPDIR={tmp}"
    env = {**RAY_ENV, "RAY_TMPDIR": marker.split("=", 1)[1]}
    command = ["deploy", str(bundle), "--target", "ray", *(["--address", address] if address else [])]
    try:
        with started(command, out / f"{name}.log", env) as (url, _):
            return searched(name, url, texts, args, lambda: ray_cpu(marker), start)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def on_serve(name: str, bundle: Path, out: Path, texts: list[str], args, start: float) -> dict:
    with started(["serve", str(bundle), "--max-queue", "100000"], out / f"{name}.log", {}) as (url, process):
        return searched(name, url, texts, args, lambda: serve_cpu(process.pid), start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--two", required=True, help="a bundle on both cores")
    parser.add_argument("--one", required=True, help="a bundle of one one-core block")
    parser.add_argument("--slo", type=float, default=100.0, help="p99 bound (ms)")
    parser.add_argument("--duration", type=float, default=5.0, help="each step's length (s)")
    parser.add_argument("--min-queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="serve, then Ray, this many times")
    parser.add_argument("--start-qps", type=float, default=50.0)
    parser.add_argument("--skip-nodes", action="store_true", help="only the same-cores comparison")
    parser.add_argument("--output", default=None)
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    args = parser.parse_args()

    from corescale.machine.environment import cpuinfo
    from corescale.workload.corpus import texts

    out = Path(args.output or tempfile.mkdtemp(prefix="corescale-ray-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    corpus, cpus = texts(), sorted(os.sched_getaffinity(0))
    rounds = []
    for number in range(args.rounds):
        served = on_serve(f"serve-{number}", Path(args.two), out, corpus, args, args.start_qps)
        ray = on_ray(f"ray-{number}", Path(args.two), out, corpus, args, served["max_qps"] or args.start_qps)
        ratio = ray["max_qps"] / served["max_qps"] if ray["max_qps"] and served["max_qps"] else None
        rounds.append({"serve": served, "ray": ray, "ratio": ratio})
        print(f"round {number}: Ray Serve {ray['max_qps']} ÷ serve {served['max_qps']} = {ratio}", file=sys.stderr)
    nodes = None
    if not args.skip_nodes:
        alone = []
        for cpu in cpus[:2]:
            with cluster([cpu]) as (address, marker):
                alone.append(on_ray(f"node-cpu{cpu}", Path(args.one), out, corpus, args, args.start_qps / 2,
                                    address, marker))
        with cluster(cpus[:2]) as (address, marker):
            both = on_ray("two-nodes", Path(args.one), out, corpus, args, args.start_qps, address, marker)
        total = sum(a["max_qps"] or 0 for a in alone)
        nodes = {"alone": alone, "cluster": both, "ratio": both["max_qps"] / total if both["max_qps"] and total
                 else None}
    figures = {"cpu": cpuinfo().model, "cpus": cpus, "slo_p99_ms": args.slo, "duration_s": args.duration,
               "bundles": {"two": args.two, "one": args.one}, "rounds": rounds, "nodes": nodes, "note": args.note,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "ray_serve.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")
    for r in rounds:
        print(f"same cores: serve {r['serve']['max_qps']} QPS, Ray Serve {r['ray']['max_qps']} QPS, "
              f"ratio {r['ratio']}")
    if nodes:
        print(f"2 nodes: {nodes['cluster']['max_qps']} QPS; alone {[a['max_qps'] for a in nodes['alone']]}; "
              f"ratio {nodes['ratio']}")
    print(f"ray_serve.json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
