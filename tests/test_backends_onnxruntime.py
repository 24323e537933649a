"""ONNX Runtime through the real CLI: export cache, fusion, int8, threads (its runs are in conftest.py; two
instances agreeing with PyTorch: test_backends_common.py)."""

import pytest
from helpers import (
    FAST,
    assert_agrees_with_pytorch,
    assert_threads_honoured,
    corescale,
    error_line,
    load,
    needs_two_cpus,
)

from corescale.backends.artifact_cache import LOCK_DIR
from corescale.errors import UserError


@pytest.mark.slow
def test_concurrent_exports_leave_one_complete_cache_entry(onnxruntime_runs, onnxruntime_cache):
    cache = onnxruntime_cache
    entries = sorted(p.name for p in (cache / "onnx").iterdir())
    entries = [e for e in entries if e != LOCK_DIR]  # the lock files of the builds
    base = [e for e in entries if "-" not in e]
    assert len(base) == 1 and not [e for e in entries if e.startswith(".")], entries  # no temp dirs left
    assert (cache / "onnx" / base[0] / "model.onnx").stat().st_size > 1e6
    hits = [inst["framework"]["cache_hits"]["export"] for inst in onnxruntime_runs["two_instances"]["instance_reports"]]
    assert sorted(hits) == [False, True], hits  # one instance built it; the other waited for the lock and reused it


@pytest.mark.slow
def test_later_runs_reuse_the_cache(onnxruntime_runs):
    fused = onnxruntime_runs["fused_2t"]["instance_reports"][0]
    assert fused["framework"]["cache_hits"] == {"export": True, "fuse": False}
    assert "export" not in fused["stage_seconds"] and "fuse" in fused["stage_seconds"]
    quantized = onnxruntime_runs["fused_int8"]["instance_reports"][0]
    assert quantized["framework"]["cache_hits"] == {"export": True, "fuse": True, "quantize": False}
    assert "fuse" not in quantized["stage_seconds"] and "quantize" in quantized["stage_seconds"]


@pytest.mark.slow
def test_fusion_makes_transformer_operators_and_agrees(onnxruntime_runs):
    record = onnxruntime_runs["fused_2t"]
    ops = record["instance_reports"][0]["framework"]["operators"]
    layers = 2  # bert-tiny
    assert ops.get("Attention") == layers and ops.get("EmbedLayerNormalization") == 1, ops
    assert ops.get("SkipLayerNormalization") == 2 * layers and ops.get("BiasGelu") == layers, ops
    assert_agrees_with_pytorch(record)


@pytest.mark.slow
@needs_two_cpus
def test_threads_honoured(onnxruntime_runs):
    one, two = onnxruntime_runs["two_instances"], onnxruntime_runs["fused_2t"]
    assert two["instance_reports"][0]["framework"]["intra_op_num_threads"] == 2
    assert_threads_honoured(one, two)


@pytest.mark.slow
def test_int8_dynamic_quantization_within_its_tolerance(onnxruntime_runs):
    record = onnxruntime_runs["fused_int8"]
    drift = record["drift"]
    assert drift["within_tolerance"] and drift["tolerance"] == 0.25, drift
    assert drift["max_abs_error"] > 1e-4  # it really ran quantized
    ops = record["instance_reports"][0]["framework"]["operators"]
    assert ops.get("QAttention") == 2 and ops.get("MatMulInteger", 0) > 0, ops


@pytest.mark.parametrize("override, expected", [
    ("backend.graph_optimization_level=max", "allowed: disable, basic, extended, all"),
    ("backend.execution_mode=async", "allowed: sequential, parallel"),
    ("ort_fusion=true", "write backend=onnxruntime backend.fusion=true"),  # 0.1's spelling names the new one
])
@pytest.mark.slow
def test_bad_options_are_one_line_errors(tmp_path, override, expected):
    proc = corescale("run", "--no-progress", *FAST, "backend=onnxruntime", override, f"cache_dir={tmp_path}",
                     f"output_dir={tmp_path / 'out'}")
    assert expected in error_line(proc)


def test_unsupported_precision_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="backend onnxruntime supports precision fp32, int8"):
        load("onnxruntime", tmp_path, precision="bf16")
