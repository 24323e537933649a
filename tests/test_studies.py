"""Scaling studies: the trial grid, the efficiency maths, the figures, and each study run for real."""

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import LOOP, corescale, needs_two_cpus
from matplotlib.figure import Figure

from corescale.errors import UserError
from corescale.report import plots
from corescale.report.study import write_study
from corescale.trials import studies

STUDY_DIR = Path("/tmp/study")


def grid(kind, overrides, cores=48, values=None):
    return studies.trial_grid(kind, overrides, cores, STUDY_DIR, values)


def keys(trial) -> dict:
    return dict(o.split("=", 1) for o in trial.overrides)


def test_default_values_are_powers_of_two_then_the_limit():
    assert studies.default_values(48) == [1, 2, 4, 8, 16, 32, 48]
    assert studies.default_values(8) == [1, 2, 4, 8]
    assert studies.default_values(2) == [1, 2]
    assert studies.default_values(1) == [1]


def test_cores_grid_sweeps_user_lists_times_core_counts():
    trials = grid("cores", ["model=bert-tiny", "sequence_length=32,128"], values=[1, 4])
    assert [(t.group, t.value) for t in trials] == [
        ("sequence_length=32", 1), ("sequence_length=32", 4), ("sequence_length=128", 1), ("sequence_length=128", 4)]
    assert keys(trials[1]) == {"model": "bert-tiny", "sequence_length": "32", "instances": "1",
                               "cores_per_instance": "4", "output_dir": str(STUDY_DIR)}


def test_instances_grid_keeps_the_users_instance_size():
    trials = grid("instances", ["cores_per_instance=6", "output_dir=/elsewhere"])
    assert [t.value for t in trials] == [1, 2, 4, 8]  # 48 cores / 6
    assert keys(trials[-1]) == {"cores_per_instance": "6", "instances": "8", "output_dir": str(STUDY_DIR)}
    assert [t.group for t in trials] == [""] * 4


def test_batch_grid_splits_the_total_batch_over_divisors():
    trials = grid("batch", ["total_batch_size=8"])
    assert [(keys(t)["instances"], keys(t)["cores_per_instance"]) for t in trials] == [
        ("1", "48"), ("2", "24"), ("4", "12"), ("8", "6")]
    assert [t.value for t in grid("batch", [], cores=2)] == [1, 2]  # default total batch 8, 2 cores
    assert keys(grid("batch", [], cores=2)[1])["total_batch_size"] == "8"


@pytest.mark.parametrize("kind, overrides, values, message", [
    ("cores", ["cores_per_instance=2"], None, "sets cores_per_instance itself"),
    ("instances", ["instances=4"], None, "sets instances itself"),
    ("batch", ["batch_size=2"], None, "sets batch_size itself"),
    ("cores", [], [64], "one instance can use 1 to 48 cores"),
    ("instances", ["cores_per_instance=24"], [3], "at most 2 instances"),
    ("batch", ["total_batch_size=8"], [3], "must divide total_batch_size=8"),
    ("sizes", [], None, "unknown study 'sizes'"),
])
def test_grid_errors(kind, overrides, values, message):
    with pytest.raises(UserError, match=message):
        grid(kind, overrides, values=values)


def frame(kind, axis_values, **columns):
    n = len(axis_values)
    base = {"group": "", studies.AXIS[kind]: axis_values, "status": ["ok"] * n}
    if kind == "cores":
        base["total_cores"] = axis_values
    return pd.DataFrame({**base, **columns})


def test_cores_efficiency():
    table = studies.add_scaling("cores", frame("cores", [1, 2, 4], latency_p50_ms=[100.0, 50.0, 40.0]))
    assert table["speedup"].tolist() == pytest.approx([1.0, 2.0, 2.5])
    assert table["efficiency"].tolist() == pytest.approx([1.0, 1.0, 0.625])


def test_instances_efficiency_against_the_ideal_line_with_a_failed_trial():
    data = frame("instances", [1, 2, 4], throughput_samples_per_s=[10.0, 19.0, np.nan])
    data.loc[2, "status"] = "failed"
    table = studies.add_scaling("instances", data)
    assert table["ideal_throughput_samples_per_s"].tolist() == [10.0, 20.0, 40.0]
    assert table["efficiency"].tolist()[:2] == pytest.approx([1.0, 0.95])
    assert math.isnan(table["efficiency"].iloc[2])


