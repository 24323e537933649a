"""`corescale run -m executor=ray` end to end: a private loopback Ray, results with their node, resume. The trials
measure the toy backend (LOOP) in real workers on the Ray node: the subject is the dispatch, not a framework."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers import LOOP, corescale

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("toy_everywhere")]  # every test here starts processes


@pytest.fixture
def env():
    """The private Ray's variables: its session dir of its own (short: Ray's socket paths have a length limit),
    removed after, so two runs of the suite on one machine never share one."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    yield {"RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": tmp}
    shutil.rmtree(tmp, ignore_errors=True)


def test_cli_sweep_on_private_ray_resumes(tmp_path, env):
    out = tmp_path / "out"
    args = ["run", "-m", "executor=ray", *LOOP, "batch_size=1,2", f"output_dir={out}", "--no-progress"]
    first = corescale(*args, env=env)
    assert first.returncode == 0, first.stderr
    records = [json.loads((p / "result.json").read_text()) for p in out.iterdir()]
    assert sorted(r["config"]["batch_size"] for r in records) == [1, 2]
    assert all(r["status"] == "ok" and r["node"]["hostname"] for r in records)
    second = corescale(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert "2 skipped" in second.stdout
    assert len(list(out.iterdir())) == 2


def test_single_run_goes_through_ray_and_reserves_the_node(tmp_path, env):
    """`corescale run executor=ray` (no -m) runs on the private Ray node, and its task holds every CPU there."""
    import os

    out = tmp_path / "out"
    proc = corescale("run", "executor=ray", *LOOP, f"output_dir={out}", "--no-progress", env=env)
    assert proc.returncode == 0, proc.stderr
    (run,) = list(out.iterdir())
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "ok" and record["executor"]["name"] == "ray"
    node = record["node"]
    assert node["hostname"] and node["ray_node_id"] and node["pid"]  # measured in a Ray worker
    assert node["reserved_cpus"] == len(os.sched_getaffinity(0))


def test_study_runs_on_ray(tmp_path, env):
    """`corescale study ... executor=ray` measures its trials on the Ray node (not here) and draws its table."""
    out = tmp_path / "out"
    proc = corescale("study", "cores", "executor=ray", *LOOP, "--values", "1", f"output_dir={out}", "--no-progress",
                     env=env)
    assert proc.returncode == 0, proc.stderr
    (study_dir,) = out.glob("study-cores-*")
    (trial,) = json.loads((study_dir / "study.json").read_text())["trials"]
    record = json.loads((Path(trial["path"]) / "result.json").read_text())
    assert trial["status"] == "ok" and record["executor"]["name"] == "ray" and record["node"]["ray_node_id"]
