"""An explained configuration: the profile of its calls (explain/run.py) turned into time by op class, the GEMM
class's rate against the machine's peak, the roofline position and the findings; saved as JSON, never as a timing
result (`kind: explain`, under <output_dir>/explain/, which the results store does not read)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.explain.findings import findings
from corescale.explain.opclasses import ALL_CLASSES, OP_CLASSES, breakdown, classify
from corescale.machine.roofline import position
from corescale.record.files import slug, write_json_atomic
from corescale.workload.flops import class_flops, forward_flops
from corescale.workload.memory import traffic_bytes

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

CLOSURE_TOLERANCE = 0.05  # op classes + overhead must equal the measured latency within this fraction
EXPLAIN_DIR = "explain"


def label(cfg: BenchmarkConfig) -> str:
    changed = " ".join(f"{k}={v}" for k, v in cfg.backend.changed().items())
    return f"{cfg.backend.name} {changed}".strip()


def median_call(calls: list[dict]) -> dict:
    ordered = sorted(calls, key=lambda c: c["wall_us"])
    return ordered[(len(ordered) - 1) // 2]


def explain(profile: dict, cfg: BenchmarkConfig, model) -> dict:
    """Everything `explain` shows and saves about one configuration."""
    batch, length = cfg.instance_batch_size, cfg.sequence_length
    call = median_call(profile["calls"])
    ops = [{**op, "class": classify(op["op"], op.get("name", ""), op.get("shapes"))} for op in call["ops"]]
    times = breakdown(ops, call["wall_us"])
    latency_us = statistics.median(profile["latencies_us"])
    peak = profile["instance"].get("peak") or {}
    known = model.sizes_known  # a model file without config.json: its FLOPs are unknown, so are rates and roofs
    flops = class_flops(model, batch, length)
    gemm_gflops = flops["gemm"] / (times["gemm"] * 1e3) if times["gemm"] > 0 and known else None
    efficiency = gemm_gflops / peak["gflops"] if gemm_gflops and peak.get("gflops") else None
    total_flops = forward_flops(model, batch, length)
    roof = position(total_flops / (latency_us * 1e3), total_flops, traffic_bytes(model, batch, length, cfg.precision),
                    [peak]) if peak and known else None
    closure = sum(times.values()) / latency_us
    result = {
        "kind": "explain", "profiling_run": True, "note": "profiling run: not a timing result",
        "label": label(cfg), "backend": cfg.backend.name, "backend_options": cfg.backend.options(),
        "model": cfg.model, "precision": cfg.precision, "batch_size": batch, "sequence_length": length,
        "cpus": profile["instance"]["cpus"], "threads": profile["instance"]["threads"],
        "profiler": profile["profiler"], "latency_ms": latency_us / 1e3, "latency_calls": len(profile["latencies_us"]),
        "profiled_calls": len(profile["calls"]), "profiled_wall_ms": call["wall_us"] / 1e3,
        "classes_ms": {c: times[c] / 1e3 for c in ALL_CLASSES},
        "shares": {c: times[c] / call["wall_us"] for c in ALL_CLASSES},
        "closure": closure, "within_tolerance": abs(closure - 1) <= CLOSURE_TOLERANCE,
        "gemm": {"flops": flops["gemm"], "gflops": gemm_gflops, "peak_gflops": peak.get("gflops"),
                 "efficiency": efficiency, "peak_library": peak.get("library"), "libraries": peak.get("libraries", {})},
        "roofline": roof, "ops": sorted(ops, key=lambda op: -op["us"]), "linear_rates": profile.get("linear_rates"),
        "framework": profile.get("framework"), "stage_seconds": profile.get("stage_seconds"),
        "warmup_converged": profile.get("warmup_converged"), "config": cfg.to_dict(),
    }
    result["findings"] = findings(facts(result))
    return result


def facts(result: dict) -> dict:
    """The flat facts the finding rules read."""
    gemm, roof, libraries = result["gemm"], result["roofline"] or {}, result["gemm"]["libraries"] or {}
    found = {"backend": result["backend"], "linear": result["backend_options"].get("linear", "default"),
             "precision": result["precision"], "batch_size": result["batch_size"],
             "sequence_length": result["sequence_length"], "latency_ms": result["latency_ms"],
             "profiled_wall_ms": result["profiled_wall_ms"], "closure": result["closure"],
             "overhead_ms": result["classes_ms"]["overhead"], "gemm_gflops": gemm["gflops"],
             "peak_gflops": gemm["peak_gflops"], "peak_library": gemm["peak_library"],
             "gemm_efficiency": gemm["efficiency"], "torch_mm_gflops": libraries.get("torch_mm"),
             "torch_onednn_gflops": libraries.get("torch_onednn"), "bound": roof.get("bound"),
             "intensity": roof.get("intensity_flops_per_byte"), "ridge": roof.get("ridge_flops_per_byte"),
             "attainable_gflops": roof.get("attainable_gflops"), "bandwidth_gbps": roof.get("bandwidth_gbps"),
             "linear_default_gflops": (result.get("linear_rates") or {}).get("default_gflops"),
             "linear_onednn_gflops": (result.get("linear_rates") or {}).get("onednn_gflops")}
    found.update({f"share_{c}": result["shares"][c] for c in ALL_CLASSES})
    return found


def save(results: list[dict], root: Path) -> Path:
    """<root>/explain/<stamp>-<model>-<labels>.json, written whole."""
    folder = Path(root).expanduser() / EXPLAIN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    names = "-".join(slug(r["label"].replace(" ", "_")) for r in results)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"{stamp}-{slug(results[0]['model'])}-b{results[0]['batch_size']}-{names}"[:200]
    return write_json_atomic(path.with_suffix(".json"), {"kind": "explain", "profiling_run": True,
                                                         "configurations": results})


def load_saved(root: Path) -> tuple[list[dict], list[str]]:
    """Every saved explanation under <root>/explain/, oldest first, and why each other file there was skipped
    (unreadable, not JSON, not an explanation)."""
    from corescale.errors import UserError
    from corescale.userfiles import read_json

    found, skipped = [], []
    for path in sorted((Path(root) / EXPLAIN_DIR).glob("*.json")):
        try:
            data = read_json(path, "explain file")
        except UserError as exc:
            skipped.append(str(exc))
            continue
        if isinstance(data, dict) and data.get("kind") == "explain" and isinstance(data.get("configurations"), list):
            found.append({**data, "path": str(path)})
        else:
            skipped.append(f"'{path}' is not a corescale explanation (an object of kind explain with configurations)")
    return found, skipped


__all__ = ["OP_CLASSES", "explain", "facts", "save", "load_saved", "label"]
