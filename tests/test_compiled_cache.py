"""OpenVINO's compiled models kept across loads (backends/openvino/compiled.py) and where `corescale serve` keeps
them (serve/opened.py): a second load imports the blob and computes the same numbers; a blob is keyed by the
model's files, the settings and the CPU kind; a damaged one is compiled again; nothing half-written is left."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from corescale.backends.openvino.compiled import SUFFIX, compile_cached, model_digest, prune
from corescale.machine.environment import cpu_kind
from corescale.serve.opened import COMPILED_DIR, served_compiled_cache

CONFIG = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}


def small_model(folder: Path, seed: int = 0) -> Path:
    """An IR (model.xml + model.bin) of one matmul with seeded weights."""
    from openvino import opset13 as ops

    x = ops.parameter([2, 16], np.float32, name="x")
    weights = np.random.default_rng(seed).standard_normal((16, 8)).astype(np.float32)
    model = ov.Model([ops.matmul(x, ops.constant(weights), False, False)], [x], "matmul")
    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, folder / "model.xml", compress_to_fp16=False)
    return folder / "model.xml"


def load(path: Path, cache: Path | None, config: dict = CONFIG):
    core = ov.Core()
    compiled, hit = compile_cached(core, core.read_model(path), path, config, cache)
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
    return compiled.create_infer_request().infer({0: x})[0].copy(), hit


def blobs(cache: Path) -> list[Path]:
    """What the cache holds: one folder, this CPU kind's, of one folder per model of whole blobs (no private folder
    left)."""
    (kind,) = cache.iterdir()
    assert kind.name == cpu_kind()
    return sorted(path for model in kind.iterdir() for path in model.iterdir())


def test_a_second_load_imports_the_blob_and_computes_the_same(tmp_path):
    path, cache = small_model(tmp_path / "m"), tmp_path / "compiled"
    plain, none = load(path, None)
    first, missed = load(path, cache)
    again, hit = load(path, cache)
    assert (none, missed, hit) == (None, False, True)
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_array_equal(again, plain)
    assert [p.suffix for p in blobs(cache)] == [SUFFIX]  # one whole blob, no temporary file left


def test_other_weights_are_another_blob_and_an_import_runs_with_the_settings_asked(tmp_path):
    path, cache = small_model(tmp_path / "m"), tmp_path / "compiled"
    load(path, cache)
    other = small_model(tmp_path / "other", seed=1)  # the same graph, other weights (in model.bin)
    expected, _ = load(other, None)
    found, hit = load(other, cache)
    assert hit is False and len(blobs(cache)) == 2
    np.testing.assert_array_equal(found, expected)
    core = ov.Core()  # settings OpenVINO applies at import (not in its hash) are the ones this load asked for
    asked = {**CONFIG, "INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "THROUGHPUT"}
    compiled, hit = compile_cached(core, core.read_model(path), path, asked, cache)
    assert hit is True and len(blobs(cache)) == 2
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
    assert str(compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"


def test_a_damaged_blob_is_compiled_again(tmp_path):
    path, cache = small_model(tmp_path / "m"), tmp_path / "compiled"
    expected, _ = load(path, cache)
    (blob,) = blobs(cache)
    data = blob.read_bytes()
    blob.unlink()  # OpenVINO leaves its blobs read-only
    blob.write_bytes(data[:100])  # truncated, as a disk full or a kill mid-copy would leave it
    found, hit = load(path, cache)
    assert hit is False
    np.testing.assert_array_equal(found, expected)
    _, hit = load(path, cache)
    assert hit is True  # written whole again


def test_an_import_marks_its_blob_used_and_old_or_surplus_blobs_go(tmp_path):
    path, cache = small_model(tmp_path / "m"), tmp_path / "compiled"
    load(path, cache)
    (blob,) = blobs(cache)
    os.utime(blob, (1e9, 1e9))  # last used in 2001
    load(path, cache)
    assert time.time() - blob.stat().st_mtime < 600  # the import touched the blob it mapped
    kind = tmp_path / "prune"
    now = time.time()
    for name, age_days, size in (("new", 0, 10), ("week", 7, 10), ("month", 40, 10), ("older", 400, 10)):
        blob = kind / f"model-{name}" / f"{name}{SUFFIX}"  # each of another model
        blob.parent.mkdir(parents=True)
        blob.write_bytes(b"x" * size)
        os.utime(blob, (now - age_days * 86400, now - age_days * 86400))
    assert sorted(p.stem for p in prune(kind)) == ["month", "older"]  # unused for 30 days
    assert [p.stem for p in prune(kind, kept_bytes=15)] == ["week"]  # the least recently used past the size
    assert prune(kind, unused_s=0, kept_bytes=0) == [] and [p.stem for p in kind.glob(f"*/*{SUFFIX}")] == ["new"]


def test_a_blob_is_imported_only_for_the_same_model_bytes(tmp_path):
    """A bundle could craft a model whose OpenVINO hash (64 bits) is another's, so that a later load of the other
    imports its blob. Simulated: the attacker's blob kept under the name the victim's load looks for. Each model's
    blobs are in a folder named by the sha256 of its files: the victim never looks in the attacker's."""
    attacker, victim = small_model(tmp_path / "attacker"), small_model(tmp_path / "victim", seed=1)
    cache = tmp_path / "compiled"
    load(attacker, cache)
    (planted,) = blobs(cache)
    load(victim, tmp_path / "scratch")
    (wanted,) = blobs(tmp_path / "scratch")  # the name OpenVINO gives the victim's blob
    os.replace(planted, planted.with_name(wanted.name))  # the collision
    expected, _ = load(victim, None)
    found, hit = load(victim, cache)
    assert hit is False  # compiled: nothing kept from its own bytes
    np.testing.assert_array_equal(found, expected)


