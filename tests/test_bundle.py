"""A bundle is checked before any worker starts: each refusal is one line (no process is started here)."""

import json
import shutil
from pathlib import Path

import pytest

from corescale.config import BenchmarkConfig, WorkloadConfig
from corescale.errors import UserError
from corescale.machine.environment import ISA_FLAGS, cpuinfo
from corescale.serve import bundle
from corescale.serve.opened import open_bundle

RECORD = next((Path(__file__).parent / "data" / "schema2").glob("*pytorch*/result.json"))


def fake_bundle(where: Path, **requires) -> Path:
    """A folder shaped like a bundle: one file, its record, a manifest with its checksums."""
    root = where / "bundle"
    root.mkdir()
    (root / "model.txt").write_text("weights")
    shutil.copy(RECORD, root / bundle.RECORD)
    specs = json.loads(RECORD.read_text())["specs"]
    layout = {"instances": [{k: spec[k] for k in ("id", "cpus", "numa_nodes", "threads", "batch_size")}
                            for spec in specs]}
    config = bundle.serving(BenchmarkConfig(model="bert-tiny", workload=WorkloadConfig(tokenizer="tokenizer")))
    manifest = {"format": bundle.FORMAT, "files": {name: bundle.sha256(root / name)
                                                   for name in ("model.txt", bundle.RECORD)},
                "config": config.to_dict(), "layout": layout, "head": {"task": "embed"}, "precision": "int8",
                "requires": {"cpu_features": [], "libraries": {}, **requires}}
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))
    return root


def refusal(path, *words: str) -> str:
    with pytest.raises(UserError) as info:
        open_bundle(path, Path(path).parent / "work")
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_not_a_bundle(tmp_path):
    refusal(tmp_path / "nowhere", "is not a folder")
    refusal(tmp_path, "not a corescale bundle")
    (tmp_path / bundle.MANIFEST).write_text("{")
    refusal(tmp_path, "manifest.json", "not valid JSON")
    (tmp_path / bundle.MANIFEST).write_text(json.dumps({"format": 99}))
    refusal(tmp_path, "is not of format 1 or 2 (format 99")


@pytest.mark.parametrize("change, words", [
    ({"files": None}, ["manifest.files: expected an object, got None"]),
    ({"requires": {"cpu_features": "avx2"}}, ["manifest.requires.cpu_features: expected a list, got 'avx2'"]),
    ({"layout": {"instances": [{"id": 0}]}}, ["manifest.layout.instances[0]: 'cpus' is missing"]),
    ({"head": {"task": "embed", "colour": "red"}}, ["manifest.head:", "colour"]),
])
def test_a_malformed_manifest_is_one_line_naming_the_field(tmp_path, change, words):
    root = fake_bundle(tmp_path)
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    (root / bundle.MANIFEST).write_text(json.dumps({**manifest, **change}))
    refusal(root, f"bundle '{root}'", "is malformed", *words)


def test_a_format_1_manifest_is_read_with_its_onnx_chain(tmp_path):
    from corescale.serve.manifest import read_manifest

    root = fake_bundle(tmp_path)
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    chain = ["a" * 24, "a" * 24 + "-fused-1"]
    (root / bundle.MANIFEST).write_text(json.dumps({**manifest, "format": 1, "artifact": chain}))
    read = read_manifest(root)
    assert read.format == 2 and read.artifact is not None and (read.artifact.kind, read.artifact.steps) == ("onnx",
                                                                                                         chain)
    (root / bundle.MANIFEST).write_text(json.dumps({**manifest, "format": 1, "artifact": None}))
    assert read_manifest(root).artifact is None and read_manifest(root).head_spec.task == "embed"


def test_a_changed_or_missing_file(tmp_path):
    root = fake_bundle(tmp_path)
    (root / "model.txt").write_text("other weights")
    refusal(root, "'model.txt' does not match its sha256")
    (root / "model.txt").unlink()
    refusal(root, "'model.txt' is missing")


def test_a_cpu_without_the_measured_features(tmp_path):
    isa = cpuinfo().isa
    lacking = [f for f in ISA_FLAGS if not isa[f]] or ["amx_fp16"]  # a flag this corescale does not know: lacking
    refusal(fake_bundle(tmp_path, cpu_features=lacking[:1]), f"this CPU lacks {lacking[0]}", "int8", "measure again")


def test_other_library_versions(tmp_path):
    refusal(fake_bundle(tmp_path, libraries={"numpy": "0.0.1"}), "measured with numpy 0.0.1", "install numpy==0.0.1")


