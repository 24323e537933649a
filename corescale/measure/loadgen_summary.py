"""The record's `server` section from what a served trial's LoadGen tests saw (in process or over HTTP), and the
batches it formed as CSV."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from corescale.measure.qps_search import floor_qps, knee, load_curve

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig
    from corescale.measure.loadgen import ServeOutcome


def summarise(cfg: BenchmarkConfig, outcome: ServeOutcome, queries: dict, endpoint: dict | None = None) -> dict:
    """The record's `server` section (`endpoint`: the server measured over HTTP, as it describes itself)."""
    steps = [s.to_json() for s in outcome.steps]
    met = [s for s in steps if s["meets_slo"] and s["target_qps"] is not None]
    curve = load_curve(steps)
    rows = np.array([r[3] for r in outcome.batch_rows] or [0])
    lengths = np.array([r[4] for r in outcome.batch_rows] or [0])
    real = float(sum(r[5] for r in outcome.batch_rows))
    padded = float((rows * lengths).sum())
    wall = sum(s["duration_s"] for s in steps)
    cpu = sum(s["parent_cpu_s"] for s in steps)
    last = steps[-1] if steps else {}
    summary = {
        "scenario": cfg.scenario, "target_qps": cfg.target_qps, "slo_p99_ms": cfg.slo_p99_ms,
        "validity": last.get("validity") if cfg.target_qps != "auto" else ("VALID" if met else "INVALID"),
        "max_valid_qps": max((s["target_qps"] for s in met), default=None),
        "latency_ms": (max(met, key=lambda s: s["target_qps"]) if met else last).get("latency_ms", {}),
        "steps": steps, "load_curve": curve, "knee_qps": knee(curve), "search_floor_qps": floor_qps(cfg),
        "unreachable": outcome.unreachable, "bounded": outcome.bounded, "unestablished": outcome.unestablished,
        "capacity": outcome.capacity, "skipped": outcome.skipped,
        "batching": None if cfg.endpoint else {  # over HTTP the server batches, out of sight
            "max_batch": cfg.server.max_batch, "max_queue_ms": cfg.server.max_queue_ms,
            "max_batch_tokens": cfg.server.max_batch_tokens, "max_padding": cfg.server.max_padding, "pad": cfg.pad,
            "batches": len(outcome.batch_rows),
            "mean_rows": float(rows.mean()), "max_rows": int(rows.max()),
            "padding_waste": 1 - real / padded if padded else 0.0, "queue_delay": cfg.server.queue_delay,
            "real_tokens": int(real), "padded_tokens": int(padded), "rows_histogram": histogram(rows),
            "padded_length_histogram": histogram(lengths)},
        "parent": {"cpu_seconds": cpu, "wall_seconds": wall, "cores_used": cpu / wall if wall else None},
        "queries": queries,
        "errors": sum(s["errors"] for s in steps),
        "endpoint": endpoint,
    }
    if cfg.scenario == "single_stream":
        summary["max_valid_qps"] = None
    return summary


def histogram(values: np.ndarray) -> dict[str, int]:
    """Each value's count, smallest first (none for no calls)."""
    found, counts = np.unique(values[values > 0], return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(found, counts)}


def batches_csv(rows: list[tuple]) -> bytes:
    header = ("step,instance,batch,rows,padded_length,real_tokens,first_arrival_ns,taken_ns,instance_start_ns,"
              "instance_end_ns,completed_ns\n")
    return (header + "".join(",".join(map(str, r)) + "\n" for r in rows)).encode()