def test_a_cache_that_cannot_be_written_compiles_every_time(tmp_path):
    path = small_model(tmp_path / "m")
    (tmp_path / "a-file").write_text("not a folder\n")
    found, hit = load(path, tmp_path / "a-file" / "compiled")
    expected, _ = load(path, None)
    assert hit is None
    np.testing.assert_array_equal(found, expected)


def test_serve_keeps_them_in_systemds_cache_directory_or_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "systemd"))
    assert served_compiled_cache("openvino") == (tmp_path / "systemd" / COMPILED_DIR, [])
    monkeypatch.delenv("CACHE_DIRECTORY")
    monkeypatch.setenv("CORESCALE_CACHE_DIR", str(tmp_path / "user"))
    assert served_compiled_cache("openvino") == (tmp_path / "user" / COMPILED_DIR, [])
    (tmp_path / "a-file").write_text("not a folder\n")
    monkeypatch.setenv("CORESCALE_CACHE_DIR", str(tmp_path / "a-file"))
    place, warnings = served_compiled_cache("openvino")
    assert place is None and len(warnings) == 1 and "every start compiles the model again" in warnings[0]
    assert served_compiled_cache("onnxruntime") == (None, [])  # it keeps nothing compiled: no warning either


@pytest.mark.parametrize("named", [None, "/etc/corescale-named-by-the-bundle"])
def test_a_bundle_cannot_name_where_serve_keeps_compiled_models(named, tmp_path, monkeypatch):
    import dataclasses

    from corescale.config import BenchmarkConfig
    from corescale.serve.opened import Trust, runtime_config

    monkeypatch.setattr("corescale.workload.tokens.fast_tokenizer", lambda *args: None)
    (tmp_path / "copy" / "tok").mkdir(parents=True)
    (tmp_path / "copy" / "tok" / "tokenizer.json").write_text("{}")
    served = BenchmarkConfig(model="bert-tiny", compiled_cache=named,
                             workload=dataclasses.replace(BenchmarkConfig().workload, tokenizer="tok"))
    manifest = type("Manifest", (), {"serving_config": served})()
    for ours in (tmp_path / "ours", None):
        cfg = runtime_config(tmp_path, tmp_path / "copy", manifest, tmp_path / "runtime", Trust(), ours)
        assert cfg.compiled_cache == (str(ours) if ours else None)


def test_a_models_digest_covers_its_weights_not_its_neighbours(tmp_path):
    path = small_model(tmp_path / "m")
    before = model_digest(path)
    (tmp_path / "m" / "tokenizer.json").write_text("{}")  # another file beside it
    assert model_digest(path) == before
    weights = path.with_suffix(".bin")
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # one weight changed
    assert model_digest(path) != before
