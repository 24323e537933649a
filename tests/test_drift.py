"""Drift check: its statistics, its tolerances, and a real run marked failed when over tolerance."""

import json

import numpy as np
import pytest
from helpers import FAST, corescale

from corescale.machine.precisions import PRECISIONS
from corescale.measure.drift import drift_metrics

RNG = np.random.default_rng(0)
REF = RNG.normal(size=(2, 8, 16)).astype(np.float32)


def test_identical_outputs_have_no_drift():
    m = drift_metrics(REF.copy(), REF, "fp32")
    assert m["max_abs_error"] == m["mean_abs_error"] == m["max_rel_error"] == 0.0
    assert m["cosine_similarity"] == pytest.approx(1.0) and m["within_tolerance"]


def test_statistics():
    out = REF.copy()
    out[0, 0, 0] += 0.5
    m = drift_metrics(out, REF, "bf16")
    assert m["max_abs_error"] == pytest.approx(0.5, rel=1e-6)
    assert m["mean_abs_error"] == pytest.approx(0.5 / REF.size, rel=1e-6)
    assert m["max_rel_error"] == pytest.approx(0.5 / (1 + abs(REF[0, 0, 0])), rel=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_tolerance_depends_on_precision(precision):
    tolerance = {name: p.drift_tolerance for name, p in PRECISIONS.items()}
    signs = RNG.choice([-1.0, 1.0], size=REF.shape)

    def off_by(fraction):  # every value off by `fraction` of the tolerance, in max_rel_error's own scale
        return REF + signs * fraction * tolerance[precision] * (1 + np.abs(REF))
    inside = drift_metrics(off_by(0.2), REF, precision)
    assert inside["max_rel_error"] == pytest.approx(0.2 * tolerance[precision], rel=1e-3)
    assert inside["within_tolerance"], inside
    assert not drift_metrics(off_by(2), REF, precision)["within_tolerance"]
    assert tolerance["fp32"] < tolerance["bf16"] < tolerance["int8"]


def test_explicit_tolerance_overrides_the_precision_default():
    out = REF + 1e-3
    assert not drift_metrics(out, REF, "fp32")["within_tolerance"]
    assert drift_metrics(out, REF, "fp32", tolerance=1e-2)["within_tolerance"]


def test_noise_and_nan_fail():
    assert not drift_metrics(RNG.normal(size=REF.shape).astype(np.float32), REF, "int8")["within_tolerance"]
    broken = REF.copy()
    broken[1, 2, 3] = np.nan
    assert not drift_metrics(broken, REF, "int8")["within_tolerance"]


def test_shape_mismatch_is_an_error_not_drift():
    with pytest.raises(RuntimeError, match="shape"):
        drift_metrics(REF[:1], REF, "fp32")


@pytest.mark.slow
def test_run_over_tolerance_is_marked_failed(tmp_path):
    """int8 against fp32 with a tolerance no quantized model can meet: the run is recorded, as failed."""
    out = tmp_path / "out"
    proc = corescale("run", "--no-progress", *FAST, "precision=int8", "reference=pytorch",
                     "drift_tolerance=1e-6", f"output_dir={out}")
    assert proc.returncode == 1, proc.stderr
    assert "outputs drift from pytorch" in proc.stderr
    (run,) = out.iterdir()
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "failed" and "drift" in record["reason"]
    drift = record["drift"]
    assert drift["tolerance"] == 1e-6 and drift["max_rel_error"] > 1e-6 and not drift["within_tolerance"]
    assert {"max_abs_error", "mean_abs_error", "max_rel_error", "cosine_similarity"} <= set(drift)


@pytest.mark.slow
def test_drift_tolerance_must_be_positive(tmp_path):
    proc = corescale("run", "--no-progress", *FAST, "reference=pytorch", "drift_tolerance=0",
                     f"output_dir={tmp_path}")
    assert proc.returncode == 2 and "drift_tolerance must be > 0" in proc.stderr
