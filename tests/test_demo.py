"""`corescale demo` (`make run`): the tune of the default model with its defaults, overridable word by word."""

from pathlib import Path

import pytest
from helpers import FAST, corescale

from corescale.commands.demo import demo_words


@pytest.mark.slow
def test_demo_tunes_and_ends_with_the_report_and_recipe(tmp_path):
    small = ["trials=1", "tune.repeats=2", "tune.top_k=1", "tune.screen=0.5", "space.backend=[pytorch]",
             "space.precision=[fp32]", "space.layout=[1x1]", "space.allocator=[default]", "space.openmp=[default]"]
    proc = corescale("demo", *FAST, *small, f"output_dir={tmp_path}", "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    report = Path(next(line for line in lines if line.startswith("report: ")).removeprefix("report: "))
    assert report.is_file() and report.parent.parent == tmp_path and report.parent.name.startswith("tune-")
    assert "× the out-of-box throughput" in proc.stdout and '<section id="tuner">' in report.read_text()
    assert (report.parent / "recipe" / "recipe.sh").is_file()


def test_demo_defaults_give_way_to_the_users_words():
    words = demo_words([])
    assert {"model=all-minilm-l6-v2", "workload=builtin", "tokenize=true", "sequence_length=128", "batch_size=1",
            "budget=5m"} <= set(words)
    assert "space.backend=[pytorch,onnxruntime,openvino]" in words
    mine = demo_words(["model=bert-tiny", "backend=onnxruntime", "space.batch_size=[1,2]", "workload=my.txt"])
    assert "model=all-minilm-l6-v2" not in mine and "model=bert-tiny" in mine and "workload=builtin" not in mine
    assert not any(w.startswith(("space.backend=", "batch_size=")) for w in mine)
