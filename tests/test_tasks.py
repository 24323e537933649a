"""Tasks and heads (workload/heads.py), the packaged trained model, the quality metrics and gate, and the bad
inputs of issue 21: each refused with one line before any worker starts."""

import json
import shutil

import numpy as np
import pytest

from corescale.errors import UserError
from corescale.measure import quality as measured
from corescale.workload import corpus
from corescale.workload.heads import HeadSpec, head_for_task
from corescale.workload.models import resolve_model
from corescale.workload.quality import parse_gate
from corescale.workload.tasks import TASKS


def write_st_dir(root, modules, pooling=None, config=None):
    """A Sentence-Transformers directory's metadata (no weights: resolve_model reads metadata only)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "config.json").write_text(json.dumps(config or {"model_type": "bert", "num_hidden_layers": 2,
                                                            "hidden_size": 128, "num_attention_heads": 2,
                                                            "intermediate_size": 512}))
    if pooling is not None:
        (root / "1_Pooling").mkdir(exist_ok=True)
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return root


ST = "sentence_transformers.models."
TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": ST + "Normalize"}


def test_the_packaged_model_is_a_normalised_mean_pooling_embedder():
    spec = resolve_model("all-minilm-l6-v2")  # extracted once into the suite's cache
    assert spec.task == "embed" and spec.source == "packaged"
    assert (spec.head.pooling, spec.head.normalize, spec.head.source) == ("mean", True, "sentence-transformers")
    assert spec.layers == 6 and spec.hidden == 384


def test_a_packaged_model_whose_weights_changed_is_refused(tmp_path):
    spec = resolve_model("all-minilm-l6-v2", cache_dir=str(tmp_path))
    weights = f"{spec.path}/model.safetensors"
    with open(weights, "r+b") as handle:  # one byte changed, size kept
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(UserError) as info:
        resolve_model("all-minilm-l6-v2", cache_dir=str(tmp_path))
    assert "not the published" in str(info.value) and "\n" not in str(info.value)
    shutil.rmtree(spec.path)  # extracted again, and verified, on the next use
    assert resolve_model("all-minilm-l6-v2", cache_dir=str(tmp_path)).task == "embed"


@pytest.mark.parametrize("mode,flag", [("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                                       ("max", "pooling_mode_max_tokens"), ("lasttoken", "pooling_mode_lasttoken")])
def test_sentence_transformers_directories_name_their_pooling(tmp_path, mode, flag):
    folder = write_st_dir(tmp_path / "st", [TRANSFORMER, POOLING, NORMALIZE], {flag: True})
    head = resolve_model(str(folder)).head
    assert (head.task, head.pooling, head.normalize) == ("embed", mode, True)


@pytest.mark.parametrize("case,message", [
    ("unknown-module", "names module 'sentence_transformers.models.CNN'"),
    ("no-mode", "sets no pooling mode"),
    ("two-modes", "sets several pooling modes"),
    ("sqrt-mode", "pooling mean_sqrt_len_tokens is not supported"),
    ("no-pooling", "has no Pooling module"),
    ("not-a-list", "must be a list of modules"),
    ("dense-without-weights", "has no weights"),
    ("dense-pickle-only", "only pytorch_model.bin, pickle weights"),
])
def test_bad_sentence_transformers_directories_are_one_line(tmp_path, case, message):
    folder = tmp_path / case
    if case == "unknown-module":
        write_st_dir(folder, [TRANSFORMER, {"idx": 1, "path": "x", "type": ST + "CNN"}])
    elif case == "no-mode":
        write_st_dir(folder, [TRANSFORMER, POOLING], {"word_embedding_dimension": 128})
    elif case == "two-modes":
        write_st_dir(folder, [TRANSFORMER, POOLING], {"pooling_mode_cls_token": True,
                                                      "pooling_mode_mean_tokens": True})
    elif case == "sqrt-mode":
        write_st_dir(folder, [TRANSFORMER, POOLING], {"pooling_mode_mean_sqrt_len_tokens": True})
    elif case == "no-pooling":
        write_st_dir(folder, [TRANSFORMER, NORMALIZE])
    elif case == "not-a-list":
        write_st_dir(folder, {"type": "x"})
    else:
        write_st_dir(folder, [TRANSFORMER, POOLING, {"idx": 2, "path": "2_Dense", "type": ST + "Dense"}],
                     {"pooling_mode_mean_tokens": True})
        (folder / "2_Dense").mkdir()
        (folder / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 128, "out_features": 64}))
        if case == "dense-pickle-only":  # passed the check, then failed in the worker (audit L11)
            (folder / "2_Dense" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(UserError) as info:
        resolve_model(str(folder))
    assert message in str(info.value) and "\n" not in str(info.value)


def classifier_dir(root, **config):
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "bert",
                                                  "architectures": ["BertForSequenceClassification"],
                                                  "num_hidden_layers": 2, "hidden_size": 128,
                                                  "num_attention_heads": 2, "intermediate_size": 512, **config}))
    return root


def test_sequence_classifiers_are_rerankers_or_classifiers_by_their_labels(tmp_path):
    one = resolve_model(str(classifier_dir(tmp_path / "one", id2label={"0": "score"})))
    three = resolve_model(str(classifier_dir(tmp_path / "three", id2label={"1": "b", "0": "a", "2": "c"})))
    assert one.task == "rerank" and three.task == "classify" and three.head.labels == ("a", "b", "c")


@pytest.mark.parametrize("model,task,message", [
    ("all-minilm-l6-v2", "rerank", "is a sentence embedder (task=embed); it cannot do task=rerank"),
    ("all-minilm-l6-v2", "classify", "it cannot do task=classify"),
    ("bert-tiny", "summarise", "unknown task 'summarise'"),
])
def test_a_task_the_model_cannot_do_is_one_line(model, task, message):
    with pytest.raises(UserError) as info:
        resolve_model(model, task=task)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_classifier_without_labels_is_one_line(tmp_path):
    folder = classifier_dir(tmp_path / "nolabels")
    with pytest.raises(UserError, match="sequence classifier without labels"):
        resolve_model(str(folder))


def test_a_plain_encoder_directory_has_no_rerank_head(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 8,
                                                    "num_attention_heads": 2, "intermediate_size": 16}))
    assert resolve_model(str(folder), task="embed").head.pooling == "mean"  # any encoder can be pooled
    with pytest.raises(UserError, match="has no cross-encoder"):
        resolve_model(str(folder), task="rerank")


def test_presets_take_every_task_and_decoders_pool_the_last_token():
    assert resolve_model("bert-tiny", task="rerank").head.labels == ("score",)
    assert len(resolve_model("bert-tiny", task="classify").head.labels) == 3
    assert resolve_model("qwen3-tiny").head == HeadSpec(task="embed", pooling="lasttoken", normalize=True,
                                                        source="preset")
    assert head_for_task(HeadSpec(), "embed", "preset", "m", decoder=True).pooling == "lasttoken"
    assert resolve_model("bert-tiny").task == "encode"  # a preset is a plain encoder unless task= says


def test_the_head_enters_the_trial_key_only_when_there_is_one():
    from corescale.config import BenchmarkConfig
    from corescale.record.trial import spec_key

    cfg = BenchmarkConfig(model="bert-tiny")
    plain, embed = resolve_model("bert-tiny"), resolve_model("bert-tiny", task="embed")
    assert "head" not in plain.identity() and "head" in embed.identity()
    assert spec_key(cfg, plain) != spec_key(cfg, embed)


@pytest.mark.parametrize("text,task,message", [
    ("ndcg_at_10_mean>=0.9", "embed", "(a metric of task rerank), not a metric of task=embed"),
    ("cosine_p1>=0.99", "classify", "not a metric of task=classify"),
    ("cosine_p1=0.99", "embed", "is not METRIC:BOUND"),
    ("cosine_p1<=0.99", "embed", "bound it with >="),
    ("max_probability_diff>=0.1", "classify", "bound it with <="),
    ("cosine_p1>=1e999", "embed", "must be finite"),
    ("cosine_p1>=nan", "embed", "is not METRIC:BOUND"),
    ("cosine_p1>=0.99", "encode", "task=encode is judged by raw drift"),
])
def test_min_quality_of_another_task_or_malformed_is_one_line(text, task, message):
    with pytest.raises(UserError) as info:
        parse_gate(text, task)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_every_default_gate_parses_and_names_its_tasks_metrics():
    for task in TASKS.values():
        assert {b.metric for b in parse_gate(task.gate, task.name)} <= set(task.directions)
    assert [b.text() for b in parse_gate(None, "embed")] == ["cosine_p1>=0.99", "recall_at_10>=0.95"]
    assert parse_gate("cosine_p1:0.995", "embed") == parse_gate({"cosine_p1": 0.995}, "embed")
    assert [b.text() for b in parse_gate("max_probability_diff:0.1", "classify")] == ["max_probability_diff<=0.1"]


def test_embed_metrics_see_a_rotation_and_a_neighbour_swap():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((50, 16))
    same = measured.embed_metrics(ref.copy(), ref)
    assert same["cosine_min"] == pytest.approx(1.0) and same["recall_at_10"] == 1.0
    noisy = measured.embed_metrics(ref + rng.standard_normal(ref.shape) * 0.5, ref)
    assert noisy["cosine_p1"] < 0.99 and noisy["recall_at_10"] < 1.0
    assert noisy["cosine_min"] <= noisy["cosine_p1"] <= noisy["cosine_mean"]


def test_rerank_metrics_grade_the_top_of_the_list():
    ref = np.array([5.0, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6])
    groups = np.zeros(len(ref), dtype=int)
    assert measured.rerank_metrics(ref, ref, groups)["ndcg_at_10_mean"] == pytest.approx(1.0)
    swapped_top = ref.copy()
    swapped_top[[0, 1]] = swapped_top[[1, 0]]
    swapped_tail = ref.copy()
    swapped_tail[[10, 11]] = swapped_tail[[11, 10]]
    top, tail = (measured.rerank_metrics(x, ref, groups) for x in (swapped_top, swapped_tail))
    assert top["top1_agreement"] == 0.0 and tail["top1_agreement"] == 1.0
    assert top["ndcg_at_10_mean"] < 1.0 and tail["ndcg_at_10_mean"] == pytest.approx(1.0)  # beyond the top 10
    assert top["kendall_tau_mean"] == pytest.approx(tail["kendall_tau_mean"])
    assert top["kendall_tau_mean"] < 1.0


def test_classify_metrics_count_labels_and_probabilities():
    ref = np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 0.9]])
    flipped = np.array([[2.0, 0.0], [0.0, 2.0], [0.9, 1.0]])
    found = measured.classify_metrics(flipped, ref)
    assert found["label_agreement"] == pytest.approx(2 / 3) and 0 < found["max_probability_diff"] < 0.1


def test_the_builtin_corpus_and_rerank_sets_are_real_text_with_their_origin():
    texts = corpus.texts()
    assert len(texts) > 1500 and len(set(texts)) == len(texts)
    assert all(t.origin.split(":")[0] in ("debian", "pypi") for t in corpus.entries())
    sets = corpus.rerank_sets(5, 16)
    assert len(sets) == 5 and all(len(s.documents) == 16 and len(set(s.documents)) == 16 for s in sets)
    assert sets == corpus.rerank_sets(5, 16)  # deterministic
