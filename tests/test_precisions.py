"""PyTorch reduced precisions through the real CLI, checked against fp32 eager by the drift check."""

import json

import numpy as np
import pytest
import torch
from helpers import FAST, corescale

from corescale.backends import create_backend
from corescale.config import BenchmarkConfig
from corescale.measure.drift import drift_metrics
from corescale.workload.inputs import make_inputs
from corescale.workload.models import resolve_model

HAS_INT8_ENGINE = any(e != "none" for e in torch.backends.quantized.supported_engines)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sweep: pytorch at bf16 and int8, each compared with fp32 eager on the same inputs."""
    out = tmp_path_factory.mktemp("precisions")
    precisions = "bf16,int8" if HAS_INT8_ENGINE else "bf16"
    proc = corescale("run", "-m", "--no-progress", *FAST, f"precision={precisions}", "reference=pytorch",
                     "padding_fraction=0.25", f"output_dir={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in out.glob("*/result.json")]
    return {r["config"]["precision"]: r for r in records}


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.slow
def test_reduced_precision_runs_within_its_tolerance(sweep, precision):
    if precision == "int8" and not HAS_INT8_ENGINE:
        pytest.skip(f"no quantized engine in this PyTorch build ({torch.backends.quantized.supported_engines})")
    record = sweep[precision]
    drift = record["drift"]
    assert record["status"] == "ok" and drift["within_tolerance"], drift
    assert drift["tolerance"] > 1e-3  # the precision's looser tolerance, not fp32's
    assert drift["max_abs_error"] > 1e-4, drift  # it really ran at reduced precision
    stages = record["instance_reports"][0]["stage_seconds"]
    assert ("quantize" in stages) == (precision == "int8")


def test_torchscript_traces_under_bf16_autocast():
    spec = resolve_model("bert-tiny")
    inputs = make_inputs(spec, 2, 16, seed=0)

    def output(backend, precision):
        b = create_backend(backend)
        b.load(spec, BenchmarkConfig(model="bert-tiny", backend=backend, precision=precision), 1, inputs)
        return b, b.to_numpy(b.forward(b.prepare(inputs)))

    _, reference = output("pytorch", "fp32")
    traced, out = output("torchscript", "bf16")
    metrics = drift_metrics(out, reference, "bf16")
    assert metrics["within_tolerance"] and metrics["max_abs_error"] > 1e-4, metrics
    assert "BFloat16" in str(traced.module.graph)  # the frozen graph computes in bf16
    assert out.dtype == np.float32
