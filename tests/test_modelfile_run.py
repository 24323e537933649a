"""A model file as the model, end to end: bert-tiny (task=embed) exported by corescale's own exporter to a file of
its own with the packaged BERT tokenizer beside it, run as `model=FILE` on ONNX Runtime (its int8 variant judged
against the fp32 file) and as an OpenVINO IR; bad files and backends that need the PyTorch model refused."""

import shutil

import pytest
from helpers import assert_judged, corescale, raw_record

pytestmark = pytest.mark.slow

FAST = ["duration=0.5", "min_iterations=5", "calibrate=false", "warmup.max_iterations=5", "sequence_length=32",
        "quality_samples=64", "--no-progress"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the ONNX file, a tokenizer folder apart from it)."""
    from corescale.backends.base import TimedStages
    from corescale.backends.onnx_export import exported_model
    from corescale.config import BenchmarkConfig
    from corescale.workload.inputs import make_inputs
    from corescale.workload.models import resolve_model

    root = tmp_path_factory.mktemp("file")
    cfg = BenchmarkConfig(model="bert-tiny", task="embed", cache_dir=str(root / "cache"))
    spec = resolve_model("bert-tiny", task="embed")
    model = exported_model(spec, cfg, make_inputs(spec, 2, 16, 0), TimedStages())
    (root / "model").mkdir()
    (root / "tokenizer").mkdir()
    shutil.copy(model.path, root / "model" / "model.onnx")
    shutil.copy(resolve_model("all-minilm-l6-v2").path + "/tokenizer.json", root / "tokenizer" / "tokenizer.json")
    return root / "model" / "model.onnx", root / "tokenizer"


def run(tmp_path, model, *overrides):
    out = tmp_path / "out"
    proc = corescale("run", *FAST, f"model={model}", f"output_dir={out}", *overrides)
    runs = list(out.iterdir()) if out.is_dir() else []
    assert len(runs) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, raw_record(runs[0])


def test_an_onnx_file_runs_on_onnxruntime_its_int8_judged_against_the_file(tmp_path, exported):
    path, tokenizer = exported
    proc, record = run(tmp_path, path, f"workload.tokenizer={tokenizer}", "backend=onnxruntime", "precision=int8")
    assert record["status"] == "ok", record.get("reason")
    assert record["model"]["source"] == "file" and record["model"]["file"]["output"] == "sentence_embedding"
    quality = record["quality"]
    assert quality["task"] == "embed" and quality["passed"] is True and quality["rows"] == 64
    assert quality["reference"] == "onnxruntime fp32 on the model file itself (no PyTorch model)"
    assert_judged(quality)  # the default gate, met by the record's own figures
    assert 0.99 < quality["metrics"]["cosine_mean"] < 1.0  # int8 moved the vectors, a little
    assert "through tokenizer" in quality["origin"]
    assert record["metrics"]["gflops_per_s"] is None and record["metrics"]["flops_per_sample"] is None
    assert "the model's FLOPs are unknown" in proc.stdout
    report = record["instance_reports"][0]["framework"]
    assert "DynamicQuantizeLinear" in report["operators"]  # the int8 variant derived from the file ran
    assert record["config"]["cache_dir"] in report["model_path"]  # cached beside corescale's exports, not the file's


def test_an_openvino_ir_with_config_runs_with_its_flops(tmp_path, exported):
    import json

    import openvino as ov

    from corescale.workload.models import PRESETS

    path, tokenizer = exported
    folder = tmp_path / "ir"
    folder.mkdir()
    ov.save_model(ov.Core().read_model(str(path)), str(folder / "model.xml"), compress_to_fp16=False)
    shutil.copy(tokenizer / "tokenizer.json", folder / "tokenizer.json")
    (folder / "config.json").write_text(json.dumps(PRESETS["bert-tiny"]))
    proc, record = run(tmp_path, folder / "model.xml", "backend=openvino")
    assert record["status"] == "ok", record.get("reason")
    quality = record["quality"]  # the file as it is, with nothing to judge it against: said, never 1.0
    assert quality["metrics"] == {} and "reference=DIR" in quality["unknown"] and quality["passed"] is None
    assert record["metrics"]["gflops_per_s"] > 0  # config.json gives the sizes


def test_bad_files_and_backends_are_refused_in_one_line_before_any_worker(tmp_path, exported):
    path, tokenizer = exported
    (tmp_path / "garbage.onnx").write_bytes(path.read_bytes()[:4096])
    (tmp_path / "lonely.xml").write_text("<net/>")
    cases = [(path, ["backend=pytorch"], "a model file runs on onnxruntime and openvino only"),
             (tmp_path / "garbage.onnx", ["backend=onnxruntime"], "is not a readable ONNX model"),
             (tmp_path / "lonely.xml", ["backend=openvino"], "an OpenVINO IR without its weights")]
    for model, overrides, message in cases:
        out = tmp_path / "out"
        proc = corescale("run", *FAST, f"model={model}", f"workload.tokenizer={tokenizer}", f"output_dir={out}",
                         *overrides)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