def test_cpus_this_process_may_not_use(tmp_path):
    """A block larger than the CPUs this process may use is refused (one of other CPU ids is placed on the usable
    ones: tests/test_cpuset.py)."""
    import os

    root = fake_bundle(tmp_path)
    cpus = list(range(4000, 4001 + len(os.sched_getaffinity(0))))
    record = json.loads((root / bundle.RECORD).read_text())
    record["specs"][0].update(cpus=cpus, threads=len(cpus))
    (root / bundle.RECORD).write_text(json.dumps(record))
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    manifest["layout"]["instances"][0].update(cpus=cpus, threads=len(cpus))
    manifest["files"][bundle.RECORD] = bundle.sha256(root / bundle.RECORD)
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))
    refusal(root, "instance(s) on CPUs 4000-", "do not fit the CPUs this process may use", "cannot place")


def test_the_front_refuses_inputs_over_the_limits():
    from corescale.serve.limits import Limits
    from corescale.serve.tokens import Tokens, TooLarge
    from corescale.workload.models import resolve_model

    folder = Path(str(resolve_model("all-minilm-l6-v2").path))
    tokens = Tokens(folder / "tokenizer.json", 16, Limits(max_inputs=2))
    assert [len(r) for r in tokens.encode(["a short text"]).rows] == [5]
    with pytest.raises(TooLarge, match="3 inputs in one request; at most 2"):
        tokens.encode(["a", "b", "c"])
    with pytest.raises(TooLarge, match="input 0 has 22 tokens; the model takes at most 16"):
        tokens.encode(["word " * 20])
    assert len(tokens.encode(["word " * 20], truncate=True).rows[0]) == 16
    pair = tokens.encode([("a query", "a document")], pairs=True)
    assert pair.types is not None and pair.types[0].tolist() == [0, 0, 0, 0, 1, 1, 1]


def test_a_final_artifact_gets_no_build_step_again(tmp_path):
    """What `corescale serve` files for a bundle's ONNX file: the backend's load finds it and derives nothing."""
    from corescale.backends.artifact_cache import write_manifest
    from corescale.backends.onnx_export import OnnxModel, cache_root, file_export, known_export
    from corescale.config import BenchmarkConfig

    cfg = BenchmarkConfig(cache_dir=str(tmp_path))
    artifact = cache_root(cfg) / ("ab" * 12)
    artifact.mkdir(parents=True)
    (artifact / "model.onnx").write_bytes(b"the measured int8 graph")
    write_manifest(artifact)
    file_export(cfg, "source", OnnxModel(artifact / "model.onnx", artifact.name, False, True, final=True))
    found = known_export(cfg, "source")
    assert found is not None and found.final and found.path == artifact / "model.onnx"

    def build(source, target, large):
        raise AssertionError("a final artifact is not built again")
    assert found.derived("int8-ort", build) is found
    file_export(cfg, "other", OnnxModel(artifact / "model.onnx", artifact.name, False, True))
    plain = known_export(cfg, "other")
    assert plain is not None and not plain.final


# ---- review 0.4 F5: nothing leaves a model folder that was not in it ----------------------------------------------

def test_a_link_out_of_the_model_folder_is_refused_and_a_hub_snapshots_blobs_are_not(tmp_path):
    from corescale.serve.bundle import folder_files

    model = tmp_path / "models--org--name"
    snapshot = model / "snapshots" / "rev1"
    (model / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (model / "blobs" / "abc").write_text("{}")
    (snapshot / "config.json").symlink_to("../../blobs/abc")  # how the hub cache lays out a snapshot
    (snapshot / "inside.md").write_text("mine")
    (snapshot / "also.md").symlink_to("inside.md")
    assert [str(r) for r, _ in folder_files(snapshot)] == ["also.md", "config.json", "inside.md"]
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key=...")
    (snapshot / "notes.md").symlink_to(secret)
    with pytest.raises(UserError) as err:
        folder_files(snapshot)
    assert "notes.md is a link to" in str(err.value) and "outside the folder" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.slow  # the CLI: refused before anything is measured
def test_run_bundle_refuses_a_model_folder_whose_link_leads_out_before_measuring(tmp_path):
    from helpers import corescale
    from serving import minilm_folder

    model = tmp_path / "their model"
    shutil.copytree(minilm_folder(), model)
    secret = tmp_path / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    (model / "README").symlink_to(secret)
    out = tmp_path / "out"
    proc = corescale("run", f"model={model}", "backend=onnxruntime", f"output_dir={out}", "--no-progress",
                     "--bundle", str(tmp_path / "b"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "README is a link to" in proc.stderr and not out.exists() and not (tmp_path / "b").exists()
