"""Where a tune's time went (tune/spent.py): each result once, in the first stage that used it, its wall time and
its QPS search's share; results measured before the tune began are reused, not spent."""

import json
import shutil
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from corescale.tune.spent import spent

SERVED = Path(__file__).parent / "data" / "schema2" / "20261202-053606-bert-tiny-pytorch-fp32-b1-s32-i1-98456401"


def _copy(tmp_path: Path, name: str, started: str | None = None) -> str:
    target = tmp_path / name
    shutil.copytree(SERVED, target)
    if started is not None:  # measured earlier (another run under the same output_dir)
        data = json.loads((target / "result.json").read_text())
        moved = datetime.strptime(started, "%Y-%m-%dT%H:%M:%S%z").timestamp() - \
            datetime.strptime(data["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
        data.update(started_at=started, finished_at=data["finished_at"] + moved)
        (target / "result.json").write_text(json.dumps(data))
    return str(target)


def test_each_result_counts_once_in_its_first_stage_and_earlier_ones_are_reused(tmp_path):
    record = json.loads((SERVED / "result.json").read_text())
    began = datetime.strptime(record["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    wall = record["elapsed_s"]
    searching = sum(step["duration_s"] for step in record["server"]["steps"])
    baseline, old = _copy(tmp_path, "baseline"), _copy(tmp_path, "old", "2026-12-02T04:00:00+0000")
    screen, full, final = _copy(tmp_path, "screen"), _copy(tmp_path, "full"), _copy(tmp_path, "final")
    trials = [SimpleNamespace(screen={"path": screen}, full={"path": full}),
              SimpleNamespace(screen={"path": str(tmp_path / "removed since")}, full=None)]
    rows = [SimpleNamespace(role="baseline", paths=[baseline, old]),
            SimpleNamespace(role="winner", paths=[full, final])]
    found = spent(trials, rows, 100.0, began)
    stages = {s.stage: s for s in found.stages}
    assert {k: s.measurements for k, s in stages.items()} == {"baseline": 1, "peer": 0, "screens": 1,
                                                                "full windows": 1, "final repeats": 1}
    assert found.reused == 1 and abs(found.measured_s - 4 * wall) < 1e-6
    assert all(abs(s.search_s - searching) < 1e-6 for s in found.stages if s.measurements)
    line = found.line()
    assert line.startswith(f"spent: 100 s — baseline 1 × {wall:.0f} s ({searching:.0f} s searching), screens 1 × ")
    assert "peer" not in line and "outside the QPS searches" in line and "1 result(s) of earlier runs reused" in line
    assert f"the rest (the sampler, verdicts, commits) {100 - 4 * wall:.0f} s" in line
