"""Drift check: a backend's last hidden state against a reference backend on identical inputs."""

from __future__ import annotations

import numpy as np

# max |a - b| / (1 + |b|), by the precision of the backend under test
TOLERANCES = {"fp32": 1e-3, "bf16": 1e-1, "int8": 2.5e-1}
MIN_COSINE = {"fp32": 0.99999, "bf16": 0.99, "int8": 0.98}


def drift_metrics(output: np.ndarray, reference: np.ndarray, precision: str) -> dict:
    out = output.astype(np.float64).ravel()
    ref = reference.astype(np.float64).ravel()
    diff = np.abs(out - ref)
    scaled = float((diff / (1.0 + np.abs(ref))).max())
    cosine = float(out @ ref / (np.linalg.norm(out) * np.linalg.norm(ref) or 1.0))
    ok = scaled <= TOLERANCES[precision] and cosine >= MIN_COSINE[precision]
    return {
        "max_abs_error": float(diff.max()),
        "mean_abs_error": float(diff.mean()),
        "max_rel_error": scaled,
        "cosine_similarity": cosine,
        "tolerance": TOLERANCES[precision],
        "min_cosine": MIN_COSINE[precision],
        "within_tolerance": bool(ok),
    }


def compare_with_reference(cfg, model, threads: int, inputs, output: np.ndarray) -> dict:
    """Runs the reference backend at fp32 in this process (after the timed window) and compares."""
    import dataclasses

    from corescale.backends import create_backend

    ref_cfg = dataclasses.replace(cfg, backend=cfg.reference, precision="fp32", reference=None)
    reference = create_backend(cfg.reference)
    reference.load(model, ref_cfg, threads, inputs)
    ref_out = reference.to_numpy(reference.forward(reference.prepare(inputs)))
    metrics = drift_metrics(output, ref_out, cfg.precision)
    metrics["reference"] = cfg.reference
    return metrics