def test_batch_gains_per_group():
    data = pd.concat([
        frame("batch", [1, 2], throughput_samples_per_s=[10.0, 18.0], max_instance_p50_ms=[100.0, 60.0]),
        frame("batch", [2, 1], throughput_samples_per_s=[30.0, 20.0], max_instance_p50_ms=[50.0, 80.0]),
    ], ignore_index=True)
    data.loc[2:, "group"] = "sequence_length=32"
    table = studies.add_scaling("batch", data)
    assert table["throughput_gain"].tolist() == pytest.approx([1.0, 1.8, 1.5, 1.0])
    assert table["latency_gain"].tolist() == pytest.approx([1.0, 100 / 60, 80 / 50, 1.0])


def example(kind):
    groups = ["sequence_length=32"] * 3 + ["sequence_length=128"] * 3
    n = [1, 2, 4] * 2
    return pd.DataFrame({"group": groups, "instances": n if kind != "cores" else [1] * 6, "total_cores": n,
                         "cores_per_instance": [1] * 6 if kind == "instances" else [4, 2, 1] * 2,
                         "status": ["ok"] * 6, "model": "bert-base", "batch_size": 1,
                         "latency_p50_ms": [90.0, 50, 30, 300, 160, 90],
                         "max_instance_p50_ms": [90.0, 60, 40, 300, 180, 100],
                         "throughput_samples_per_s": [11.0, 20, 36, 3.3, 6, 11]})


@pytest.mark.parametrize("kind, function, ylabel", [
    ("cores", plots.cores_figure, "latency p50 (ms)"),
    ("instances", plots.instances_figure, "total throughput (samples/s)"),
])
def test_scaling_figures_have_units_ideal_line_and_efficiency(kind, function, ylabel, tmp_path):
    fig = function(example(kind))
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_ylabel() == ylabel and ax.get_xlabel()
    assert ax.get_title()
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 2  # one ideal-linear line per group
    assert any(text.get_text().endswith("%") for text in ax.texts)  # efficiency annotated
    assert sorted(text.get_text() for text in ax.get_legend().get_texts())[:2] == [
        "ideal (linear) sequence_length=128", "ideal (linear) sequence_length=32"]
    path = plots.save_figure(fig, tmp_path / "figure.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]  # no temp file left behind


def test_batch_figure_has_latency_and_throughput_panels():
    fig = plots.batch_figure(example("batch"))
    left, right = fig.axes
    assert left.get_ylabel() == "max instance latency p50 (ms)"
    assert right.get_ylabel() == "total throughput (samples/s)"
    assert any(text.get_text() == "1.82x" for text in right.texts)


def test_figures_skip_failed_trials():
    data = example("instances")
    data.loc[5, "status"] = "failed"
    data.loc[5, "throughput_samples_per_s"] = np.nan
    fig = plots.instances_figure(data)
    solid = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "-"]
    assert sorted(len(line.get_xdata()) for line in solid) == [2, 3]


# ---- real studies on bert-tiny, measured by the toy backend (a real one, in real worker processes): their subject
# is the study (its grid, sums, files and resume), not a framework ----------------------------------------------


def check_study_dir(out: Path, kind: str, rows: int) -> pd.DataFrame:
    (study_dir,) = [p for p in out.iterdir() if p.name.startswith(f"study-{kind}-")]
    table = pd.read_csv(study_dir / "study.csv")
    assert len(table) == rows and (table["status"] == "ok").all()
    assert (study_dir / "study.png").read_bytes()[:4] == b"\x89PNG"
    document = json.loads((study_dir / "study.json").read_text())
    assert document["study"] == kind and len(document["trials"]) == rows and len(document["table"]) == rows
    for trial in document["trials"]:
        assert (Path(trial["path"]) / "result.json").is_file() and Path(trial["path"]).parent == study_dir
    assert not [p for p in study_dir.iterdir() if p.name.startswith(".tmp-")]
    return table


