import json

import numpy as np
import pytest
import torch

from corescale.errors import UserError
from corescale.workload.inputs import make_inputs
from corescale.workload.models import PRESETS, build_torch_model, resolve_model


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_resolve_offline(name):
    spec = resolve_model(name)
    assert spec.source == "preset" and spec.layers > 0 and spec.hidden > 0 and spec.heads > 0


def test_bert_base_hyperparameters():
    spec = resolve_model("bert-base")
    assert (spec.layers, spec.hidden, spec.intermediate, spec.heads, spec.vocab_size) == (12, 768, 3072, 12, 30522)
    assert resolve_model("roberta-base").max_positions == 512


def test_preset_weights_are_deterministic_for_a_seed():
    spec = resolve_model("bert-tiny")
    a = build_torch_model(spec, seed=3).state_dict()
    b = build_torch_model(spec, seed=3).state_dict()
    c = build_torch_model(spec, seed=4).state_dict()
    key = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(a[key], b[key])
    assert not torch.equal(a[key], c[key])


def test_inputs_shape_seed_and_padding():
    spec = resolve_model("bert-tiny")
    x = make_inputs(spec, 4, 32, seed=1, padding_fraction=0.25)
    assert set(x) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(v.shape == (4, 32) and v.dtype == np.int64 for v in x.values())
    assert x["attention_mask"][:, :24].all() and not x["attention_mask"][:, 24:].any()
    assert np.array_equal(x["input_ids"], make_inputs(spec, 4, 32, seed=1, padding_fraction=0.25)["input_ids"])
    assert not np.array_equal(x["input_ids"], make_inputs(spec, 4, 32, seed=2)["input_ids"])
    assert "token_type_ids" not in make_inputs(resolve_model("distilbert-base"), 1, 8, seed=0)


def test_local_directory_with_safetensors(tmp_path):
    spec = resolve_model("bert-tiny")
    model = build_torch_model(spec, seed=0)
    model.save_pretrained(tmp_path / "m")
    local = resolve_model(str(tmp_path / "m"))
    assert local.source == "local" and local.hidden == 128
    loaded = build_torch_model(local, seed=99)
    key = "encoder.layer.1.output.dense.weight"
    assert torch.equal(loaded.state_dict()[key], model.state_dict()[key])


def test_local_directory_refuses_pickle_unless_allowed(tmp_path):
    spec = resolve_model("bert-tiny")
    model = build_torch_model(spec, seed=0)
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "m" / "pytorch_model.bin")
    local = resolve_model(str(tmp_path / "m"))
    with pytest.raises(UserError, match="pickle"):
        build_torch_model(local, seed=0)
    loaded = build_torch_model(local, seed=99, allow_pickle=True)  # another seed: the weights must be the file's
    key = "encoder.layer.1.output.dense.weight"
    assert torch.equal(loaded.state_dict()[key], model.state_dict()[key])


def test_bad_model_names(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{nope")
    with pytest.raises(UserError, match="not valid JSON"):
        resolve_model(str(tmp_path / "bad"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        resolve_model("someone/not-cached-model")


def test_hub_id_from_local_cache(tmp_path, monkeypatch):
    """A hub id resolves offline when the user's cache has it (HF_HUB_OFFLINE honoured)."""
    cache = tmp_path / "hub" / "models--acme--tiny-bert"
    snapshot = cache / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("a" * 40)
    build_torch_model(resolve_model("bert-tiny"), seed=0).save_pretrained(snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    spec = resolve_model("acme/tiny-bert")
    assert spec.source == "hub" and spec.hidden == 128
    assert json.dumps(spec.identity())
