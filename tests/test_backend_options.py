"""Backends own their options as a Hydra config group: `backend=NAME backend.OPTION=VALUE`."""

import pytest
from helpers import FAST, assert_one_line_error, corescale

from corescale.backends import BACKENDS, OPTIONS
from corescale.backends.onnxruntime.options import OnnxRuntimeOptions
from corescale.config import BenchmarkConfig, migrate_config_v1
from corescale.overrides import compose, expand_sweep


def test_each_backend_selects_its_own_options():
    assert compose([]).backend == OPTIONS["pytorch"]()
    ort = compose(["backend=onnxruntime", "backend.fusion=true", "backend.graph_optimization_level=extended"])
    assert ort.backend == OnnxRuntimeOptions(graph_optimization_level="extended", fusion=True)
    assert compose(["backend=openvino", "backend.performance_hint=THROUGHPUT"]).backend.performance_hint == \
        "THROUGHPUT"
    assert compose(["backend=torch_compile", "backend.mode=max-autotune"]).backend.mode == "max-autotune"
    assert set(OPTIONS) == set(BACKENDS)


def test_options_survive_the_process_boundary_and_the_python_api():
    cfg = compose(["backend=onnxruntime", "backend.fusion=true"])
    assert BenchmarkConfig.from_dict(cfg.to_dict()) == cfg
    assert BenchmarkConfig(backend="openvino").backend == OPTIONS["openvino"]()


@pytest.mark.parametrize("overrides, message", [
    (["backend.fusion=true"], "unknown key 'backend.fusion' for backend=pytorch; backend settings: "),
    (["backend=openvino", "backend.fusion=true"], "unknown key 'backend.fusion' for backend=openvino"),
    (["backend=onnxruntime", "backend.fusion=maybe"], "backend.fusion: expected bool, got 'maybe'"),
    (["backend=tensorrt"], "unknown backend 'tensorrt'; allowed: pytorch, torchscript"),
    (["backend=torch_compile", "backend.mode=fast"], "unknown backend.mode 'fast' for backend=torch_compile"),
    (["ort_fusion=true"], "'ort_fusion' is now an option of the backend group: write backend=onnxruntime "
                          "backend.fusion=true"),
    (["compile_mode=max-autotune"], "write backend=torch_compile backend.mode=max-autotune"),
    (["ov_performance_hint=THROUGHPUT"], "write backend=openvino backend.performance_hint=THROUGHPUT"),
    (["ort_graph_optimization_level=basic"], "backend.graph_optimization_level=basic"),
    (["ort_execution_mode=parallel"], "backend.execution_mode=parallel"),
])
def test_bad_or_old_options_are_one_line(overrides, message):
    assert_one_line_error(compose, overrides, message)


@pytest.mark.slow
def test_cli_names_the_new_spelling(tmp_path):
    out = tmp_path / "out"
    proc = corescale("run", *FAST, "ort_fusion=true", f"output_dir={out}")
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip().splitlines() == [
        "corescale: error: 'ort_fusion' is now an option of the backend group: write backend=onnxruntime "
        "backend.fusion=true"]


def test_key_covers_what_is_measured_only():
    base = compose(["model=bert-tiny"])
    same = [["output_dir=/elsewhere"], ["cache_dir=/c"], ["timeout=50"], ["allow_pickle=true"],
            ["backend=pytorch"], ["executor=ray", "executor.address=h:1"]]
    for overrides in same:
        assert compose(["model=bert-tiny", *overrides]).key() == base.key(), overrides
    different = [["batch_size=2"], ["backend=onnxruntime"], ["threads=1"], ["warmup.window=5"], ["seed=1"],
                 ["allocator=jemalloc"], ["executor=ray", "executor.node_type=c6i"]]
    keys = {compose(["model=bert-tiny", *o]).key() for o in different}
    assert len(keys) == len(different) and base.key() not in keys


def test_backend_options_change_only_their_own_keys():
    ort = compose(["backend=onnxruntime"])
    assert compose(["backend=onnxruntime", "backend.fusion=false"]).key() == ort.key()  # the default
    assert compose(["backend=onnxruntime", "backend.fusion=true"]).key() != ort.key()
    assert ort.key_fields()["backend.name"] == "onnxruntime" and "backend.fusion" not in ort.key_fields()


def test_sweeps_over_backends_and_their_options():
    trials = expand_sweep(["backend=onnxruntime", "backend.fusion=true,false"])
    assert [compose(t).backend.fusion for t in trials] == [True, False]
    assert [compose(t).backend.name for t in expand_sweep(["backend=pytorch,openvino"])] == ["pytorch", "openvino"]


def test_schema1_config_dicts_migrate():
    flat = {"backend": "onnxruntime", "ort_fusion": True, "ov_performance_hint": "THROUGHPUT", "batch_size": 2}
    assert migrate_config_v1(flat) == {"backend": {"name": "onnxruntime", "fusion": True}, "batch_size": 2}
    assert BenchmarkConfig.from_dict(flat).backend == OnnxRuntimeOptions(fusion=True)


@pytest.mark.parametrize("overrides, message", [
    (["backend=torch_compile", "backend.linear=onednn"], "does not compose with torch_compile"),
    (["backend=pytorch", "backend.linear=onednn", "precision=int8"], "backend.linear=onednn supports precision fp32"),
    (["backend=pytorch", "backend.linear=mkl"], "unknown backend.linear 'mkl' for backend=pytorch"),
])
def test_onednn_linear_is_refused_where_it_does_not_compose(overrides, message):
    assert_one_line_error(compose, overrides, message)


def test_onednn_linear_keeps_default_keys():
    assert compose(["backend=pytorch", "backend.linear=default"]).key() == compose(["backend=pytorch"]).key()
    assert compose(["backend=pytorch", "backend.linear=onednn"]).key() != compose(["backend=pytorch"]).key()
