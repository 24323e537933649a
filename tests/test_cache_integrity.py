"""Cached artifacts are checked before use: an ONNX artifact carries a manifest (sizes, hashes) and a damaged one
is built again (or refused in one line naming it); the keys cover the libraries and the exporter's code; a peak
or bandwidth entry that is malformed or out of range is measured again."""

import json
import os
from types import SimpleNamespace

import pytest

from corescale.backends import artifact_cache, onnx_export
from corescale.backends.artifact_cache import MANIFEST, cached, damage
from corescale.backends.onnx_export import MODEL_FILE, OnnxModel
from corescale.errors import UserError
from corescale.machine import peak
from corescale.machine.environment import CpuInfo

PAYLOAD = b"onnx graph bytes " * 1000


def _builder(log: list):
    def build(tmp):
        log.append(tmp)
        (tmp / MODEL_FILE).write_bytes(PAYLOAD)
        (tmp / f"{MODEL_FILE}.data").write_bytes(b"weights" * 100)
    return build


def _truncate(artifact):
    (artifact / MODEL_FILE).write_bytes(PAYLOAD[:100])


def _same_size_other_bytes(artifact):  # a flipped byte: same size, a new modification time
    data = bytearray((artifact / MODEL_FILE).read_bytes())
    data[5] ^= 0xFF
    (artifact / MODEL_FILE).write_bytes(bytes(data))
    info = (artifact / MODEL_FILE).stat()
    os.utime(artifact / MODEL_FILE, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))


def _empty_model(artifact):  # what a rename before the data reached the disk leaves after a power loss
    (artifact / MODEL_FILE).write_bytes(b"")


DAMAGE = {
    "truncated": (_truncate, "holds 100 bytes"),
    "flipped-byte": (_same_size_other_bytes, "does not match the sha256"),
    "empty": (_empty_model, "holds 0 bytes"),
    "model-missing": (lambda a: (a / MODEL_FILE).unlink(), "model.onnx is missing"),
    "data-missing": (lambda a: (a / f"{MODEL_FILE}.data").unlink(), "model.onnx.data is missing"),
    "no-manifest": (lambda a: (a / MANIFEST).unlink(), "manifest.json is missing"),
    "manifest-garbage": (lambda a: (a / MANIFEST).write_bytes(b"\0\1{"), "unreadable"),
    "manifest-list": (lambda a: (a / MANIFEST).write_text("[]"), "unreadable"),
    "manifest-sizes-text": (lambda a: (a / MANIFEST).write_text(json.dumps(
        {"files": {MODEL_FILE: {"size": "big", "mtime_ns": 0, "sha256": ""}}})), "manifest says big"),
    "manifest-empty": (lambda a: (a / MANIFEST).write_text('{"files": {}}'), "lists no file"),
}


def test_an_artifact_is_built_once_with_a_manifest_and_used_after(tmp_path):
    log: list = []
    target = tmp_path / "onnx" / "k"
    assert cached(target, _builder(log)) is False and len(log) == 1
    assert sorted(p.name for p in target.iterdir()) == [MANIFEST, MODEL_FILE, f"{MODEL_FILE}.data"]
    files = json.loads((target / MANIFEST).read_text())["files"]
    assert files[MODEL_FILE]["size"] == len(PAYLOAD) and len(files[MODEL_FILE]["sha256"]) == 64
    assert damage(target) is None
    assert cached(target, _builder(log)) is True and len(log) == 1
    os.utime(target / MODEL_FILE)  # touched, bytes unchanged (a copy): the hash says it is intact
    assert damage(target) is None and cached(target, _builder(log)) is True and len(log) == 1


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_artifact_is_built_again(tmp_path, case):
    harm, problem = DAMAGE[case]
    log: list = []
    target = tmp_path / "onnx" / "k"
    cached(target, _builder(log))
    harm(target)
    assert problem in damage(target)
    assert cached(target, _builder(log)) is False and len(log) == 2  # built again, not used
    assert damage(target) is None and (target / MODEL_FILE).read_bytes() == PAYLOAD
    assert sorted(p.name for p in target.parent.iterdir()) == [".locks", "k"]  # the damaged one is gone


def test_a_damaged_artifact_that_cannot_be_removed_is_one_line_naming_it(tmp_path, monkeypatch):
    target = tmp_path / "onnx" / "k"
    cached(target, _builder([]))
    _truncate(target)

    def refuse(source, destination):  # another user's cache: this session runs as root, so it cannot exist here
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(artifact_cache.os, "rename", refuse)
    with pytest.raises(UserError) as error:
        cached(target, _builder([]))
    message = str(error.value)
    assert f"'{target}' is damaged (model.onnx holds 100 bytes" in message and "Permission denied" in message
    assert "\n" not in message and "cache_dir=" in message


def _cfg(tmp_path):
    return SimpleNamespace(cache_dir=str(tmp_path), seed=0, trust_remote_code=False, allow_pickle=False)


@pytest.mark.parametrize("library", ["torch", "transformers", "onnx"])
def test_the_export_keys_change_with_each_library(tmp_path, monkeypatch, library):
    from corescale.workload.models import resolve_model

    spec = resolve_model("bert-tiny")
    before = onnx_export.source_key(spec, _cfg(tmp_path), ["input_ids"])
    original = onnx_export._version
    monkeypatch.setattr(onnx_export, "_version", lambda name: "0.0-other" if name == library else original(name))
    assert onnx_export.source_key(spec, _cfg(tmp_path), ["input_ids"]) != before


