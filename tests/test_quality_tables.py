"""Quality in `corescale results` and `corescale report`: the task, the gate's first metric and its value, the
verdict; the report's quality section with every metric, and withheld configurations marked."""

import json
import shutil

import pytest
from helpers import FAST, corescale

from corescale.analysis import store

pytestmark = pytest.mark.slow  # one real run


@pytest.fixture(scope="module")
def root(tmp_path_factory, plain_run):
    """A real embed run (its quality passes), a withheld copy of it, and a plain encoder's run (no quality:
    conftest.py's, shared)."""
    out = tmp_path_factory.mktemp("quality") / "outputs"
    proc = corescale("run", *FAST, "task=embed", "quality_samples=32", f"output_dir={out}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    shutil.copytree(plain_run, out / plain_run.name)
    judged = next(p for p in out.iterdir() if json.loads((p / "result.json").read_text()).get("quality"))
    copy = out / "withheld-copy"
    shutil.copytree(judged, copy)
    record = json.loads((copy / "result.json").read_text())
    record["quality"].update(passed=False, failed=["cosine_p1>=0.99"])
    record["quality"]["metrics"]["cosine_p1"] = 0.9123
    record.update(status="failed", reason="withheld (quality): ...", trial_key="withheld",
                  config={**record["config"], "precision": "int8"})
    (copy / "result.json").write_text(json.dumps(record))
    return out


def test_the_results_table_has_the_quality_columns(root):
    frame = store.load(root).frame.sort_values("quality_verdict", na_position="last").reset_index(drop=True)
    assert list(frame["quality_task"][:2]) == ["embed", "embed"] and frame["quality_task"].isna().sum() == 1
    assert list(frame["quality_metric"][:2]) == ["cosine_p1", "cosine_p1"]
    assert list(frame["quality_verdict"][:2]) == ["passed", "withheld"]
    assert frame["quality_value"][0] > 0.99999 and frame["quality_value"][1] == 0.9123
    assert frame["quality_recall_at_10"][0] == 1.0 and frame["quality_gate"][0] == "cosine_p1>=0.99, recall_at_10>=0.95"
    assert "quality_task" not in store.config_columns(frame)  # not mistaken for a config key
    assert "quality_verdict" in store.summary_columns(frame)
    assert "quality_verdict" not in store.summary_columns(frame[frame["quality_task"].isna()])


def test_results_and_report_show_quality(root, tmp_path):
    proc = corescale("results", str(root), "--columns", "quality_task,quality_metric,quality_value,quality_verdict")
    assert proc.returncode == 0, proc.stderr
    assert "withheld" in proc.stdout and "passed" in proc.stdout and "cosine_p1" in proc.stdout
    assert "0.9123" in proc.stdout
    summary = corescale("results", str(root), env={"COLUMNS": "300"})
    assert "verdict" in summary.stdout and "withheld" in summary.stdout

    from corescale.report.html import build

    out = tmp_path / "report.html"
    build(root, out)
    html = out.read_text()
    assert 'id="quality"' in html and "Quality (2 judged, 1 withheld)" in html
    table = html[html.index('id="quality-table"'):html.index("</table>", html.index('id="quality-table"'))]
    assert table.count("<tr class=") == 2 and 'class="withheld"' in table and "withheld (quality)" in table
    for metric in ("cosine_min", "cosine_p1", "cosine_mean", "recall_at_10"):
        assert f"<th>{metric}</th>" in table
    assert "0.9123" in table and "cosine_p1&gt;=0.99" in table and "pytorch fp32" in html
