"""Where a tune's time went (tune/spent.py): each result once, in the first stage that used it, its wall time and
its QPS search's share; results found by key outside the tune's folder (an earlier run's) are reused, not spent."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

from corescale.tune.spent import spent

SERVED = Path(__file__).parent / "data" / "schema2" / "20261202-053606-bert-tiny-pytorch-fp32-b1-s32-i1-98456401"


def test_each_result_counts_once_in_its_first_stage_and_an_earlier_runs_are_reused(tmp_path):
    record = json.loads((SERVED / "result.json").read_text())
    wall = record["elapsed_s"]
    searching = sum(step["duration_s"] for step in record["server"]["steps"])
    tune_dir = tmp_path / "tune-1"
    baseline, screen, full, final = (shutil.copytree(SERVED, tune_dir / name) for name in ("b", "s", "f", "r"))
    old = shutil.copytree(SERVED, tmp_path / "an-earlier-run")  # under the same output_dir, found by key
    trials = [SimpleNamespace(screen={"path": str(screen)}, full={"path": str(full)}),
              SimpleNamespace(screen={"path": str(tune_dir / "removed since")}, full=None)]
    rows = [SimpleNamespace(role="baseline", paths=[str(baseline), str(old)]),
            SimpleNamespace(role="winner", paths=[str(full), str(final)])]
    found = spent(trials, rows, 100.0, tune_dir)
    stages = {s.stage: s for s in found.stages}
    assert {k: s.measurements for k, s in stages.items()} == {"baseline": 1, "peer": 0, "screens": 1,
                                                                "full windows": 1, "final repeats": 1}
    assert found.reused == 1 and abs(found.measured_s - 4 * wall) < 1e-6
    assert all(abs(s.search_s - searching) < 1e-6 for s in found.stages if s.measurements)
    line = found.line()
    assert line.startswith(f"spent: 100 s — baseline 1 × {wall:.0f} s ({searching:.0f} s searching), screens 1 × ")
    assert "peer" not in line and "outside the QPS searches" in line and "1 result(s) of earlier runs reused" in line
    assert f"between measurements (the sampler, verdicts, commits) {100 - 4 * wall:.0f} s" in line
