"""P9: corescale serve over HTTP ÷ the in-process server scenario, same layout and SLO; the front's CPU there.

    python benchmarks/serve.py [--model all-minilm-l6-v2] [--sequence-length 128] [--slo 100] [--duration 10]
                               [OVERRIDES ...]      e.g. backend=onnxruntime instances=2 cores_per_instance=1

1. In process: `scenario=server target_qps=auto` at p99 <= SLO on the built-in text (`workload=builtin`), LoadGen
   in the parent, the instances pinned; its record becomes a deployment bundle (so the service runs that layout).
2. Over HTTP: `corescale serve BUNDLE` on loopback, and an open-loop Poisson load from this process (httpx's async
   client, POST /embed with `truncate`, one built-in text per request, seeded): each request's latency counts from
   its *scheduled* send time to its answer (no coordinated omission). A rate passes when every request got 200,
   p99 <= SLO, at least --min-queries were sent and the answered rate is within 5 % of the offered one. The same
   search as the in-process one: start at the in-process max, step by 10 % up or down until the verdict flips,
   then bisect twice.
3. Prints both figures, their ratio (goal >= 0.85) and the front's cores used at the HTTP max (corescale serve's
   /metrics: its own CPU time ÷ wall time, goal <= 0.10); and P7: the in-process max QPS ÷ the same layout's
   offline throughput at the batcher's largest batch (goal >= 0.6; --no-offline skips it). The load generator
   runs on the same CPUs (its CPU is printed too): on a 2-core machine it competes with the service, as LoadGen
   does in process.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import uvloop


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def front_cpu(url: str) -> float:
    from corescale.measure.managed import scraped_front_cpu

    found = scraped_front_cpu(url)
    assert found is not None, "corescale serve reports its front's CPU in /metrics"
    return found


async def offered(url: str, texts: list[str], qps: float, count: int, seed: int) -> dict:
    """`count` requests at Poisson arrivals of `qps`; latencies from their scheduled times (aiohttp: a client
    much lighter than httpx, so the load generator takes less of the CPUs it shares with the service)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    times = np.cumsum(np.random.default_rng(seed).exponential(1 / qps, count))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        start = loop.time() + 0.2

        async def one(i: int) -> tuple[float, int]:
            await asyncio.sleep(max(start + times[i] - loop.time(), 0))
            body = {"inputs": texts[i % len(texts)], "truncate": True}
            async with client.post(f"{url}/embed", json=body) as answer:
                await answer.read()
                return loop.time() - (start + times[i]), answer.status

        results = await asyncio.gather(*(one(i) for i in range(count)))
        wall = loop.time() - start
    latencies = np.array([r[0] for r in results]) * 1e3
    return {"p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "ok": sum(r[1] == 200 for r in results), "count": count, "answered_qps": count / wall}


def http_step(url: str, texts: list[str], qps: float, args, seed: int) -> dict:
    count = max(args.min_queries, int(qps * args.duration))
    cpu_before, front_before, began = cpu_seconds(), front_cpu(url), time.monotonic()
    found = uvloop.run(offered(url, texts, qps, count, seed))
    wall = time.monotonic() - began
    found.update(qps=qps, front_cores=(front_cpu(url) - front_before) / wall,
                 client_cores=(cpu_seconds() - cpu_before) / wall)
    found["passed"] = bool(found["ok"] == count and found["p99_ms"] <= args.slo
                           and found["answered_qps"] >= 0.95 * qps)
    print(f"  HTTP {qps:7.2f} QPS: p99 {found['p99_ms']:7.1f} ms, {found['ok']}/{count} ok, answered "
          f"{found['answered_qps']:.2f} QPS, front {found['front_cores']:.3f} cores, load generator "
          f"{found['client_cores']:.3f} cores -> {'pass' if found['passed'] else 'miss'}", file=sys.stderr, flush=True)
    return found


def search(step, start: float) -> tuple[float | None, list[dict]]:
    """Step by 10 % from `start` until the verdict flips, then bisect twice: the highest rate that passed."""
    steps = [step(start)]
    factor = 1.1 if steps[0]["passed"] else 0.9
    while len(steps) < 8 and steps[-1]["passed"] == steps[0]["passed"]:
        steps.append(step(steps[-1]["qps"] * factor))
    passed = [s["qps"] for s in steps if s["passed"]]
    missed = [s["qps"] for s in steps if not s["passed"]]
    for _ in range(2):
        if not passed or not missed:
            break
        middle = (max(passed) + min(m for m in missed if m > max(passed))) / 2
        result = step(middle)
        steps.append(result)
        (passed if result["passed"] else missed).append(middle)
    return (max(passed) if passed else None), steps


def offline_rate(words: list[str], batch: int) -> float:
    """Offline throughput (samples/s) of the same layout on the same text, at the dynamic batcher's largest
    batch: P7's denominator."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _loop import measure

    print(f"offline, batch {batch} ...", file=sys.stderr, flush=True)
    (record,) = measure({"offline": [*words, "scenario=offline", f"batch_size={batch}"]})["offline"]
    return float(record.metrics.throughput_samples_per_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--slo", type=float, default=100.0, help="p99 bound (ms)")
    parser.add_argument("--duration", type=float, default=10.0, help="LoadGen min duration and each HTTP step (s)")
    parser.add_argument("--min-queries", type=int, default=500)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--output", default=None)
    parser.add_argument("--reuse", metavar="DIR", help="an earlier run's --output: its in-process figure and bundle "
                        "(only the HTTP search runs again)")
    parser.add_argument("--no-offline", action="store_true", help="skip P7's offline run of the same layout")
    parser.add_argument("overrides", nargs="*", help="the layout: backend=, instances=, cores_per_instance=, ...")
    args = parser.parse_args()

    from _loop import max_valid_qps

    from corescale.measure.managed import started
    from corescale.overrides import compose
    from corescale.record.files import read_result
    from corescale.serve import bundle as bundles
    from corescale.workload.corpus import texts

    out = Path(args.reuse or args.output or tempfile.mkdtemp(prefix="corescale-serve-bench-"))
    words = [f"model={args.model}", f"sequence_length={args.sequence_length}", f"duration={args.duration}",
             f"output_dir={out / 'results'}", "calibrate=false", "workload=builtin", "timeout=900",
             *(args.overrides or ["backend=onnxruntime", "instances=2", "cores_per_instance=1"])]
    cfg = compose([*words, f"server.min_query_count={args.min_queries}", "server.search_precision=0.05"])
    if args.reuse:
        record = read_result(out / "bundle" / bundles.RECORD)
    else:
        print(f"in process: {args.model}, p99 <= {args.slo:g} ms ...", file=sys.stderr, flush=True)
        _, outcome = max_valid_qps(cfg, args.slo, max_batch=args.max_batch)
        record = outcome.record
        if record.server is None or record.server.max_valid_qps is None:
            raise SystemExit(f"the in-process search found no valid rate: {record.reason or 'see its record'}")
        bundles.write(out / "bundle", record)
    bundle = out / "bundle"
    assert record.server is not None and record.server.max_valid_qps is not None
    offline = None if args.no_offline else offline_rate(words, args.max_batch)
    local, parent = record.server.max_valid_qps, record.server.parent
    with started([str(bundle)], out / "serve.log", "--max-queue", "100000", "--max-inputs", "1") as service:
        url = service.url
        corpus = texts()
        _, steps = search(lambda qps: http_step(url, corpus, qps, args, seed=len(corpus)), local)
    best = max((s for s in steps if s["passed"]), key=lambda s: s["qps"], default=None)
    env = record.environment
    print(f"\n{args.model} on {env.cpu.model} ({env.topology.physical_cores} cores), {cfg.backend.name} "
          f"{cfg.precision}, {cfg.instances} instance(s), max_batch {args.max_batch}, sequence {args.sequence_length}, "
          f"p99 <= {args.slo:g} ms, built-in text\n")
    print("| | max QPS at the SLO | p99 there (ms) | front / parent cores |")
    print("|---|---:|---:|---:|")
    print(f"| in process (LoadGen) | {local:.2f} | {record.server.latency_ms.get('p99', float('nan')):.1f} | "
          f"{parent.cores_used if parent.cores_used is not None else float('nan'):.3f} |")
    if best is not None:
        print(f"| corescale serve over HTTP | {best['qps']:.2f} | {best['p99_ms']:.1f} | {best['front_cores']:.3f} |")
        print(f"\nP9 = {best['qps'] / local:.2f} (goal >= 0.85); the front at that rate: {best['front_cores']:.1%} of "
              f"a core (goal <= 10 %); the load generator: {best['client_cores']:.1%} of a core")
    else:
        print("| corescale serve over HTTP | none passed | | |")
    if offline is not None:
        print(f"\nP7 = {local / offline:.2f} (goal >= 0.6): the in-process max QPS at the SLO ÷ offline throughput of "
              f"the same layout at batch {args.max_batch} ({offline:.2f} samples/s, the server's largest batch)")
    print(f"\nresults and bundle: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
