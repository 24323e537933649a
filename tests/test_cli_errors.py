"""Bad input: one clear line on stderr, exit code 2, no traceback, nothing written. The refusals run in this
process (the CLI's own main()); a few run in a fresh process for the exit status and stderr a shell sees."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT, corescale

from corescale.cli import main

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
IN_A_PROCESS = ["backend=tensorflowz", "batch_size=eight", "total_batch_size=3 instances=2"]


def refused(argv, capsys) -> str:
    """main(argv) in this process: exit 2, one stderr line, nothing on stdout; that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # an unknown name's hub lookup: without DNS it waits out a timeout
    out = tmp_path / "out"
    assert message in refused(["run", "model=bert-tiny", *args, f"output_dir={out}", "--no-progress"], capsys)
    assert not out.exists() or not any(out.rglob("*"))


@pytest.mark.parametrize("args", IN_A_PROCESS)
@pytest.mark.slow
def test_bad_input_in_a_real_process(args, tmp_path):
    (message,) = [m for a, m in CASES if " ".join(a) == args]
    out = tmp_path / "out"
    proc = corescale("run", "model=bert-tiny", *args.split(), f"output_dir={out}", "--no-progress")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.rglob("*"))


def test_local_dir_without_config(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    assert "has no config.json" in refused(["run", f"model={tmp_path / 'model'}", f"output_dir={tmp_path / 'out'}"],
                                           capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_debug_shows_traceback(tmp_path):
    proc = corescale("run", "batch_size=0", "--debug", f"output_dir={tmp_path}")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_show_missing_and_corrupt(tmp_path, capsys):
    assert "no result" in refused(["show", str(tmp_path)], capsys)
    (tmp_path / "result.json").write_text("{")
    assert "corrupted" in refused(["show", str(tmp_path)], capsys)


def test_unknown_subcommand(capsys):
    assert "frobnicate" in refused(["frobnicate"], capsys)


def test_batch_split_must_divide_the_instances_a_layout_makes(tmp_path, capsys):
    argv = ["run", "model=bert-tiny", "layout=max", "total_batch_size=3", f"output_dir={tmp_path / 'o'}"]
    assert "does not split evenly" in refused(argv, capsys)
    assert not (tmp_path / "o").exists()


def test_overrides_may_follow_options(capsys):
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


def test_corescale_alone_is_a_tour_of_the_subcommands_in_the_order_a_user_meets_them(capsys):
    assert main([]) == 0
    captured = capsys.readouterr()
    assert not captured.err
    lines = [line.split()[1] for line in captured.out.splitlines() if line.startswith("  corescale ")]
    assert lines[:3] == ["demo", "run", "study"] and {"tune", "report", "cost", "compare"} <= set(lines)
