"""Servers over HTTP on this machine: max QPS under one p99 SLO, each driven by `scenario=server endpoint=URL`.

    python benchmarks/http_peers.py [--slo-p99-ms 200] [--duration 5] [--min-queries 600]
        [--st]                                 start benchmarks/peer_servers/st_fastapi.py with --model
        [--infinity BIN]                       start `BIN v2 --model-id DIR` (infinity-emb, its own virtualenv)
        [--model DIR]                          default: all-minilm-l6-v2 as `model=` resolves it (the package)
        [--peer NAME=URL[@openai|@tei] ...]    and/or servers already running (corescale serve, TEI, ...)
        [--corescale "OVERRIDES"]              corescale serve on that layout, as a tune's trial starts it
                                               (endpoint=managed: started, measured over api=tei, stopped)

Servers the script starts run one at a time (only the measured one is up) on every CPU this process may use; the
load generator (LoadGen + the aiohttp client) shares them, and its CPU is reported. For each: `target_qps=auto` at
p99 <= the SLO on the built-in corpus, one text per request, the same LoadGen rules as the in-process server
scenario. Prints a markdown table: max valid QPS, its p99, the server's breakdown where it sends timing headers,
errors, the client's CPU, and the CPU it ran on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure_one(name: str, url: str, api: str, args, *layout: str) -> dict:
    """`url`: a running server's, or `managed` (`layout`: the overrides of the corescale serve each trial starts)."""
    from _loop import measure

    overrides = ["scenario=server", "target_qps=auto", f"slo_p99_ms={args.slo_p99_ms}", f"endpoint={url}",
                 f"api={api}", *layout, f"duration={args.duration}", f"server.min_query_count={args.min_queries}",
                 f"server.search_precision={args.precision}", f"server.max_steps={args.max_steps}",
                 *([] if layout else [f"model={args.model_field}"]), f"output_dir={args.output}"]
    record = measure({name: overrides})[name][0]
    return row(name, record)


def row(name: str, record) -> dict:
    s = record.server
    best = [st for st in s.steps if st.target_qps == s.max_valid_qps] or s.steps[-1:]
    step = best[-1] if best else None
    http = step.http if step else None
    breakdown = s.unreachable or "-"
    if http and http.server_ms:
        breakdown = " / ".join(f"{k} {v.mean:.1f}" for k, v in http.server_ms.items() if k != "total")
    response = http.client_ms.get("response") if http else None
    latency = step.latency_ms if step else {}
    return {"server": name, "url": s.endpoint.url if s.endpoint else "", "qps": s.max_valid_qps,
            "p99": latency.get("p99"), "p50": latency.get("p50"),
            "response": response.mean if response else None, "breakdown": breakdown, "errors": s.errors,
            "steps": len(s.steps), "client": s.parent.cores_used, "cpu": record.environment.cpu.model,
            "single": s.endpoint.single_ms if s.endpoint else None}


def table(rows: list[dict], args) -> str:
    def num(value, spec=".1f") -> str:
        return "-" if value is None else format(value, spec)

    lines = [f"max QPS at p99 <= {args.slo_p99_ms:g} ms, built-in corpus, one text per request "
             f"(CPU: {rows[0]['cpu'] if rows else '?'}, {len(os.sched_getaffinity(0))} CPUs)", "",
             "| server | max valid QPS | p50 / p99 (ms) | one request alone (ms) | response, client (ms) | "
             "server breakdown, mean ms | errors | LoadGen tests | client CPU (cores) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {num(r['qps'], '.4g')} | {num(r['p50'])} / {num(r['p99'])} | "
                     f"{num(r['single'])} | {num(r['response'])} | {r['breakdown']} | {r['errors']} | {r['steps']} | "
                     f"{num(r['client'], '.2f')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slo-p99-ms", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=5.0, help="LoadGen's minimum duration per test (s)")
    parser.add_argument("--min-queries", type=int, default=600, help="LoadGen's minimum query count per test")
    parser.add_argument("--precision", type=float, default=0.1, help="server.search_precision")
    parser.add_argument("--max-steps", type=int, default=8, help="server.max_steps")
    parser.add_argument("--model-field", default="all-MiniLM-L6-v2", help="the `model` OpenAI requests carry")
    parser.add_argument("--st", action="store_true", help="start and measure the sentence-transformers FastAPI peer")
    parser.add_argument("--infinity", help="start and measure this infinity_emb executable (its own virtualenv)")
    parser.add_argument("--model", help="the model directory the started servers serve (default: all-minilm-l6-v2)")
    parser.add_argument("--peer", action="append", default=[], help="NAME=URL[@openai|@tei], already running")
    parser.add_argument("--corescale", action="append", default=[], metavar="OVERRIDES",
                        help="measure `corescale serve OVERRIDES` through endpoint=managed, e.g. "
                             "'model=all-minilm-l6-v2 backend=onnxruntime instances=2 cores_per_instance=1'")
    parser.add_argument("--output", default="outputs/http-peers")
    args = parser.parse_args()

    sys.path[:0] = [str(HERE), str(HERE / "peer_servers")]
    from peer_launch import free_port, started

    if args.model is None:
        from corescale.workload.packaged import packaged_model

        args.model = str(packaged_model("all-minilm-l6-v2", os.path.expanduser("~/.cache/corescale")))
    rows = []
    if args.st:
        port = free_port()
        command = [sys.executable, str(HERE / "peer_servers" / "st_fastapi.py"), "--model", args.model,
                   "--port", str(port)]
        with started(command, port, "/health") as url:
            rows.append(measure_one("sentence-transformers + FastAPI", url, "openai", args))
    if args.infinity:
        port = free_port()
        command = [args.infinity, "v2", "--model-id", args.model, "--port", str(port),
                   "--host", "127.0.0.1", "--url-prefix", "/v1", "--served-model-name", args.model_field,
                   "--device", "cpu"]
        with started(command, port, "/health") as url:
            rows.append(measure_one("infinity-emb", url, "openai", args))
    for layout in args.corescale:
        rows.append(measure_one(f"corescale serve {layout}", "managed", "tei", args, *layout.split()))
    for peer in args.peer:
        name, _, target = peer.partition("=")
        url, _, api = target.partition("@")
        rows.append(measure_one(name, url, api or "openai", args))
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
