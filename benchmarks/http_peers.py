"""Servers over HTTP on this machine: max QPS under one p99 SLO, each driven by `scenario=server endpoint=URL`.

    python benchmarks/http_peers.py [--slo-p99-ms 200] [--duration 5] [--min-queries 600]
        [--st]                                 start benchmarks/peer_servers/st_fastapi.py with --model
        [--infinity BIN]                       start `BIN v2 --model-id DIR` (infinity-emb, its own virtualenv)
        [--model DIR]                          default: all-minilm-l6-v2 as `model=` resolves it (the package)
        [--peer NAME=URL[@openai|@tei] ...]    and/or servers already running (corescale serve, TEI, ...)
        [--corescale "OVERRIDES"]              corescale serve on that layout, as a tune's trial starts it
                                               (endpoint=managed: started, measured over api=tei, stopped)
        [--aiperf BIN [--aiperf-tokenizer HUB_ID] [--aiperf-requests N]]
                                               a second client: NVIDIA AIPerf (its own virtualenv) at each
                                               server's max valid QPS, POST /v1/embeddings, the same texts

Servers the script starts run one at a time (only the measured one is up) on every CPU this process may use; the
load generator (LoadGen + the aiohttp client) shares them, and its CPU is reported. For each: `target_qps=auto` at
p99 <= the SLO on the built-in corpus, one text per request, the same LoadGen rules as the in-process server
scenario. Prints a markdown table: max valid QPS, its p99, the server's breakdown where it sends timing headers,
errors, the client's CPU, and the CPU it ran on.

With --aiperf, each server is also driven by a load generator corescale did not write: `aiperf profile
--endpoint-type embeddings --request-rate QPS` (Poisson) at the rate LoadGen found, on the built-in corpus (one
text per request, `single_turn`), for --aiperf-requests requests; its p50/p99, achieved rate and errors go beside
LoadGen's. AIPerf loads its tokenizer by hub id only (a local folder is refused): offline, set HF_HOME to a
Hugging Face cache that holds it and HF_HUB_OFFLINE=1. A corescale layout is started again for it
(`corescale serve OVERRIDES`, LoadGen's trial having stopped its own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure_one(name: str, url: str, api: str, args, *layout: str) -> dict:
    """`url`: a running server's, or `managed` (`layout`: the overrides of the corescale serve each trial starts)."""
    from _loop import measure

    overrides = ["scenario=server", "target_qps=auto", f"slo_p99_ms={args.slo_p99_ms}", f"endpoint={url}",
                 f"api={api}", *layout, f"duration={args.duration}", f"server.min_query_count={args.min_queries}",
                 f"server.search_precision={args.precision}", f"server.max_steps={args.max_steps}",
                 *([f"server.max_search_s={args.max_search_s:g}"] if getattr(args, "max_search_s", None) else []),
                 *([] if layout else [f"model={args.model_field}"]), f"output_dir={args.output}"]
    record = measure({name: overrides})[name][0]
    return row(name, record)


