"""`corescale explain`: op classes from every framework's op names, the finding rules (each with synthetic facts),
the analysis of a profile, and the command end to end on bert-tiny (pytorch and openvino side by side)."""

import json

import pytest
from helpers import FAST, corescale

from corescale.explain import analysis
from corescale.explain.findings import RULES, findings
from corescale.explain.opclasses import ALL_CLASSES, breakdown, classify
from corescale.workload.models import resolve_model


@pytest.mark.parametrize("op, name, shapes, expected", [
    ("aten::addmm", "", [[128], [64, 128], [128, 128]], "gemm"),
    ("mkldnn::_linear_pointwise", "", None, "gemm"),
    ("aten::matmul", "", [[4, 32, 128], [128, 128]], "gemm"),
    ("aten::matmul", "", [[4, 2, 32, 64], [4, 2, 64, 32]], "attention"),
    ("aten::scaled_dot_product_attention", "", None, "attention"),
    ("MatMul", "/model/encoder/layer.0/output/dense/MatMul", [[4, 32, 512]], "gemm"),  # ORT: weight not listed
    ("FusedMatMul", "/model/encoder/layer.0/attention/self/MatMul", [[4, 2, 32, 64], [4, 2, 64, 32]], "attention"),
    ("FullyConnected", "/model/encoder/layer.0/attention/self/query/MatMul", None, "gemm"),
    ("MatMul", "/model/encoder/layer.0/attention/self/MatMul", None, "attention"),  # OpenVINO: no shapes
    ("Subgraph", "/model/encoder/layer.0/attention/self/Transpose_3", None, "attention"),
    ("Subgraph", "/model/encoder/layer.0/output/Add", None, "norm_activation"),
    ("aten::native_layer_norm", "", None, "norm_activation"),
    ("MVN", "MVN_1", None, "norm_activation"),
    ("BiasGelu", "BiasGelu", None, "norm_activation"),
    ("Gather", "/model/embeddings/word_embeddings/Gather", None, "embedding"),
    ("aten::embedding", "", None, "embedding"),
    ("Gather", "Gather_14860", None, "data_movement"),
    ("Reorder", "reorder_1", None, "data_movement"),
    ("aten::copy_", "", None, "data_movement"),
    ("aten::frobnicate", "", None, "other"),
])
def test_op_classes(op, name, shapes, expected):
    assert classify(op, name, shapes) == expected


def test_breakdown_adds_up_to_the_call():
    ops = [{"class": "gemm", "us": 60.0}, {"class": "attention", "us": 10.0}, {"class": "gemm", "us": 5.0}]
    times = breakdown(ops, 100.0)
    assert times["gemm"] == 65.0 and times["overhead"] == 25.0 and sum(times.values()) == 100.0


BASE_FACTS = {"backend": "pytorch", "linear": "default", "precision": "fp32", "batch_size": 8, "sequence_length": 128,
              "latency_ms": 900.0, "profiled_wall_ms": 910.0, "closure": 1.01, "overhead_ms": 9.0,
              "gemm_gflops": 40.0, "peak_gflops": 90.0, "peak_library": "torch_onednn", "gemm_efficiency": 0.44,
              "torch_mm_gflops": 70.0, "torch_onednn_gflops": 90.0, "bound": "compute", "intensity": 250.0,
              "ridge": 15.0, "attainable_gflops": 90.0, "bandwidth_gbps": 6.0, "share_gemm": 0.8,
              "share_attention": 0.05, "share_norm_activation": 0.08, "share_embedding": 0.0,
              "share_data_movement": 0.03, "share_other": 0.0, "share_overhead": 0.01}