@needs_two_cpus
@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_cores_study_cli(tmp_path):
    proc = corescale("study", "cores", *LOOP, f"output_dir={tmp_path}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    table = check_study_dir(tmp_path, "cores", 2)
    assert table["cores"].tolist() == [1, 2] and table["efficiency"].iloc[0] == 1.0
    assert "cores study" in proc.stdout and "study.png" in proc.stdout


@needs_two_cpus
@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_instances_study(tmp_path):
    study = studies.run_study("instances", [*LOOP, f"output_dir={tmp_path}"])
    write_study(study)
    table = study.frame
    assert study.failures == 0 and study.state.count("ok") == 2
    check_study_dir(tmp_path, "instances", 2)
    assert table["instances"].tolist() == [1, 2]
    assert table["ideal_throughput_samples_per_s"].iloc[1] == pytest.approx(
        2 * table["throughput_samples_per_s"].iloc[0])
    assert table["efficiency"].iloc[1] == pytest.approx(
        table["throughput_samples_per_s"].iloc[1] / table["ideal_throughput_samples_per_s"].iloc[1])


@needs_two_cpus
@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_batch_study(tmp_path):
    study = studies.run_study("batch", [*LOOP, "total_batch_size=4", f"output_dir={tmp_path}"])
    write_study(study)
    table = study.frame
    assert study.failures == 0
    check_study_dir(tmp_path, "batch", 2)
    assert table["batch_size"].tolist() == [4, 2] and table["cores_per_instance"].tolist() == [2, 1]
    assert (table["max_instance_p50_ms"] > 0).all() and table["throughput_gain"].iloc[0] == 1.0


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_study_records_a_failed_trial_and_resumes_by_key(tmp_path):
    # the toy backend's second trial refuses to load inside the instance (a user error there): recorded as that
    # trial's failure, not the end
    args = ["study", "cores", *LOOP, "backend.refuse=no,broken", f"output_dir={tmp_path}",
            "--values", "1", "--no-progress"]
    first = corescale(*args)
    assert first.returncode == 1, first.stderr
    assert "1 of 2 trial(s) failed" in first.stderr
    (study_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("study-cores-")]
    document = json.loads((study_dir / "study.json").read_text())
    assert [t["status"] for t in document["trials"]] == ["ok", "failed"] and document["failed_trials"] == 1
    assert "the toy backend refuses to load: broken" in document["trials"][1]["reason"]
    assert all(t["trial_key"] for t in document["trials"]) and not any(t["resumed"] for t in document["trials"])
    runs = {p.name for p in study_dir.iterdir() if (p / "result.json").is_file()}
    time.sleep(1.1)  # a new study directory name
    again = corescale(*args)
    assert again.returncode == 1 and "1 trial(s) resumed from earlier results" in again.stdout
    (second,) = [p for p in tmp_path.iterdir() if p.name.startswith("study-cores-") and p != study_dir]
    redone = json.loads((second / "study.json").read_text())
    assert [t["resumed"] for t in redone["trials"]] == [True, False]  # the ok trial reused, the failed one again
    assert redone["trials"][0]["path"] == document["trials"][0]["path"]
    assert redone["table"][0]["throughput_samples_per_s"] == document["table"][0]["throughput_samples_per_s"]
    assert len([p for p in second.iterdir() if (p / "result.json").is_file()]) == 1 and len(runs) == 2


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_study_errors_are_one_line_exit_2(tmp_path):
    proc = corescale("study", "instances", *LOOP, "instances=2", f"output_dir={tmp_path}")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "sets instances itself" in proc.stderr
    proc = corescale("study", "cores", *LOOP, f"output_dir={tmp_path}", "--values", "1,x")
    assert proc.returncode == 2 and "--values '1,x'" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_study_with_repeats_reports_means_and_intervals(tmp_path):
    study = studies.run_study("cores", [*LOOP, "repeats=2", f"output_dir={tmp_path}"], values=[1])
    (row,) = study.frame.to_dict(orient="records")
    records = [r.record for r in study.state.rows]
    assert row["repeats"] == 2 and len(records) == 2 and sorted(r.repeat for r in records) == [0, 1]
    mean = sum(r.metrics.throughput_samples_per_s for r in records) / 2
    assert row["throughput_samples_per_s"] == pytest.approx(mean)
    assert row["throughput_samples_per_s_ci95_low"] <= mean <= row["throughput_samples_per_s_ci95_high"]
    assert not row["throughput_samples_per_s_ci95_usable"]  # over 2 repeats: the repeats say more
    assert [t["repeat"] for t in study.document["trials"]] == [0, 1]


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_study_on_ray_goes_to_the_cluster_never_silently_local(tmp_path):
    """A study dispatches like a sweep: with executor=ray an unreachable cluster is the Ray executor's one-line
    error (before, the study ran locally without a word), and nothing is measured or written."""
    proc = corescale("study", "cores", *LOOP, "executor=ray", "executor.address=127.0.0.1:1", "--values", "1",
                     f"output_dir={tmp_path}", "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "cannot reach the Ray cluster at '127.0.0.1:1'" in proc.stderr
    assert not any(tmp_path.iterdir())