def aiperf_at(args, name: str, url: str, qps: float | None) -> dict:
    """AIPerf's figures for `url` at `qps` (Poisson): p50, p99 (ms), achieved requests/s, errors."""
    if not args.aiperf or not qps:
        return {}
    from corescale.workload.corpus import texts

    out = Path(args.output) / "aiperf" / "".join(c if c.isalnum() else "-" for c in name)
    out.mkdir(parents=True, exist_ok=True)
    inputs = out / "texts.jsonl"
    inputs.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts()))
    command = [args.aiperf, "profile", "--endpoint-type", "embeddings", "--url", url, "--model", args.model_field,
               "--custom-dataset-type", "single_turn", "--input-file", str(inputs), "--request-rate", f"{qps:g}",
               "--request-count", str(args.aiperf_requests), "--tokenizer", args.aiperf_tokenizer,
               "--random-seed", "1", "--output-artifact-dir", str(out), "--ui-type", "none"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    try:
        report = json.loads((out / "profile_export_aiperf.json").read_text())
    except (OSError, ValueError):
        return {"aiperf": f"failed (exit {done.returncode}): {done.stdout[-300:]} {done.stderr[-300:]}"}
    latency = report.get("request_latency") or {}
    errors = (report.get("error_request_count") or {}).get("avg") or 0
    return {"aiperf": f"{latency.get('p50', float('nan')):.1f} / {latency.get('p99', float('nan')):.1f} ms, "
                      f"{(report.get('request_throughput') or {}).get('avg', float('nan')):.1f} req/s, "
                      f"{errors:g} errors"}


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
             "server breakdown, mean ms | errors | LoadGen tests | client CPU (cores) | AIPerf at that QPS: "
             "p50 / p99, rate, errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {num(r['qps'], '.4g')} | {num(r['p50'])} / {num(r['p99'])} | "
                     f"{num(r['single'])} | {num(r['response'])} | {r['breakdown']} | {r['errors']} | {r['steps']} | "
                     f"{num(r['client'], '.2f')} | {r.get('aiperf', '-')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slo-p99-ms", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=5.0, help="LoadGen's minimum duration per test (s)")
    parser.add_argument("--min-queries", type=int, default=600, help="LoadGen's minimum query count per test")
    parser.add_argument("--precision", type=float, default=0.1, help="server.search_precision")
    parser.add_argument("--max-steps", type=int, default=8, help="server.max_steps")
    parser.add_argument("--max-search-s", type=float, help="server.max_search_s: bound each server's QPS search (s)")
    parser.add_argument("--model-field", default="all-MiniLM-L6-v2", help="the `model` OpenAI requests carry")
    parser.add_argument("--st", action="store_true", help="start and measure the sentence-transformers FastAPI peer")
    parser.add_argument("--infinity", help="start and measure this infinity_emb executable (its own virtualenv)")
    parser.add_argument("--model", help="the model directory the started servers serve (default: all-minilm-l6-v2)")
    parser.add_argument("--peer", action="append", default=[], help="NAME=URL[@openai|@tei], already running")
    parser.add_argument("--corescale", action="append", default=[], metavar="OVERRIDES",
                        help="measure `corescale serve OVERRIDES` through endpoint=managed, e.g. "
                             "'model=all-minilm-l6-v2 backend=onnxruntime instances=2 cores_per_instance=1'")
    parser.add_argument("--output", default="outputs/http-peers")
    parser.add_argument("--aiperf", metavar="BIN", help="also drive each server with this aiperf executable")
    parser.add_argument("--aiperf-tokenizer", default="sentence-transformers/all-MiniLM-L6-v2",
                        help="the tokenizer AIPerf counts tokens with (a hub id)")
    parser.add_argument("--aiperf-requests", type=int, default=600)
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
            rows[-1].update(aiperf_at(args, rows[-1]["server"], url, rows[-1]["qps"]))
    if args.infinity:
        port = free_port()
        command = [args.infinity, "v2", "--model-id", args.model, "--port", str(port),
                   "--host", "127.0.0.1", "--url-prefix", "/v1", "--served-model-name", args.model_field,
                   "--device", "cpu"]
        with started(command, port, "/health") as url:
            rows.append(measure_one("infinity-emb", url, "openai", args))
            rows[-1].update(aiperf_at(args, rows[-1]["server"], url, rows[-1]["qps"]))
    for layout in args.corescale:
        rows.append(measure_one(f"corescale serve {layout}", "managed", "tei", args, *layout.split()))
        if args.aiperf and rows[-1]["qps"]:
            port = free_port()
            command = [sys.executable, "-m", "corescale", "serve", *layout.split(), "--port", str(port)]
            with started(command, port, "/health") as url:
                rows[-1].update(aiperf_at(args, rows[-1]["server"], url, rows[-1]["qps"]))
    for peer in args.peer:
        name, _, target = peer.partition("=")
        url, _, api = target.partition("@")
        rows.append(measure_one(name, url, api or "openai", args))
        rows[-1].update(aiperf_at(args, name, url, rows[-1]["qps"]))
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