# rule id -> (facts that make it apply, facts that do not, words its sentence must hold)
CASES = {
    "gemm-library": ({}, {"linear": "onednn"}, ["44%", "MKL", "backend.linear=onednn", "100%", "square GEMM"]),
    "same-gemm-library": ({"linear_default_gflops": 70.0, "linear_onednn_gflops": 72.0}, {"backend": "openvino"},
                          ["70 and 72 GFLOP/s", "model's linear shapes", "change little"]),
    "gemm-far-from-peak": ({"backend": "onnxruntime", "gemm_efficiency": 0.3}, {"gemm_efficiency": 0.7},
                           ["30%", "onnxruntime", "torch_onednn"]),
    "gemm-near-peak": ({"gemm_efficiency": 0.9}, {"gemm_efficiency": 0.7}, ["90%", "20%"]),
    "overhead": ({"share_overhead": 0.3, "overhead_ms": 3.0}, {"share_overhead": 0.1}, ["30%", "3.00 ms", "batch 8"]),
    "data-movement": ({"share_data_movement": 0.2}, {"share_data_movement": 0.05}, ["20%"]),
    "attention": ({"share_attention": 0.4}, {"share_attention": 0.1}, ["40%", "128"]),
    "memory-bound": ({"bound": "memory", "intensity": 10.0, "attainable_gflops": 60.0}, {"bound": "compute"},
                     ["10 FLOP/B", "ridge 15", "60 GFLOP/s"]),
    "other-ops": ({"share_other": 0.1}, {"share_other": 0.01}, ["10%"]),
    "profile-disagrees": ({"closure": 1.2}, {"closure": 1.03}, ["+20%"]),
}


def test_every_rule_has_a_case():
    assert {rule.id for rule in RULES} == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_applies_to_its_facts_only(rule_id):
    applies, not_applies, words = CASES[rule_id]
    found = {f["rule"]: f for f in findings({**BASE_FACTS, **applies})}
    assert rule_id in found
    for word in words:
        assert word in found[rule_id]["text"], found[rule_id]["text"]
    assert all(v == {**BASE_FACTS, **applies}.get(k) for k, v in found[rule_id]["evidence"].items())
    assert rule_id not in {f["rule"] for f in findings({**BASE_FACTS, **applies, **not_applies})}


def test_gemm_library_rule_needs_onednn_to_win_on_these_cores():
    even = {**BASE_FACTS, "torch_onednn_gflops": 72.0}  # oneDNN no faster than MKL here: no remedy offered
    assert "gemm-library" not in {f["rule"] for f in findings(even)}
    assert {"gemm-far-from-peak", "same-gemm-library"} <= {f["rule"] for f in findings(even)}
    # the model's own shapes, measured in the worker, outrank the peak's square GEMM
    shapes_even = {**BASE_FACTS, "linear_default_gflops": 30.0, "linear_onednn_gflops": 30.5}
    assert "gemm-library" not in {f["rule"] for f in findings(shapes_even)}
    shapes_win = {**BASE_FACTS, "torch_onednn_gflops": 72.0, "linear_default_gflops": 30.0,
                  "linear_onednn_gflops": 60.0}
    (found,) = [f for f in findings(shapes_win) if f["rule"] == "gemm-library"]
    assert "60 GFLOP/s against 30" in found["text"] and "2.0x" in found["text"]
    # backend.linear=onednn holds at fp32 only (PyTorch's PRECISION_BOUND): no oneDNN rule at bf16
    at_bf16 = {f["rule"] for f in findings({**shapes_win, "precision": "bf16"})}
    assert not {"gemm-library", "same-gemm-library"} & at_bf16


