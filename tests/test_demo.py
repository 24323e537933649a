"""`corescale demo`: the default study end to end (fast settings), and its trial grid."""

from pathlib import Path

from conftest import FAST, corescale

from corescale.commands.demo import demo_trials
from corescale.machine.topology import Topology
from corescale.results import store


def test_demo_runs_the_study_and_ends_with_the_report(tmp_path):
    proc = corescale("demo", *FAST, f"output_dir={tmp_path}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("report: ")
    report = Path(last.removeprefix("report: ").strip())
    assert report.is_file() and report.parent.parent == tmp_path and report.parent.name.startswith("demo-")
    for line in ("one instance on all cores", "one instance per core", "their samples as one batch on all cores"):
        assert line in proc.stdout
    cores = len(Topology.from_sysfs().physical_cores)
    table = store.load(report.parent).frame
    assert len(table) == len(demo_trials([], cores, report.parent)) and (table["status"] == "ok").all()
    assert set(table["model"]) == {"bert-tiny"} and set(table["sequence_length"]) == {32}  # overrides win
    assert {(1, cores), (cores, 1)} <= set(zip(table["instances"], table["cpus_per_instance"]))
    text = report.read_text()
    assert all(f'id="chart-{chart}"' in text for chart in ("cores", "instances", "batch", "cost"))


def test_demo_grid_on_a_big_machine():
    trials = demo_trials(["model=bert-tiny"], 48, Path("/r"))
    layouts = [(t[-2], t[-1]) for t in trials]
    assert ("instances=1", "cores_per_instance=48") in layouts and ("instances=48", "cores_per_instance=1") in layouts
    scaling = [c for i, c in layouts if i == "instances=1"]
    assert scaling == [f"cores_per_instance={c}" for c in (1, 2, 4, 8, 16, 32, 48)]
    assert all("model=bert-tiny" in t and "model=bert-base" not in t and "output_dir=/r" in t for t in trials)
    assert all("sequence_length=128" in t for t in trials)
    assert sum("batch_size=1" in t for t in trials) == len(trials) - 1
    assert trials[-1][-3:] == ["instances=1", "cores_per_instance=48", "batch_size=48"]  # the batch split


def test_demo_refuses_layout_overrides(tmp_path):
    proc = corescale("demo", "instances=2", f"output_dir={tmp_path}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "the demo sets instances itself" in proc.stderr
