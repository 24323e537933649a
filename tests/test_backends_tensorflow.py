"""TensorFlow eager, graph and XLA through the real CLI: same weights as PyTorch, threads, 2 instances."""

import pytest
from helpers import assert_agrees_with_pytorch, assert_threads_honoured, load, needs_two_cpus, run_record

from corescale.errors import UserError

VARIANTS = {"tensorflow": ("eager", "first_call"), "tensorflow_graph": ("graph", "trace"),
            "tensorflow_xla": ("xla", "compile")}


@pytest.fixture(scope="module")
def two_instance_runs(tmp_path_factory):
    return {backend: run_record(tmp_path_factory.mktemp(backend), f"backend={backend}", "instances=2",
                                "batch_size=4", "reference=pytorch", "padding_fraction=0.25")
            for backend in VARIANTS}


@pytest.mark.parametrize("backend", VARIANTS)
@pytest.mark.slow
def test_two_instances_agree_with_pytorch(two_instance_runs, backend):
    record = two_instance_runs[backend]
    assert len(record["instance_reports"]) == 2
    assert_agrees_with_pytorch(record)  # same weights, exact GELU, padding masked the same way
    mode, stage = VARIANTS[backend]
    for inst in record["instance_reports"]:
        fw = inst["framework"]
        assert fw["framework"] == "tensorflow" and fw["mode"] == mode
        assert fw["intra_op_parallelism_threads"] == 1 and fw["inter_op_parallelism_threads"] == 1
        assert {"build_model", "convert", stage} <= set(inst["stage_seconds"])


@pytest.mark.slow
@needs_two_cpus
def test_threads_honoured(two_instance_runs, tmp_path):
    two = run_record(tmp_path, "backend=tensorflow_xla", "threads=2", "batch_size=4", "padding_fraction=0.25")
    assert two["instance_reports"][0]["framework"]["intra_op_parallelism_threads"] == 2
    assert_threads_honoured(two_instance_runs["tensorflow_xla"], two)


def test_reduced_precision_is_a_clear_error():
    with pytest.raises(UserError, match="backend tensorflow_graph supports precision fp32 \\(got"):
        load("tensorflow_graph", "unused", precision="bf16")
