"""What users bring (issue 30): Sentence-Transformers directories of every released format (module paths of
versions 2 to 6, read from each version's sources; prompts; module paths confined to the directory), checked
against the installed library's own answers."""

import json

import numpy as np
import pytest

from corescale.errors import UserError
from corescale.workload.heads import with_prompt
from corescale.workload.models import resolve_model

CONFIG = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
          "intermediate_size": 512}
# modules.json's types as each version wrote them (Transformer, Pooling, Normalize)
FORMATS = {
    "2.0-3.0": ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                "sentence_transformers.models.Normalize"),
    "3.1-5.3": ("sentence_transformers.models.Transformer.Transformer",
                "sentence_transformers.models.Pooling.Pooling", "sentence_transformers.models.Normalize.Normalize"),
    "5.4-5.x": ("sentence_transformers.base.modules.transformer.Transformer",
                "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
                "sentence_transformers.sentence_transformer.modules.normalize.Normalize"),
    "6": ("sentence_transformers.base.modules.transformer.Transformer",
          "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
          "sentence_transformers.base.modules.normalize.Normalize"),
}


def st_dir(root, types, pooling, st_config=None, paths=("", "1_Pooling", "2_Normalize")):
    root.mkdir(parents=True)
    (root / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": p, "type": t}
                                                   for i, (t, p) in enumerate(zip(types, paths))]))
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if st_config is not None:
        (root / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return root


@pytest.mark.parametrize("version", FORMATS)
def test_every_released_module_layout_is_read(tmp_path, version):
    old = version.startswith(("2", "3"))
    pooling = {"pooling_mode_cls_token": True} if old else {"pooling_mode": "cls", "include_prompt": True}
    head = resolve_model(str(st_dir(tmp_path / "st", FORMATS[version], pooling))).head
    assert (head.task, head.pooling, head.normalize, head.prompt) == ("embed", "cls", True, "")


def test_the_default_prompt_is_put_before_each_text_as_the_library_does(tmp_path):
    prompts = {"query": "query: ", "passage": "passage: "}
    folder = st_dir(tmp_path / "st", FORMATS["6"], {"pooling_mode": "mean"},
                    {"prompts": prompts, "default_prompt_name": "query"})
    head = resolve_model(str(folder)).head
    assert head.prompt == "query: " and "prompt 'query: '" in head.summary()
    assert with_prompt(["a", ("b", "c")], head.prompt) == ["query: a", ("query: b", "c")]
    unprompted = st_dir(tmp_path / "plain", FORMATS["6"], {"pooling_mode": "mean"},
                        {"prompts": prompts, "default_prompt_name": None})
    assert resolve_model(str(unprompted)).head.prompt == ""
    assert "prompt" not in resolve_model(str(unprompted)).head.to_json()  # the keys of unprompted models hold


@pytest.mark.parametrize("case,message", [
    ("outside", "outside the model's directory"),
    ("absolute", "outside the model's directory"),
    ("sqrt", "pooling mean_sqrt_len_tokens is not supported"),
    ("two", "sets several pooling modes"),
    ("exclude-prompt", "include_prompt=false"),
    ("unknown-prompt", "which its prompts do not hold"),
    ("cross-encoder-without-head", "has no Pooling module"),
])
def test_bad_sentence_transformers_directories_are_one_line(tmp_path, case, message):
    types, pooling, st_config, paths = FORMATS["6"], {"pooling_mode": "mean"}, None, ("", "1_Pooling", "2_Normalize")
    if case == "outside":
        paths = ("", "../1_Pooling", "2_Normalize")
    elif case == "absolute":
        paths = ("", str(tmp_path / "elsewhere"), "2_Normalize")
    elif case == "sqrt":
        pooling = {"pooling_mode": "mean_sqrt_len_tokens"}
    elif case == "two":
        pooling = {"pooling_mode": ["mean", "max"]}
    elif case == "exclude-prompt":
        pooling = {"pooling_mode": "mean", "include_prompt": False}
        st_config = {"prompts": {"query": "query: "}, "default_prompt_name": "query"}
    elif case == "unknown-prompt":
        st_config = {"prompts": {"query": "query: "}, "default_prompt_name": "passage"}
    else:
        types = types[:1]
    with pytest.raises(UserError) as info:
        resolve_model(str(st_dir(tmp_path / "st", types, pooling, st_config, paths)))
    assert message in str(info.value) and "\n" not in str(info.value)


# --- directories saved by the installed sentence-transformers, against the library's own answers --------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An embedder (CLS pooling, Dense, Normalize, a default prompt) and a cross-encoder, saved by the installed
    library from the packaged all-MiniLM-L6-v2 (the Dense layer seeded)."""
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    try:  # sentence-transformers 5.4 and later
        from sentence_transformers.base.modules import Dense, Normalize, Transformer
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    source = resolve_model("all-minilm-l6-v2").path
    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    encoder = Transformer(str(source))
    embedder = SentenceTransformer(modules=[encoder, Pooling(384, pooling_mode="cls"), Dense(384, 128), Normalize()],
                                   prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="query",
                                   device="cpu")
    embedder.save(str(root / "embedder"))
    ranker = CrossEncoder(str(source), num_labels=1, device="cpu")
    ranker.save(str(root / "ranker"))
    return {"embedder": (root / "embedder", embedder), "ranker": (root / "ranker", ranker)}


def corescale_outputs(folder):
    """What corescale's measured call (PyTorch fp32, its head and tokenizer) answers on the quality set."""
    from corescale.backends import create_backend
    from corescale.config import BenchmarkConfig
    from corescale.measure.quality import outputs
    from corescale.workload.quality import build_quality_set
    from corescale.workload.samples import pad_id

    spec = resolve_model(str(folder))
    cfg = BenchmarkConfig(model=str(folder), quality_samples=32)
    queries = build_quality_set(cfg, spec)
    backend = create_backend("pytorch")
    backend.load(spec, cfg, 2, queries.rows([0], int(queries.lengths[0]), pad_id(spec), spec.takes_token_type_ids))
    return spec, queries, outputs(backend, spec, queries)


@pytest.mark.slow  # builds and saves two models in process (no worker): ~15 s
def test_directories_saved_by_the_installed_library_answer_as_the_library(saved):
    import torch

    folder, embedder = saved["embedder"]
    spec, queries, ours = corescale_outputs(folder)
    assert (spec.head.pooling, len(spec.head.dense), spec.head.normalize, spec.head.prompt) == \
        ("cls", 1, True, "query: ")
    theirs = embedder.encode(queries.texts, batch_size=16, convert_to_numpy=True)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999

    folder, ranker = saved["ranker"]
    spec, queries, ours = corescale_outputs(folder)
    assert spec.task == "rerank"
    theirs = ranker.predict(list(zip(queries.texts, queries.pairs)), batch_size=16,
                            activation_fn=torch.nn.Identity())
    assert np.abs(ours.reshape(-1) - np.asarray(theirs).reshape(-1)).max() < 1e-4
