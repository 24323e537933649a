"""Quality before the QPS search (issue 50): a served trial's instance 0 checks its artifact's quality during its
warm-up, so a configuration that misses the gate costs its build and the check only: no LoadGen test runs, the
record fails as withheld (quality) with its figures and says the search was skipped; the tune's verdict on the
artifact then stands for every layout that loads it. One that passes is searched from its own capacity."""

import json
import types

import pytest
from helpers import FAST, corescale, raw_record

from corescale.record.files import read_result
from corescale.tune import study as studies
from corescale.tune.plan import artifact_key
from corescale.tune.study import plain
from corescale.tune.verdict import figures

pytestmark = pytest.mark.slow  # real runs

SERVED = [*FAST, "task=embed", "quality_samples=32", "scenario=server", "target_qps=auto", "slo_p99_ms=100",
          "server.min_query_count=459", "server.max_steps=2", "timeout=120", "--no-progress"]


def run(out, *overrides):
    proc = corescale("run", *SERVED, f"output_dir={out}", *overrides)
    path = next(out.glob("*/result.json")).parent
    return proc, path, raw_record(path)


def test_an_artifact_that_misses_the_gate_is_withheld_before_any_loadgen_test(tmp_path):
    overrides = ["precision=int8", "min_quality='cosine_min>=0.999999'"]
    proc, path, record = run(tmp_path, *overrides)
    assert record["status"] == "failed" and record["valid"] is True, record.get("reason")
    assert record["failure"]["kind"] == "quality"
    assert "withheld (quality)" in record["reason"] and "the QPS search was skipped" in record["reason"]
    quality = record["quality"]
    assert quality["passed"] is False and quality["failed"] == ["cosine_min>=0.999999"]
    assert 0 < quality["metrics"]["cosine_min"] < 0.999999 and quality["rows"] == 32
    server = record["server"]
    assert server["steps"] == [] and server["max_valid_qps"] is None and server["load_curve"] == []
    assert server["skipped"].startswith("skipped: the artifact's quality was checked before the QPS search")
    assert not list(path.glob("loadgen-*")), "no LoadGen test ran"
    (report,) = [r for r in record["instance_reports"] if r["quality"] is not None]
    assert report["instance"] == 0 and report["quality"]["metrics"] == quality["metrics"]
    # the tune reads it as its artifact's verdict: every layout and knob that loads it is withheld unmeasured
    figs = figures(read_result(path))
    assert figs["valid"] and figs["quality_ok"] is False and figs["server_qps"] is None
    trial = types.SimpleNamespace(user_attrs={"overrides": ["backend=pytorch", *overrides[:1], "instances=1"],
                                              "screen": plain(figs), "number": 3})
    study = types.SimpleNamespace(get_trials=lambda deepcopy=False: [trial])
    other_layout = ["backend=pytorch", "precision=int8", "instances=2", "server.max_batch=32"]
    assert artifact_key(other_layout) in studies.missed_artifacts(study)
    assert "capacity estimate" not in proc.stdout


def test_an_artifact_that_passes_is_searched_from_its_own_capacity(tmp_path):
    proc, path, record = run(tmp_path)
    assert record["status"] == "ok", record.get("reason")
    assert record["quality"]["passed"] is True
    server = record["server"]
    assert server["steps"] and server["skipped"] is None
    capacity = server["capacity"]
    assert capacity["basis"] == "real lengths" and capacity["qps"] > 0
    assert capacity["first_qps"] == server["steps"][0]["target_qps"]
    assert "instance 0:" in capacity["per_instance"], json.dumps(capacity)
