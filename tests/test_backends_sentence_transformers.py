"""backend=sentence_transformers: sentence-transformers' own encode() / CrossEncoder.predict() on real text, timed
whole, judged by the same quality check as every backend; the tune's peer baseline is checked by
test_demo.py (make run's tune)."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import QUICK_ANY_MODEL, corescale

from corescale.cli import main
from corescale.workload.models import resolve_model

TEXT = ["workload=builtin", "tokenize=true"]


def result_of(proc) -> dict:
    path = next(line for line in proc.stdout.splitlines() if line.startswith("result: ")).removeprefix("result: ")
    return json.loads((Path(path) / "result.json").read_text())


def cross_encoder_dir(root: Path) -> Path:
    """A config-built BERT cross-encoder (one label, seeded random weights) with all-MiniLM-L6-v2's tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512,
                        num_labels=1, id2label={0: "score"}, label2id={"score": 0})
    BertForSequenceClassification(config).save_pretrained(root)
    tokenizer = Path(str(resolve_model("all-minilm-l6-v2").path))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, root / name)
    return root


@pytest.mark.parametrize("words,message", [
    ([], "backend=sentence_transformers times encode()/predict() on text"),
    (TEXT + ["task=encode"], "backend=sentence_transformers computes task embed, rerank, classify only"),
    (TEXT + ["precision=int8"], "backend=sentence_transformers does not compute in precision=int8"),
    (TEXT + ["model=bert-tiny", "task=embed"], "backend=sentence_transformers needs a model directory"),
])
def test_bad_input_is_one_line_before_any_worker(tmp_path, capsys, monkeypatch, words, message):
    monkeypatch.chdir(tmp_path)
    code = main(["run", "backend=sentence_transformers", "model=all-minilm-l6-v2", *words,
                 f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.slow
def test_predict_on_a_config_built_cross_encoder_ranks_as_the_reference(tmp_path):
    model = cross_encoder_dir(tmp_path / "cross-encoder")
    proc = corescale("run", "backend=sentence_transformers", f"model={model}", *TEXT, "workload.samples=64",
                     *QUICK_ANY_MODEL, "batch_size=4", f"output_dir={tmp_path / 'out'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = result_of(proc)
    quality = record["quality"]
    assert quality["task"] == "rerank" and quality["passed"] is True  # its sigmoid keeps the logits' order
    assert quality["metrics"]["ndcg_at_10_mean"] >= 0.999 and quality["metrics"]["kendall_tau_min"] >= 0.99
    assert record["instance_reports"][0]["framework"]["call"] == "CrossEncoder.predict"
