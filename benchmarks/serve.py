"""P9 and P7': corescale serve over HTTP ÷ the in-process server scenario and ÷ the best offline throughput, the
front's and the model's CPU per request, the tail at 70 % load, cold start; DIR/serve.json.

    python benchmarks/serve.py [--model all-minilm-l6-v2] [--sequence-length 128] [--slo 100] [--duration 10]
                               [--max-batch 4] [--offline-batches 4,8,16] [--output DIR] [--reuse DIR]
                               [--baseline CHECKOUT] [OVERRIDES ...]
                               e.g. backend=onnxruntime instances=2 cores_per_instance=1 server.queue_delay=adaptive

1. In process: `scenario=server target_qps=auto` at p99 <= SLO on the built-in text (`workload=builtin`), LoadGen
   in the parent, the instances pinned; its record becomes a deployment bundle (so the service runs that layout).
2. Offline, the same layout on the same texts with length-sorted batches (`pad=sorted`, as sentence-transformers'
   encode() batches): the best throughput over --offline-batches is P7's denominator (P7').
3. Over HTTP: `corescale serve BUNDLE` on loopback (its cold start timed: process start -> ready line, and ->
   the first answered request; once before on a cold cache: the bundle's files dropped from the page cache and an
   empty compiled-model cache, which that start fills as a restart finds it), an
   open-loop Poisson load from this process (aiohttp, POST /embed with `truncate`, one built-in text per request,
   seeded), each request's latency from its *scheduled* send time (no coordinated omission). A rate passes when
   every request got 200, p99 <= SLO, at least --min-queries were sent and the answered rate is within 5 % of the
   rate the arrivals were drawn at. Search: the in-process search's rules (corescale's qps_search), from the
   in-process max (or --start-qps): double or go down until the verdict flips (below a miss that fell behind, to
   0.7 × what it answered), a doubtful miss tested once more, bisect to 5 %. Then one step at 70 % of the max:
   p99 ÷ p50.
   At the max: the front's CPU per request (its /metrics), the instances' CPU per request (their processes'
   CPU time, /proc), real tokens/s (the texts sent, tokenized as the service does).
4. --baseline CHECKOUT: the same HTTP measurement of another checkout's `corescale serve` (its own code, the same
   bundle), in the same run, right after this checkout's (one block each; the machine's load may differ).

The load generator runs on the same CPUs (its CPU is reported): on a 2-core machine it competes with the service,
as LoadGen does in process.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import uvloop

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Served:
    """One checkout's `corescale serve` over HTTP: what serve.json holds for it."""

    max_qps: float | None
    p50_ms: float | None
    p99_ms: float | None
    p99_over_p50_at_70pct: float | None
    front_cpu_ms_per_request: float | None
    model_cpu_ms_per_request: float | None
    real_tokens_per_s: float | None
    front_cores: float | None
    client_cores: float | None
    cold_start_s: float  # process start -> first answered request (200)
    ready_s: float  # process start -> its ready line
    front: str  # where its front ran (its ready line)
    steps: list[dict]
    cold_cache_start_s: float | None = None  # the same, the bundle's files dropped from the page cache first
    tail_at_70pct: dict | None = None  # the 70 % step's tail_parts: what the requests past p99 waited on


@dataclasses.dataclass
class Figures:
    """DIR/serve.json."""

    p7: float | None  # P7': served max QPS ÷ the best offline throughput (length-sorted batches, same texts)
    p9: float | None  # served max QPS ÷ in-process max QPS (same layout and SLO)
    real_tokens_per_s: float | None
    front_cpu_ms_per_request: float | None
    model_cpu_ms_per_request: float | None
    p99_over_p50_at_70pct: float | None
    cold_start_s: float
    in_process_qps: float | None  # the bundle's own in-process figure (None: its record holds none)
    offline_samples_per_s: float | None
    offline_batch: int | None
    layout: dict
    cpu: str
    slo_p99_ms: float
    model: str
    served: Served
    baseline: Served | None = None
    machine_note: str = ""
    cold_start_cold_cache_s: float | None = None  # cold_start_s with the bundle's files out of the page cache
    in_process_started_at: str | None = None  # when P9's denominator was measured (--reuse, --bundle: earlier)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