def test_analysis_of_a_synthetic_profile():
    from corescale.config import BenchmarkConfig

    spec = resolve_model("bert-tiny")
    cfg = BenchmarkConfig(model="bert-tiny", batch_size=2, sequence_length=16)
    gemm_us = analysis.class_flops(spec, 2, 16)["gemm"] / 10e3  # 10 GFLOP/s
    calls = [{"wall_us": wall, "ops": [{"op": "aten::addmm", "shapes": [[128], [32, 128], [128, 128]],
                                        "us": gemm_us}, {"op": "aten::gelu", "us": 50.0}]}
             for wall in (gemm_us + 200.0, gemm_us + 100.0, gemm_us + 900.0)]
    peak = {"gflops": 40.0, "library": "torch_onednn", "libraries": {"torch_mm": 20.0, "torch_onednn": 40.0},
            "bandwidth": {"gbps": 5.0, "library": "torch_triad"}}
    profile = {"calls": calls, "latencies_us": [gemm_us + 190.0] * 5, "profiler": "torch.profiler",
               "instance": {"cpus": [0, 1], "threads": 2, "peak": peak}}
    result = analysis.explain(profile, cfg, spec)
    assert result["profiled_wall_ms"] == pytest.approx((gemm_us + 200.0) / 1e3)  # the median call
    assert sum(result["classes_ms"].values()) == pytest.approx(result["profiled_wall_ms"])
    assert result["classes_ms"]["overhead"] == pytest.approx(0.15)
    assert result["gemm"]["gflops"] == pytest.approx(10.0) and result["gemm"]["efficiency"] == pytest.approx(0.25)
    assert result["within_tolerance"] and result["roofline"]["bound"] in ("compute", "memory")
    assert result["findings"][0]["rule"] == "gemm-library" and "25%" in result["findings"][0]["text"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("explain") / "outputs"
    proc = corescale("explain", *FAST, "duration=0.3", "min_iterations=3", "warmup.max_iterations=3", "batch_size=2",
                     f"output_dir={out}", "--compare", "backend=pytorch,openvino")
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.mark.slow
def test_compare_profiles_each_backend_and_saves_json_and_figure(compared):
    out, proc = compared
    (saved,) = (out / "explain").glob("*.json")
    assert f"explain: {saved}" in proc.stdout.splitlines()
    assert saved.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    data = json.loads(saved.read_text())
    assert data["kind"] == "explain" and data["profiling_run"] is True
    pytorch, openvino = data["configurations"]
    assert (pytorch["backend"], openvino["backend"]) == ("pytorch", "openvino")
    for r in (pytorch, openvino):
        assert set(r["classes_ms"]) == set(ALL_CLASSES) and r["classes_ms"]["gemm"] > 0
        assert sum(r["classes_ms"].values()) == pytest.approx(r["profiled_wall_ms"], rel=1e-6)
        assert r["closure"] == pytest.approx(r["profiled_wall_ms"] / r["latency_ms"], rel=1e-6)
        assert r["classes_ms"]["overhead"] >= 0 and r["latency_calls"] >= 5
        # a profile that disagrees with the unprofiled latency (the profiler's cost on bert-tiny's small ops, or a
        # busy machine: 2.8x seen) says so, with its figure
        disagrees = [f for f in r["findings"] if f["rule"] == "profile-disagrees"]
        assert bool(disagrees) is (abs(r["closure"] - 1) > 0.05), (r["closure"], r["findings"])
        assert all(f["evidence"]["closure"] == r["closure"] for f in disagrees)
    assert any(op["op"] == "FullyConnected" for op in openvino["ops"])
    rates = pytorch["linear_rates"]  # the remedy measured on the model's own linear shapes, in the worker
    assert rates["default_gflops"] > 0 and rates["onednn_gflops"] > 0 and openvino["linear_rates"] is None
    assert "GEMM / linear" in proc.stdout and "findings for openvino:" in proc.stdout


@pytest.mark.slow
def test_profiling_runs_are_never_timing_results(compared):
    from corescale.analysis import store
    from corescale.errors import UserError

    out, _ = compared
    with pytest.raises(UserError, match="no results under"):
        store.load(out)


@pytest.mark.slow
def test_op_class_filter_lists_only_that_class(compared):
    from rich.console import Console

    from corescale.report.explain import ops_table

    out, _ = compared
    (pytorch, _) = json.loads(next((out / "explain").glob("*.json")).read_text())["configurations"]
    console = Console(width=200, record=True)
    console.print(ops_table(pytorch, ("gemm",)))
    text = console.export_text()
    assert "ops of class gemm" in text and "addmm" in text and "layer_norm" not in text
    assert text.count("gemm") - 1 == sum(op["class"] == "gemm" for op in pytorch["ops"])  # every one of them


@pytest.mark.slow
def test_report_section_draws_a_stacked_bar_per_saved_explanation(compared):
    from corescale.report.html import _explain_sections

    out, _ = compared
    skipped: list[str] = []
    ((section_id, title, body),) = _explain_sections(out, skipped)
    assert skipped == []
    assert section_id == "explain" and "Where the time goes" in title
    assert body.count('src="data:image/png;base64,') == 1 and "not timing results" in body
