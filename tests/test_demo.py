"""`corescale demo` (`make run`): the tune of the default model with its defaults, overridable word by word."""

import json
from pathlib import Path

import pytest
from helpers import QUICK_ANY_MODEL, corescale

from corescale.commands.demo import demo_words


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the tune's trials, the baseline's and the peer's repeats, each loading the model
def test_demo_tunes_the_real_model_and_ends_with_the_peer_ratio_the_report_and_the_recipe(tmp_path):
    """make run's tune of all-MiniLM-L6-v2 on the built-in text, kept small: its ending gives the speed-up over the
    out-of-box baseline and over the peer (sentence-transformers' encode(), whose quality is the reference's)."""
    # workload.samples: a window covers every query of the set once (the demo's 256 texts: 256 calls a trial)
    small = ["objective=throughput", "workload.samples=64", "trials=1", "tune.repeats=2", "tune.top_k=1",
             "tune.screen=0.5",
             "space.backend=[pytorch]", "space.precision=[fp32]", "space.layout=[1x1]", "space.allocator=[default]",
             "space.openmp=[default]", "space.threads=[1]", "space.backend.linear=[default]"]
    proc = corescale("demo", *QUICK_ANY_MODEL, *small, f"output_dir={tmp_path}", "--no-progress", timeout=1100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    report = Path(next(line for line in lines if line.startswith("report: ")).removeprefix("report: "))
    assert report.is_file() and report.parent.parent == tmp_path and report.parent.name.startswith("tune-")
    assert "× the out-of-box throughput" in proc.stdout and '<section id="tuner">' in report.read_text()
    assert (report.parent / "recipe" / "recipe.sh").is_file()

    assert "× sentence-transformers encode() (" in proc.stdout  # its 95 % CI, or over 2 repeats, its repeats
    doc = json.loads((report.parent / "tune.json").read_text())
    peer = doc["peer"]
    assert peer["role"] == "peer" and peer["label"] == "peer: sentence-transformers encode()"
    assert len(peer["paths"]) == 2 and peer["throughput"]["mean"] > 0 and peer["quality"]["mean"] >= 0.9999
    assert doc["peer_speedup"]["low"] <= doc["peer_speedup"]["ratio"] <= doc["peer_speedup"]["high"]
    assert doc["winner"] != peer["label"] and all(f["role"] != "peer" for f in doc["finalists"])
    record = json.loads((Path(peer["paths"][0]) / "result.json").read_text())
    quality = record["quality"]
    assert quality["task"] == "embed" and quality["passed"] is True
    assert quality["metrics"]["cosine_min"] >= 0.9999 and quality["metrics"]["recall_at_10"] == 1.0
    framework = record["instance_reports"][0]["framework"]
    assert framework["call"] == "SentenceTransformer.encode" and framework["num_threads"] >= 1


def test_demo_defaults_give_way_to_the_users_words():
    words = demo_words(["objective=throughput"])  # the service's defaults: tests/test_tune_service.py
    assert {"model=all-minilm-l6-v2", "workload=builtin", "tokenize=true", "sequence_length=128", "batch_size=1",
            "budget=5m"} <= set(words)
    assert "space.backend=[pytorch,onnxruntime,openvino]" in words
    mine = demo_words(["model=bert-tiny", "backend=onnxruntime", "space.batch_size=[1,2]", "workload=my.txt",
                       "objective=throughput"])
    assert "model=all-minilm-l6-v2" not in mine and "model=bert-tiny" in mine and "workload=builtin" not in mine
    assert not any(w.startswith(("space.backend=", "batch_size=")) for w in mine)
