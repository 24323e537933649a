"""Bad input: one clear line on stderr, exit code 2, no traceback, nothing written."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT, corescale

SCHEMA1 = ROOT / "tests" / "data" / "schema1"

CASES = [
    (["backend=tensorflowz"], "unknown backend 'tensorflowz'; allowed: "),
    (["model=bert-huge"], "unknown model 'bert-huge': not a preset"),
    (["colour=red"], "unknown key 'colour'; allowed keys: model"),
    (["batch_size=0"], "batch_size must be > 0"),
    (["sequence_length=-4"], "sequence_length must be > 0"),
    (["duration=0"], "duration must be > 0"),
    (["sequence_length=600", "model=bert-tiny"], "exceeds the maximum of 512 positions"),
    (["threads=4096"], "exceeds the"),
    (["batch_size=eight"], "batch_size: expected integer, got 'eight'"),
    (["duration=soon"], "duration: expected float"),
    (["precision=fp8"], "unknown precision 'fp8'; allowed: fp32, bf16, int8"),
    (["padding_fraction=1.5"], "padding_fraction must be in [0, 1)"),
    (["batch_size=[1"], "cannot parse overrides"),
    (["total_batch_size=3", "instances=2"], "does not split evenly"),
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(c[0]) for c in CASES])
@pytest.mark.slow
def test_bad_input(args, message, tmp_path):
    out = tmp_path / "out"
    proc = corescale("run", "model=bert-tiny", *args, f"output_dir={out}", "--no-progress")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.rglob("*"))


@pytest.mark.slow
def test_local_dir_without_config(tmp_path):
    (tmp_path / "model").mkdir()
    proc = corescale("run", f"model={tmp_path / 'model'}", f"output_dir={tmp_path / 'out'}")
    assert proc.returncode == 2 and "has no config.json" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_debug_shows_traceback(tmp_path):
    proc = corescale("run", "batch_size=0", "--debug", f"output_dir={tmp_path}")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.slow
def test_show_missing_and_corrupt(tmp_path):
    proc = corescale("show", str(tmp_path))
    assert proc.returncode == 2 and "no result" in proc.stderr
    (tmp_path / "result.json").write_text("{")
    proc = corescale("show", str(tmp_path))
    assert proc.returncode == 2 and "corrupted" in proc.stderr and len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
def test_unknown_subcommand():
    proc = corescale("frobnicate")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_batch_split_must_divide_the_instances_a_layout_makes(tmp_path):
    proc = corescale("run", "model=bert-tiny", "layout=max", "total_batch_size=3", f"output_dir={tmp_path / 'o'}")
    assert proc.returncode == 2 and "does not split evenly" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_overrides_may_follow_options(capsys):
    from corescale.cli import main

    assert main(["plan", "instances=1", "--json", "cores_per_instance=1"]) == 0
    (instance,) = json.loads(capsys.readouterr().out)["instances"]
    assert len(instance["cpus"]) == 1
    assert main(["info", "--json", "stray"]) == 2  # a command without overrides still refuses stray words
    assert "unrecognized arguments: stray" in capsys.readouterr().err


@pytest.mark.slow
def test_a_closed_stdout_pipe_ends_quietly():
    """`corescale ... | head -0`: the reader is gone before anything is written; no traceback, exit 141."""
    proc = subprocess.Popen([sys.executable, "-m", "corescale.cli", "results", str(SCHEMA1), "--csv", "-"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Broken pipe" not in err


@pytest.mark.slow
def test_corescale_alone_is_a_tour_of_the_subcommands_in_the_order_a_user_meets_them():
    proc = corescale()
    assert proc.returncode == 0 and not proc.stderr
    lines = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("  corescale ")]
    assert lines[:3] == ["demo", "run", "study"] and {"tune", "report", "cost", "compare"} <= set(lines)