@pytest.mark.parametrize("library", ["onnx", "onnxruntime"])
def test_a_derived_variant_is_keyed_by_its_tools(tmp_path, monkeypatch, library):
    base = tmp_path / "onnx" / ("a" * 24)
    cached(base, _builder([]))
    model = OnnxModel(base / MODEL_FILE, "a" * 24, False, True)

    def variant(source, target, large):
        target.write_bytes(source.read_bytes()[:50])

    first = model.derived("int8", variant)
    original = onnx_export._version
    monkeypatch.setattr(onnx_export, "_version", lambda name: "0.0-other" if name == library else original(name))
    second = model.derived("int8", variant)
    assert first.path != second.path and not second.cache_hit and first.path.is_file()


@pytest.mark.parametrize("entry", [
    {"key": "../../../etc", "large": False}, {"key": "a" * 24, "large": "no"}, {"key": 5, "large": False}, [],
    {"key": "b" * 24, "large": False},  # names an artifact that is not there
])
def test_a_source_entry_not_written_by_corescale_is_not_followed(tmp_path, entry):
    cfg = _cfg(tmp_path)
    cached(onnx_export.cache_root(cfg) / ("a" * 24), _builder([]))
    onnx_export.sources_root(cfg).mkdir(parents=True)
    (onnx_export.sources_root(cfg) / "s.json").write_text(json.dumps(entry))
    assert onnx_export.known_export(cfg, "s") is None
    (onnx_export.sources_root(cfg) / "s.json").write_text(json.dumps({"key": "a" * 24, "large": False}))
    assert onnx_export.known_export(cfg, "s").key == "a" * 24
    _truncate(onnx_export.cache_root(cfg) / ("a" * 24))
    assert onnx_export.known_export(cfg, "s") is None  # damaged: built again by the caller


GOOD_PEAK = {"precision": "fp32", "gflops": 100.0, "library": "numpy", "libraries": {"numpy": 100.0},
             "method_version": peak.METHOD_VERSION}


@pytest.mark.parametrize("change", [
    {"gflops": "100"}, {"gflops": -5.0}, {"gflops": 0}, {"gflops": True}, {"gflops": 1e300}, {"gflops": None},
    {"libraries": [1]}, {"libraries": {"numpy": "fast"}}, {"library": 7}, {"precision": "bf16"},
])
def test_a_malformed_or_out_of_range_peak_entry_is_measured_again(tmp_path, change):
    cache = peak.PeakCache(tmp_path, machine="m")
    cache.root.mkdir(parents=True)
    path = cache.path((0,), 1, "fp32")
    path.write_text(json.dumps(GOOD_PEAK))
    assert cache.get((0,), 1, "fp32")["gflops"] == 100.0
    path.write_text(json.dumps({**GOOD_PEAK, **change}))
    assert cache.get((0,), 1, "fp32") is None


@pytest.mark.parametrize("text", ['{"gbps": "fast", "method_version": 1}', '{"gbps": -1, "method_version": 1}',
                                  '{"gbps": 1e9, "method_version": 1}', '{"gbps": NaN, "method_version": 1}',
                                  '{"gbps": Infinity, "method_version": 1}', "[]", "\0\0", '{"gbps": 20}'])
def test_a_malformed_or_out_of_range_bandwidth_entry_is_measured_again(tmp_path, text):
    cache = peak.PeakCache(tmp_path, machine="m")
    cache.root.mkdir(parents=True)
    cache.bandwidth_path((0,), 1).write_text('{"gbps": 20.5, "method_version": 1}')
    assert cache.get_bandwidth((0,), 1)["gbps"] == 20.5
    cache.bandwidth_path((0,), 1).write_text(text)
    assert cache.get_bandwidth((0,), 1) is None


@pytest.mark.parametrize("clocks", [{"governor": "powersave"}, {"no_turbo": "1"}, {"boost": "0"},
                                    {"smt": "off"}])
def test_the_peak_fingerprint_changes_with_the_clock_settings(clocks):
    cpu, topology = CpuInfo(model="Xeon", isa={"avx512f": True}), {"logical_cpus": 2}
    base = {"governor": "performance", "no_turbo": "0", "boost": "1", "smt": "on"}
    assert peak.fingerprint(cpu, topology, base) != peak.fingerprint(cpu, topology, {**base, **clocks})
    assert peak.fingerprint(cpu, topology, {}) == peak.fingerprint(cpu, topology)  # none exposed: as before


def test_the_cache_default_is_the_environments_then_the_users(monkeypatch):
    """cache_dir's default is $CORESCALE_CACHE_DIR (conftest.py gives the suite its own: no test touches
    ~/.cache/corescale), else ~/.cache/corescale; an explicit cache_dir= wins."""
    from corescale.config import BenchmarkConfig
    from corescale.overrides import compose
    from corescale.workload.models import resolve_model

    suite = os.environ["CORESCALE_CACHE_DIR"]
    assert "corescale-suite-" in suite and not suite.startswith(os.path.expanduser("~/.cache"))
    assert compose([]).cache_dir == BenchmarkConfig().cache_dir == suite
    assert compose(["cache_dir=/elsewhere"]).cache_dir == "/elsewhere"
    monkeypatch.setattr("corescale.workload.models.packaged_model", lambda name, cache_dir: pytest.fail(cache_dir))
    with pytest.raises(pytest.fail.Exception, match=suite):  # a packaged model is extracted into it
        resolve_model("all-minilm-l6-v2")
    monkeypatch.delenv("CORESCALE_CACHE_DIR")
    assert BenchmarkConfig().cache_dir == "~/.cache/corescale"
