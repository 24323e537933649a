"""Machine-readable output read back by a script: the CLI run from a folder whose path is over 150 characters and
holds `[b]` (rich markup), stdout a pipe, COLUMNS=40. Every printed path and the CSV must parse back verbatim.
The trials measure the toy backend (LOOP): the subject is what the CLI prints, not a framework."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import LOOP

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("toy_everywhere")]  # every test here starts processes

ENV = {"COLUMNS": "40", "LINES": "10"}


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    where = tmp_path_factory.mktemp("long") / ("a" * 70) / "with [b] markup [/b] and spaces" / ("z" * 60)
    where.mkdir(parents=True)
    assert len(str(where)) > 150
    return where


def cli(where: Path, *args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "corescale.cli", *args], cwd=where, capture_output=True, text=True,
                          env={**os.environ, **ENV}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def printed(proc, label: str) -> list[Path]:
    """The paths of `label: PATH` lines, each whole on its line."""
    lines = [line.lstrip() for line in proc.stdout.splitlines()]  # a sweep indents its per-trial lines
    return [Path(line[len(label) + 2:]) for line in lines if line.startswith(f"{label}: ")]


def test_run_and_sweep_print_their_result_paths_whole(odd):
    out = odd / "out [b]"
    (one,) = printed(cli(odd, "run", *LOOP, f"output_dir='{out}'", "--no-progress"), "result")
    assert one.parent == out and (one / "result.json").is_file()
    grid = odd / "grid [b]"
    swept = printed(cli(odd, "run", "-m", *LOOP, "batch_size=1,2", f"output_dir='{grid}'", "--no-progress"), "result")
    assert len(swept) == 2 and all((p / "result.json").is_file() and p.parent == grid for p in swept)
    relative = cli(odd, "run", *LOOP, "output_dir='rel [b]'", "--no-progress")  # relative to the odd folder
    (rel,) = printed(relative, "result")
    assert (odd / rel / "result.json").is_file()


def study_files(proc) -> dict[str, Path]:
    """`csv: PATH`, `figure: PATH`, `json: PATH` lines of a study."""
    pairs = [line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line]
    return {name: Path(path) for name, path in pairs if name in ("csv", "figure", "json")}


def test_study_prints_every_file_whole(odd):
    proc = cli(odd, "study", "cores", "--values", "1", *LOOP, "output_dir=studies", "--no-progress")
    files = study_files(proc)
    assert set(files) == {"csv", "figure", "json"}, proc.stdout
    assert all((odd / path).is_file() for path in files.values()), files


def test_study_into_an_odd_absolute_dir(odd):
    proc = cli(odd, "study", "cores", "--values", "1", *LOOP, f"output_dir='{odd / 'study [b]'}'", "--no-progress")
    assert all(path.is_file() for path in study_files(proc).values())


def test_results_csv_and_show_json_are_exactly_the_data(odd):
    out = odd / "table [b]"
    (run,) = printed(cli(odd, "run", *LOOP, f"output_dir='{out}'", "--no-progress"), "result")
    table = pd.read_csv(io.StringIO(cli(odd, "results", str(out), "--csv", "-").stdout))
    assert len(table) == 1 and table["run"].iloc[0] == run.name
    record = json.loads(cli(odd, "show", str(run), "--json").stdout)
    assert record["config"]["output_dir"] == str(out)
