"""OpenVINO through the real CLI: threads and streams, hint, bf16, allocator (its runs are in conftest.py; two
instances agreeing with PyTorch: test_backends_common.py)."""

from pathlib import Path

import openvino as ov
import pytest
from helpers import (
    FAST,
    assert_threads_honoured,
    corescale,
    error_line,
    library_installed,
    load,
    needs_two_cpus,
    run_record,
)

from corescale.machine import instance_env

HAS_BF16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
HAS_JEMALLOC = library_installed(instance_env.ALLOCATORS["jemalloc"])


@pytest.mark.slow
@needs_two_cpus
def test_threads_honoured_and_hint_configurable(openvino_runs):
    """What corescale guarantees, whatever OpenVINO does with its own threads (it pins one per CPU by default):
    the thread count asked for, and every thread of an instance inside that instance's CPUs."""
    fw = openvino_runs["2t"]["instance_reports"][0]["framework"]
    assert fw["inference_num_threads"] == 2 and fw["performance_hint"] == "THROUGHPUT"
    assert fw["num_streams"] == 1  # one stream per instance whatever the hint
    assert_threads_honoured(openvino_runs["two_instances"], openvino_runs["2t"])


@pytest.mark.skipif(not HAS_JEMALLOC, reason="needs Debian's libjemalloc2")
@pytest.mark.slow
def test_a_preloaded_allocator_comes_with_openvinos_own_hwloc(openvino_runs):
    """Without it OpenVINO's hwloc frees the allocator's memory with glibc's free(): SIGABRT as the Core starts."""
    inst = openvino_runs["2t"]["instance_reports"][0]
    preload = inst["launch"]["env"]["LD_PRELOAD"].split(":")
    assert "jemalloc" in inst["mapped_libraries"] and "libjemalloc" in preload[0]
    assert any(Path(p).name.startswith("libhwloc.so") and "openvino" in p for p in preload)


@pytest.mark.slow
def test_compiled_models_are_kept_where_compiled_cache_says(openvino_runs):
    """Two instances starting together: each compiled (or imported the other's whole blob), and said which."""
    record = openvino_runs["two_instances"]
    hits = [inst["framework"]["cache_hits"]["compiled"] for inst in record["instance_reports"]]
    assert hits in ([False, False], [False, True], [True, False]), hits
    (kind,) = Path(record["config"]["compiled_cache"]).iterdir()  # this CPU kind's folder
    (model,) = kind.iterdir()  # the model's (the sha256 of its files)
    assert [p.suffix for p in model.iterdir()] == [".blob"]  # one whole blob, no private folder left
    assert openvino_runs["2t"]["instance_reports"][0]["framework"]["cache_hits"]["compiled"] is None


@pytest.mark.slow
def test_threads_of_each_instance_stay_on_its_cpus(openvino_runs):
    record = openvino_runs["two_instances"]
    for placed, inst in zip(record["plan"]["instances"], record["instance_reports"]):
        cpus = set(placed["cpus"])
        assert inst["thread_affinity"] and all(set(a) <= cpus for a in inst["thread_affinity"].values()), inst


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no bf16 instructions (AVX512_BF16 or AMX)")
@pytest.mark.slow
def test_bf16_runs_within_its_tolerance(tmp_path):
    record = run_record(tmp_path / "out", "backend=openvino", "precision=bf16", "reference=pytorch",
                        f"cache_dir={tmp_path / 'cache'}")
    assert record["instance_reports"][0]["framework"]["inference_precision_hint"] == "bf16"
    drift = record["drift"]
    assert drift["within_tolerance"] and drift["max_abs_error"] > 1e-4, drift  # within bf16's, not fp32's


@pytest.mark.skipif(HAS_BF16, reason="this CPU has bf16: the next test describes one without")
@pytest.mark.slow
def test_bf16_without_cpu_support_is_a_clear_error(tmp_path):
    proc = corescale("run", "--no-progress", *FAST, "backend=openvino", "precision=bf16",
                     f"cache_dir={tmp_path}", f"output_dir={tmp_path / 'out'}")
    assert "needs a CPU with bf16 instructions" in error_line(proc)


def test_bf16_on_a_cpu_described_without_it_is_refused_before_any_export(tmp_path, monkeypatch):
    """The same refusal on every CPU: OpenVINO's capabilities described without BF16 (a stand-in for a CPU this
    machine cannot be), in this process; nothing is exported into the cache."""
    from corescale.backends.openvino import backend
    from corescale.errors import UserError

    monkeypatch.setattr(backend, "cpu_capabilities", lambda core: ["FP32", "INT8", "EXPORT_IMPORT"])
    with pytest.raises(UserError) as refused:
        load("openvino", tmp_path, precision="bf16")
    message = str(refused.value)
    assert "needs a CPU with bf16 instructions" in message and "offers FP32, INT8, EXPORT_IMPORT" in message
    assert "\n" not in message and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_bad_hint_is_a_one_line_error(tmp_path):
    proc = corescale("run", "--no-progress", *FAST, "backend=openvino", "backend.performance_hint=FAST",
                     f"output_dir={tmp_path}")
    assert "allowed: LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT" in error_line(proc)
