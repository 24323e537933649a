"""compare: trials matched by config; a real slowdown is flagged, a rerun of the same config is not.

Judged the way compare judges: across repeats (3 fresh runs per side, interleaved so that a burst of foreign load
hits both sides alike), with wide margins: the slowdown is 32x the work per call, the threshold 50 %, so neither
verdict depends on how busy the machine is."""

import io

import numpy as np
import pandas as pd
import pytest
from helpers import FAST, corescale

from corescale.analysis import compare, store

pytestmark = pytest.mark.alone  # its verdicts judge throughput across repeats

THRESHOLD = "0.5"


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare")
    roots = {name: base / name for name in ("before", "rerun", "slower")}
    # seq 128: calls of several ms, steadier than sub-millisecond ones on a shared machine
    settings = [*FAST, "sequence_length=128", "threads=1", "duration=1", "min_iterations=20", "repeats=3"]
    # one sweep: 'before' and its rerun alternate (b r b r b r), then the slower variant (batch 32, not 1)
    proc = corescale("run", "-m", *settings, f"output_dir={roots['before']},{roots['rerun']}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    proc = corescale("run", "-m", *settings, "batch_size=32", f"output_dir={roots['slower']}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return roots


@pytest.mark.slow
def test_real_slowdown_is_flagged(roots):
    proc = corescale("compare", str(roots["before"]), str(roots["slower"]), "--ignore", "batch_size",
                     "--threshold", THRESHOLD, "--fail-on-regression", "--csv", "-")
    assert proc.returncode == 1  # CI mode: a regression fails the build
    table = pd.read_csv(io.StringIO(proc.stdout))  # stdout holds exactly the CSV; the summary went to stderr
    assert list(table["verdict"]) == ["slower"] and "1 matched trial(s): 1 slower" in proc.stderr
    result = compare.compare_frames(store.load(roots["before"]).frame, store.load(roots["slower"]).frame,
                                    float(THRESHOLD), ["batch_size"])
    [row] = result.rows.to_dict(orient="records")
    assert row["repeats_before"] == row["repeats_after"] == 3
    assert row["verdict"] == "slower" and row["ratio"] > 1.5 and row["ci_low"] > 1 and row["p_value"] < 0.05
    assert "batch_size=1→32" in row["trial"] and "x slower" in row["change"]
    assert result.regressions == 1 and not result.only_before and not result.only_after
    # measured after 'before', not interleaved with it (the suite runs without the sentinel: no range)
    assert row["interleaved"] is False and row["apart_s"] >= 0 and row["sentinel_moved"] is False
    assert "measured apart in time, not interleaved" in proc.stderr


@pytest.mark.slow
def test_rerun_of_the_same_config_is_not_flagged(roots):
    proc = corescale("compare", str(roots["before"]), str(roots["rerun"]), "--threshold", THRESHOLD,
                     "--fail-on-regression")
    assert proc.returncode == 0, proc.stdout
    assert "1 matched trial(s): 0 slower, 0 faster" in proc.stdout
    rerun = compare.compare_frames(store.load(roots["before"]).frame, store.load(roots["rerun"]).frame)
    assert rerun.rows["interleaved"].tolist() == [True]  # one sweep: b r b r b r


@pytest.mark.slow
def test_unmatched_trials_are_listed(roots):
    proc = corescale("compare", str(roots["before"]), str(roots["slower"]))  # batch_size differs: no match
    assert proc.returncode == 0
    assert "only in before: " in proc.stdout and "only in after: " in proc.stdout
    assert "no trials match by config" in proc.stdout


def test_significance_across_repeats():
    rng = np.random.default_rng(1)
    before = rng.lognormal(np.log(10.0), 0.03, 8)  # one p50 per repeat
    same = rng.lognormal(np.log(10.0), 0.03, 8)
    slower = rng.lognormal(np.log(12.0), 0.03, 8)
    assert not compare.repeat_test(before, same).significant
    shifted = compare.repeat_test(before, slower)
    assert shifted.significant and shifted.ratio == pytest.approx(1.2, rel=0.05)
    assert compare.repeat_test(before[:2], slower) is None  # below MIN_REPEATS: no p-value
    assert compare.verdict(shifted, 0.10) == "slower" and compare.verdict(shifted, 0.5) == "slower (below threshold)"
    assert compare.describe_ratio(1.5) == "1.50x slower (+50%)" and compare.describe_ratio(0.8) == "1.25x faster (-20%)"


@pytest.mark.slow
def test_bad_ignore_key_is_one_line(roots):
    proc = corescale("compare", str(roots["before"]), str(roots["rerun"]), "--ignore", "colour")
    assert proc.returncode == 2 and "unknown config key(s) colour" in proc.stderr


def _searches(tmp_path, name, rates):
    """A root of real QPS-search results (tests/data/schema2's LoadGen server search), one repeat per rate; a rate
    of None is a search where no rate met the SLO."""
    import json
    import shutil
    from pathlib import Path

    source = next((Path(__file__).parent / "data" / "schema2").glob("*pytorch*"))
    root = tmp_path / name
    for repeat, rate in enumerate(rates):
        shutil.copytree(source, root / f"run-{repeat}")
        record = json.loads((root / f"run-{repeat}" / "result.json").read_text())
        record["server"]["max_valid_qps"], record["repeat"], record["repeats"] = rate, repeat, len(rates)
        (root / f"run-{repeat}" / "result.json").write_text(json.dumps(record))
    return store.load(root).frame


def test_qps_searches_are_compared_by_their_max_qps(tmp_path):
    """A search has no closed-loop p50 (compare crashed on None); its figure is the max QPS at the SLO, compared
    across repeats as the time per query at it: fewer QPS after reads slower."""
    before = _searches(tmp_path, "before", [400.0, 410.0, 405.0])
    fewer = compare.compare_frames(before, _searches(tmp_path, "after", [200.0, 210.0, 190.0, None]), 0.1)
    [row] = fewer.rows.to_dict(orient="records")
    assert row["figure"] == "max QPS" and row["before"] == pytest.approx(405.0) and row["after"] == 200.0
    assert row["verdict"] == "slower" and row["ratio"] == pytest.approx(2.03, rel=0.01) and "x slower" in row["change"]
    assert row["repeats_after"] == 3 and row["throughput_ratio"] == pytest.approx(200 / 405)  # the None left out
    same = compare.compare_frames(before, _searches(tmp_path, "again", [402.0, 407.0, 404.0]), 0.1)
    assert same.rows["verdict"].tolist() == ["no significant change"]
    two = compare.compare_frames(before, _searches(tmp_path, "two", [300.0, 310.0]), 0.1)
    assert two.rows["verdict"].iloc[0].startswith("not enough repeats to tell (3 vs 2")
