"""Each PyTorch backend, in process, on bert-tiny: outputs agree with eager."""

import numpy as np
import pytest
import torch

from corescale.backends import create_backend
from corescale.config import BenchmarkConfig
from corescale.measure.drift import drift_metrics
from corescale.workload.inputs import make_inputs
from corescale.workload.models import resolve_model

SPEC = resolve_model("bert-tiny")
INPUTS = make_inputs(SPEC, 2, 16, seed=0, padding_fraction=0.25)


def run(backend: str, **overrides):
    cfg = BenchmarkConfig(model="bert-tiny", backend=backend, **overrides)
    b = create_backend(backend)
    b.load(SPEC, cfg, 2, INPUTS)
    prepared = b.prepare(INPUTS)
    return b, b.to_numpy(b.forward(prepared)), b.to_numpy(b.forward(prepared))


@pytest.fixture(scope="module")
def eager():
    return run("pytorch")[1]


@pytest.mark.parametrize("backend", ["torchscript", pytest.param("torch_compile", marks=pytest.mark.slow)])  # runs g++
def test_backend_agrees_with_eager(backend, eager):
    b, out, again = run(backend)
    assert out.shape == (2, 16, 128) and out.dtype == np.float32
    assert np.array_equal(out, again) or np.allclose(out, again, atol=1e-6)
    assert drift_metrics(out, eager, "fp32")["within_tolerance"]
    assert b.timings  # trace / compile time recorded outside inference
    assert b.info()["num_threads"] == 2


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_runs_within_looser_tolerance(precision, eager):
    _, out, _ = run("pytorch", precision=precision)
    metrics = drift_metrics(out, eager, precision)
    assert metrics["within_tolerance"], metrics
    assert metrics["max_abs_error"] > 0  # it really ran at reduced precision


def test_random_outputs_fail_the_drift_check(eager):
    noise = np.random.default_rng(0).normal(size=eager.shape).astype(np.float32)
    assert not drift_metrics(noise, eager, "int8")["within_tolerance"]


@pytest.mark.parametrize("backend", ["pytorch", "torchscript"])
def test_onednn_linear_replaces_every_linear_and_agrees_with_eager(backend, eager):
    from corescale.backends import OPTIONS
    from corescale.backends.pytorch.onednn_linear import OnednnLinear

    cfg = BenchmarkConfig(model="bert-tiny", backend=OPTIONS[backend](linear="onednn"))
    b = create_backend(backend)
    b.load(SPEC, cfg, 2, INPUTS)
    out = b.to_numpy(b.forward(b.prepare(INPUTS)))
    assert drift_metrics(out, eager, "fp32")["max_rel_error"] < 1e-5
    # bert-tiny: 2 layers x (q, k, v, attention output, intermediate, output) + the pooler
    assert b.info()["onednn_linears"] == 13 and "onednn_prepack" in b.timings
    if backend == "pytorch":
        assert not any(isinstance(m, torch.nn.Linear) for m in b.module.modules())
        assert sum(isinstance(m, OnednnLinear) for m in b.module.modules()) == 13
