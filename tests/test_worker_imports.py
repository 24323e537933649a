"""A worker imports only what its backend needs: an ONNX Runtime worker whose export is cached holds neither torch
nor Transformers; a PyTorch worker holds both. Each instance report says what it imported and how long it took."""

import pytest
from helpers import FAST, execute

from corescale.backends.onnx_export import SOURCES_DIR
from corescale.measure.runner import prepare_trial
from corescale.overrides import compose


def imports_of(tmp_path, name, *overrides) -> dict:
    """The one instance's `imports` of a trial run through the local loop (fresh worker processes)."""
    trial = prepare_trial(compose([*FAST, f"output_dir={tmp_path / name}", *overrides]))
    outcome = execute(trial)
    assert outcome.ok, outcome.record.reason
    (report,) = outcome.record.instance_reports
    return report.to_dict()  # as result.json holds it


@pytest.mark.slow
def test_onnxruntime_worker_with_a_cached_export_imports_neither_torch_nor_transformers(tmp_path):
    cache = f"cache_dir={tmp_path / 'cache'}"
    cold = imports_of(tmp_path, "cold", "backend=onnxruntime", cache)
    assert "torch" in cold["imports"]["frameworks"]  # the export needs torch: built, hashed, exported
    assert {"build_model", "hash_weights", "export"} <= set(cold["stage_seconds"])
    assert len(list((tmp_path / "cache" / SOURCES_DIR).glob("*.json"))) == 1  # the export filed under its source

    warm = imports_of(tmp_path, "warm", "backend=onnxruntime", cache)
    imports = warm["imports"]
    assert "onnxruntime" in imports["frameworks"]
    assert not {"torch", "transformers"} & set(imports["frameworks"]), imports["frameworks"]
    assert warm["framework"]["cache_hits"] == {"export": True}
    assert not {"build_model", "hash_weights", "export"} & set(warm["stage_seconds"])  # nothing built
    assert warm["framework"]["model_path"] == cold["framework"]["model_path"]  # the very artifact
    seconds = imports["seconds"]
    assert "onnxruntime" in seconds and "torch" not in seconds
    assert imports["fork_server_seconds"] is None  # started fresh: every import timed in this worker
    assert warm["output_checksum"] == pytest.approx(cold["output_checksum"], rel=1e-6)


@pytest.mark.slow
def test_pytorch_worker_imports_torch_and_transformers(tmp_path):
    report = imports_of(tmp_path, "pytorch", "backend=pytorch")
    imports = report["imports"]
    assert {"torch", "transformers"} <= set(imports["frameworks"])
    assert "onnxruntime" not in imports["frameworks"]
    assert imports["seconds"]["torch"] > 0.05  # imported here, timed: not free


def test_a_fork_server_imports_what_its_backend_declares():
    from corescale.measure.forkserver import server_modules

    onnx = server_modules("onnxruntime", "bert")
    assert "corescale.backends.onnxruntime.backend" in onnx and not {"torch", "transformers"} & set(onnx)
    torch = server_modules("pytorch", "xlm-roberta")
    assert torch.index("torch") < torch.index("corescale.backends.pytorch.backend")
    assert "transformers.models.xlm_roberta.modeling_xlm_roberta" in torch