REQUIRED = ("p7", "p9", "real_tokens_per_s", "front_cpu_ms_per_request", "model_cpu_ms_per_request",
            "p99_over_p50_at_70pct", "cold_start_s", "layout", "cpu")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def scraped(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        return answer.read().decode()


def front_cpu(url: str) -> float:
    from corescale.measure.http.managed import scraped_front_cpu

    found = scraped_front_cpu(url)
    assert found is not None, "corescale serve reports its front's CPU in /metrics"
    return found


def descendants_cpu(pid: int) -> float:
    """CPU seconds of every process below `pid` (the service's instances), from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    below, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return sum(times[p] for p in below)


@contextmanager
def serving(checkout: Path, bundle: Path, log: Path, *options: str, compiled: Path | None = None):
    """`corescale serve BUNDLE` of that checkout's code (its own folder first on the path), its compiled models
    kept in `compiled` (systemd's $CACHE_DIRECTORY, which serve prefers to the user's cache); yields (url, process,
    seconds to its ready line, seconds to its first answered request (both from the process's start), where its
    front runs)."""
    from corescale.machine import instance_env
    from corescale.measure.http.contract import front_in, url_in
    from corescale.measure.http.managed import stop, wait_ready

    env = dict(os.environ, PYTHONPATH=str(checkout), **({"CACHE_DIRECTORY": str(compiled)} if compiled else {}))
    launch = instance_env.Launch([], env, tuple(sorted(os.sched_getaffinity(0))))
    began = time.monotonic()
    with open(log, "wb") as stderr:
        process = instance_env.start(launch, [sys.executable, "-m", "corescale.cli", "serve", str(bundle), "--port",
                                              "0", *options], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                     cwd=checkout)
    try:
        line = wait_ready(process, log, 600)
        url, ready = url_in(line), time.monotonic() - began
        request = urllib.request.Request(f"{url}/embed", json.dumps({"inputs": "a first request"}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
        yield url, process, ready, time.monotonic() - began, front_in(line)
    finally:
        _, said = stop(process)
        with open(log, "a") as kept:
            kept.write(said)


def evict(bundle: Path) -> int:
    """The bundle's files dropped from the page cache (posix_fadvise DONTNEED on each: only their clean pages,
    nothing else of a shared machine's); returns the bytes advised. A cold start then reads them from disk."""
    total = 0
    for path in bundle.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


async def offered(url: str, texts: list[str], qps: float, count: int, seed: int) -> dict:
    """`count` requests at Poisson arrivals of `qps`; latencies from their scheduled times (aiohttp: a client
    much lighter than httpx, so the load generator takes less of the CPUs it shares with the service)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    times = np.cumsum(np.random.default_rng(seed).exponential(1 / qps, count))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        start = loop.time() + 0.2

        async def one(i: int) -> tuple[float, int, list[float]]:
            await asyncio.sleep(max(start + times[i] - loop.time(), 0))
            body = {"inputs": texts[i % len(texts)], "truncate": True}
            async with client.post(f"{url}/embed", json=body) as answer:
                await answer.read()
                said = [float(answer.headers.get(f"X-{part.title()}-Time", "nan")) for part in PARTS]
                return loop.time() - (start + times[i]), answer.status, said

        results = await asyncio.gather(*(one(i) for i in range(count)))
        wall = loop.time() - start
    latencies = np.array([r[0] for r in results]) * 1e3
    return {"p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "ok": sum(r[1] == 200 for r in results), "count": count, "answered_qps": count / wall,
            "scheduled_qps": count / float(times[-1]),  # the draw's own rate: a short step's differs from qps
            "tail": tail_parts(latencies, np.array([r[2] for r in results]))}


PARTS = ("tokenization", "queue", "inference", "total")  # the service's timing headers (ms), TEI's


def tail_parts(latencies: np.ndarray, said: np.ndarray) -> dict:
    """What the slowest requests spent their time on, against the median ones: the median of each timing header
    (ms) over the requests at or past p99 and over those between p45 and p55; `outside`: the client's latency less
    the service's own total (the socket, the event loop before the handler, the load generator itself)."""
    parts = np.column_stack([said, latencies - said[:, -1]])
    p45, p55, p99 = np.percentile(latencies, [45, 55, 99])
    groups = {"p99_and_past": latencies >= p99, "around_p50": (latencies >= p45) & (latencies <= p55)}
    return {group: {name: float(np.nanmedian(parts[chosen, column])) if chosen.any() else None
                    for column, name in enumerate((*PARTS, "outside"))} for group, chosen in groups.items()}


def http_step(url: str, pid: int, texts: list[str], tokens: list[int], qps: float, args, seed: int) -> dict:
    count = max(args.min_queries, int(qps * args.duration))
    cpu_before, front_before, model_before, began = cpu_seconds(), front_cpu(url), descendants_cpu(pid), \
        time.monotonic()
    found = uvloop.run(offered(url, texts, qps, count, seed))
    wall = time.monotonic() - began
    front, model = front_cpu(url) - front_before, descendants_cpu(pid) - model_before
    sent = sum(tokens[i % len(tokens)] for i in range(count))
    found.update(qps=qps, front_cores=front / wall, client_cores=(cpu_seconds() - cpu_before) / wall,
                 front_cpu_ms_per_request=front / count * 1e3, model_cpu_ms_per_request=model / count * 1e3,
                 real_tokens_per_s=sent / wall)
    found["passed"] = bool(found["ok"] == count and found["p99_ms"] <= args.slo
                           and found["answered_qps"] >= 0.95 * found["scheduled_qps"])
    print(f"  HTTP {qps:7.2f} QPS: p50 {found['p50_ms']:6.1f} p99 {found['p99_ms']:7.1f} ms, {found['ok']}/{count} "
          f"ok, answered {found['answered_qps']:.2f} QPS, front {found['front_cpu_ms_per_request']:.3f} ms CPU/req, "
          f"instances {found['model_cpu_ms_per_request']:.2f} ms CPU/req, load generator {found['client_cores']:.3f} "
          f"cores -> {'pass' if found['passed'] else 'miss'}", file=sys.stderr, flush=True)
    return found


def search(step, start: float, slo_ms: float) -> tuple[float | None, list[dict]]:
    """The in-process search's rules over HTTP (corescale's qps_search: bracket from `start`, a doubtful miss
    tested once more, bisect to 5 %), so that P9 divides two figures found the same way: the highest rate passed."""
    from corescale.measure import qps_search

    steps: list[dict] = []

    def judged(qps: float) -> SimpleNamespace:
        found = step(qps)
        steps.append(found)
        return SimpleNamespace(target_qps=qps, meets_slo=found["passed"], completed_qps=found["answered_qps"],
                               latency_ms={"p50": found["p50_ms"], "p99": found["p99_ms"]})

    judged_steps: list = []
    best = qps_search.search(judged, start, 0.05, 10, judged_steps, slo_ms=slo_ms).best
    for found, judgement in zip(steps, judged_steps):
        found["retest"] = bool(getattr(judgement, "retest", False))
    return best, steps


def measure_served(name: str, checkout: Path, bundle: Path, out: Path, start_qps: float, texts: list[str],
                   tokens: list[int], args) -> Served:
    print(f"{name}: corescale serve from {checkout} ...", file=sys.stderr, flush=True)
    # a first start on a cold cache: the bundle out of the page cache, no compiled model kept; the measured start
    # is a restart's (the bundle read back, the models the first start compiled)
    compiled = out / f"compiled-{name}"
    shutil.rmtree(compiled, ignore_errors=True)  # a --reuse run's
    evict(bundle)
    with serving(checkout, bundle, out / f"serve-{name}-cold-cache.log", compiled=compiled) as (_, _, _, cold_first, _):
        print(f"  cold cache: first answer {cold_first:.2f} s after the process started", file=sys.stderr)
    with serving(checkout, bundle, out / f"serve-{name}.log", "--max-queue", "100000", "--max-inputs", "1",
                 compiled=compiled) as (url, process, ready, first, front):
        print(f"  ready {ready:.2f} s, first answer {first:.2f} s after the process started", file=sys.stderr)

        def step(qps: float) -> dict:
            return http_step(url, process.pid, texts, tokens, qps, args, seed=len(texts))

        best_qps, steps = search(step, start_qps, args.slo)
        at70 = step(0.7 * best_qps) if best_qps else None
    best = max((s for s in steps if s["passed"]), key=lambda s: s["qps"], default=None)

    def at_best(key: str) -> float | None:
        return None if best is None else best[key]

    return Served(best_qps, at_best("p50_ms"), at_best("p99_ms"),
                  at70["p99_ms"] / at70["p50_ms"] if at70 else None, at_best("front_cpu_ms_per_request"),
                  at_best("model_cpu_ms_per_request"), at_best("real_tokens_per_s"), at_best("front_cores"),
                  at_best("client_cores"), first, ready, front, steps + ([{**at70, "at_70pct": True}] if at70 else []),
                  cold_first, at70["tail"] if at70 else None)


def offline_best(words: list[str], batches: list[int]) -> tuple[float | None, int | None]:
    """The same layout's offline throughput (samples/s) on the same texts with length-sorted batches, the best
    over `batches`: P7's denominator."""
    from _loop import measure

    print(f"offline, pad=sorted, batch {batches} ...", file=sys.stderr, flush=True)
    found = measure({f"b{b}": [*words, "scenario=offline", "pad=sorted", f"batch_size={b}"] for b in batches})
    rates = {b: float(found[f"b{b}"][0].metrics.throughput_samples_per_s) for b in batches}
    best = max(rates, key=lambda b: rates[b])
    print(f"  offline samples/s by batch: {rates}", file=sys.stderr, flush=True)
    return rates[best], best


def token_counts(bundle: Path, texts: list[str], limit: int) -> list[int]:
    """Each text's real tokens as the service computes them (the bundle's tokenizer, truncated to the limit)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(next(bundle.rglob("tokenizer.json"))))
    tokenizer.no_padding()
    tokenizer.enable_truncation(limit)
    return [len(e.ids) for e in tokenizer.encode_batch(texts)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--slo", type=float, default=100.0, help="p99 bound (ms)")
    parser.add_argument("--duration", type=float, default=10.0, help="LoadGen min duration and each HTTP step (s)")
    parser.add_argument("--min-queries", type=int, default=500)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--offline-batches", default="4,8,16", help="P7': the offline batch sizes tried")
    parser.add_argument("--output", default=None)
    parser.add_argument("--reuse", metavar="DIR", help="an earlier run's --output: its in-process figure and bundle "
                        "(only the HTTP search runs again)")
    parser.add_argument("--no-offline", action="store_true", help="skip P7's offline runs")
    parser.add_argument("--bundle", metavar="DIR", help="serve this bundle (e.g. corescale run --bundle DIR of the "
                        "layout) and skip the in-process search: P9 against the bundle's own in-process figure, if "
                        "its record has one (serve.json says when it was measured)")
    parser.add_argument("--start-qps", type=float, default=None, help="the HTTP search's first rate (default: the "
                        "in-process max QPS, else 100)")
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another corescale checkout whose serve is measured "
                        "the same way in this run (before/after)")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile (for serve.json)")
    parser.add_argument("overrides", nargs="*", help="the layout: backend=, instances=, cores_per_instance=, ...")
    args = parser.parse_args()

    from _loop import max_valid_qps

    from corescale.overrides import compose
    from corescale.record.files import read_result
    from corescale.serve import bundle as bundles
    from corescale.workload.corpus import texts

    out = Path(args.reuse or args.output or tempfile.mkdtemp(prefix="corescale-serve-bench-"))
    words = [f"model={args.model}", f"sequence_length={args.sequence_length}", f"duration={args.duration}",
             f"output_dir={out / 'results'}", "calibrate=false", "workload=builtin", "timeout=900",
             *(args.overrides or ["backend=onnxruntime", "instances=2", "cores_per_instance=1"])]
    cfg = compose([*words, f"server.min_query_count={args.min_queries}", "server.search_precision=0.05"])
    bundle = Path(args.bundle).resolve() if args.bundle else out / "bundle"
    if args.reuse or args.bundle:
        record = read_result(bundle / bundles.RECORD)
    else:
        print(f"in process: {args.model}, p99 <= {args.slo:g} ms ...", file=sys.stderr, flush=True)
        _, outcome = max_valid_qps(cfg, args.slo, max_batch=args.max_batch)
        record = outcome.record
        if record.server is None or record.server.max_valid_qps is None:
            raise SystemExit(f"the in-process search found no valid rate: {record.reason or 'see its record'}")
        bundles.write(bundle, record)
    local = record.server.max_valid_qps if record.server else None
    if local is None and not args.bundle:
        raise SystemExit(f"{bundle}'s record holds no in-process max QPS (measure one, or pass --bundle)")
    served_cfg = record.config  # what the bundle serves (the overrides describe it only when they match)
    if not args.no_offline and layout_of(served_cfg) != layout_of(cfg):
        raise SystemExit(f"the offline runs would measure {layout_of(cfg)}, the bundle serves {layout_of(served_cfg)}:"
                         " give the bundle's layout as overrides, or --no-offline")
    offline, offline_batch = (None, None) if args.no_offline else offline_best(
        [w for w in words if not w.startswith("server.")], [int(b) for b in args.offline_batches.split(",")])
    corpus = texts()
    tokens = token_counts(bundle, corpus, args.sequence_length)
    start = args.start_qps or local or 100.0
    out.mkdir(parents=True, exist_ok=True)
    served = measure_served("this", ROOT, bundle, out, start, corpus, tokens, args)
    baseline = None if not args.baseline else measure_served("baseline", Path(args.baseline).resolve(), bundle,
                                                             out, start, corpus, tokens, args)
    env = record.environment
    figures = Figures(
        p7=served.max_qps / offline if served.max_qps and offline else None,
        p9=served.max_qps / local if served.max_qps and local else None, real_tokens_per_s=served.real_tokens_per_s,
        front_cpu_ms_per_request=served.front_cpu_ms_per_request,
        model_cpu_ms_per_request=served.model_cpu_ms_per_request,
        p99_over_p50_at_70pct=served.p99_over_p50_at_70pct, cold_start_s=served.cold_start_s, in_process_qps=local,
        offline_samples_per_s=offline, offline_batch=offline_batch,
        layout={**layout_of(served_cfg), "max_batch": served_cfg.server.max_batch,
                "sequence_length": served_cfg.sequence_length, "pad": served_cfg.pad,
                "queue_delay": served_cfg.server.queue_delay, "max_queue_ms": served_cfg.server.max_queue_ms,
                "front": served.front},
        cpu=f"{env.cpu.model} ({env.topology.physical_cores} cores)", slo_p99_ms=args.slo, model=args.model,
        served=served, baseline=baseline, machine_note=args.note, cold_start_cold_cache_s=served.cold_cache_start_s,
        in_process_started_at=record.started_at if local is not None else None)
    (out / "serve.json").write_text(json.dumps(figures.to_json(), indent=2) + "\n")
    print(table(figures))
    print(f"\nresults, bundle and serve.json: {out}")
    return 0


def layout_of(cfg) -> dict:
    """What the offline runs and the service must share: the backend, its precision and the instances."""
    return {"backend": cfg.backend.name, "precision": cfg.precision, "instances": cfg.instances,
            "cores_per_instance": cfg.cores_per_instance}


def table(f: Figures) -> str:
    def num(value, spec=".2f") -> str:
        return "-" if value is None else format(value, spec)

    rows = [("", "this", "baseline" if f.baseline else None)]
    lines = [f"{f.model} on {f.cpu}, {f.layout}, p99 <= {f.slo_p99_ms:g} ms, built-in text", "",
             "| | " + " | ".join(r for r in rows[0][1:] if r) + " | goal |",
             "|---|" + "---:|" * (3 if f.baseline else 2)]
    services = [f.served] + ([f.baseline] if f.baseline else [])
    for label, key, spec, goal in [("max QPS over HTTP", "max_qps", ".1f", ""),
                                   ("P9 (HTTP ÷ in process)", "p9", ".2f", ">= 0.95"),
                                   ("P7' (HTTP ÷ best offline, sorted)", "p7", ".2f", ">= 0.75"),
                                   ("front CPU ms/request", "front_cpu_ms_per_request", ".3f", "<= 0.3 or model÷10"),
                                   ("instances' CPU ms/request", "model_cpu_ms_per_request", ".2f", ""),
                                   ("real tokens/s", "real_tokens_per_s", ".0f", ">= 3x fixed-128"),
                                   ("p99 ÷ p50 at 70 %", "p99_over_p50_at_70pct", ".2f", "<= 3"),
                                   ("cold start (s, to first 200)", "cold_start_s", ".2f", "<= 2"),
                                   ("cold start, cold cache (s)", "cold_cache_start_s", ".2f", ""),
                                   ("ready (s)", "ready_s", ".2f", "")]:
        cells = []
        for s in services:
            value = getattr(s, key, None)
            if key == "p9":
                value = s.max_qps / f.in_process_qps if s.max_qps and f.in_process_qps else None
            if key == "p7":
                value = s.max_qps / f.offline_samples_per_s if s.max_qps and f.offline_samples_per_s else None
            cells.append(num(value, spec))
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {goal} |")
    when = f.in_process_started_at or "-"
    lines.append(f"\nin process {num(f.in_process_qps, '.1f')} QPS (measured {when}); offline best "
                 f"{num(f.offline_samples_per_s, '.1f')} samples/s at batch {f.offline_batch} (pad=sorted)")
    for name, s in zip(("this", "baseline"), services):
        for group, parts in (s.tail_at_70pct or {}).items():
            lines.append(f"{name} at 70 %, {group.replace('_', ' ')} (median ms): " + ", ".join(
                f"{part} {num(value, '.1f')}" for part, value in parts.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
