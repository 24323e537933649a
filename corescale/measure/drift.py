"""Drift check: a backend's last hidden state against a reference backend on identical inputs.

max_rel_error is max |a - b| / (1 + |b|): relative where values are large, absolute near zero (a plain
|a - b| / |b| explodes on the many hidden-state values close to 0). Tolerances by the precision of the
backend under test: its registry entry's drift_tolerance and min_cosine (machine/precisions.py, with the
measurements behind them); drift_tolerance= replaces the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from corescale.machine.precisions import PRECISIONS, REFERENCE

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def drift_metrics(output: np.ndarray, reference: np.ndarray, precision: str,
                  tolerance: float | None = None) -> dict:
    """Error statistics; within_tolerance needs max_rel_error <= tolerance and cosine >= the precision's minimum."""
    facts = PRECISIONS[precision]
    tolerance = facts.drift_tolerance if tolerance is None else tolerance
    if output.shape != reference.shape:  # a backend bug, not drift
        raise RuntimeError(f"output shape {list(output.shape)} != reference shape {list(reference.shape)}")
    out = output.astype(np.float64).ravel()
    ref = reference.astype(np.float64).ravel()
    diff = np.abs(out - ref)
    scaled = float((diff / (1.0 + np.abs(ref))).max())
    cosine = float(out @ ref / (np.linalg.norm(out) * np.linalg.norm(ref) or 1.0))
    ok = bool(scaled <= tolerance and cosine >= facts.min_cosine)  # NaN compares False: fails
    return {
        "max_abs_error": float(diff.max()),
        "mean_abs_error": float(diff.mean()),
        "max_rel_error": scaled,
        "cosine_similarity": cosine,
        "tolerance": tolerance,
        "min_cosine": facts.min_cosine,
        "within_tolerance": ok,
    }


def compare_with_reference(cfg: BenchmarkConfig, model, threads: int, inputs, output: np.ndarray) -> dict:
    """Runs the reference backend at fp32 in this process (after the timed window) and compares."""
    import dataclasses

    from corescale.backends import OPTIONS, create_backend

    name = cfg.reference_backend
    assert name is not None, "called for a config with a reference"
    ref_cfg = dataclasses.replace(cfg, backend=OPTIONS[name](), precision=REFERENCE, reference=None)
    reference = create_backend(name)
    reference.load(model, ref_cfg, threads, inputs)
    ref_out = reference.to_numpy(reference.forward(reference.prepare(inputs)))
    metrics = drift_metrics(output, ref_out, cfg.precision, cfg.drift_tolerance)
    metrics["reference"] = name
    return metrics
