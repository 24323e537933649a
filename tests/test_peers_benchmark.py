"""benchmarks/peers.py in its smallest mode: sentence-transformers' out-of-the-box encode() and one corescale
configuration on 64 built-in texts, one round (the separate-venv peers are left out: they need their own
virtualenv). The table has its columns, the baseline agrees with its own fp32 reference, and the JSON holds the raw
figures of each peer."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow


def test_peers_tiny_mode_prints_the_table_and_writes_the_raw_figures(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               COLUMNS="60")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--texts", "64", "--repeats", "1",
                           "--batch", "16", "--duration", "0.5", "--peers", "st-torch,corescale",
                           "--output", str(tmp_path / "out"), "--corescale", "backend=onnxruntime"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| peer |"))
    for column in ("texts/s", "tokens/s", "cos min / p1 / mean", "recall@10", "× st-torch"):
        assert column in header
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert "failed" not in rows["st-torch"] and "failed" not in rows["corescale"], proc.stdout
    assert "family" in proc.stdout and "UTC" in proc.stdout  # the CPU and the date are named

    doc = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert doc["texts"] == 64 and doc["real_tokens"] > 64 and doc["cpu"]["model_name"]
    baseline = doc["peers"]["st-torch"]
    assert baseline["texts_per_s"]["best"] > 0 and baseline["tokens_per_s"]["mean"] > baseline["texts_per_s"]["min"]
    assert baseline["quality"]["cosine_p1"] > 0.9999 and baseline["quality"]["recall_at_10"] > 0.99
    ours = doc["peers"]["corescale"]
    assert ours["texts_per_s"]["mean"] > 0 and ours["quality_section"]["passed"] is True
    assert ours["quality"]["cosine_p1"] > 0.999  # fp32 ONNX Runtime against corescale's fp32 PyTorch reference
    assert doc["corescale_overrides"] == ["backend=onnxruntime"] and "vs_default" in doc["goal"]
    assert len(doc["runs"]["st-torch"]) == 1 and len(doc["runs"]["corescale"]) == 1
