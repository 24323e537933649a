"""`corescale tune`: one real tune of bert-tiny, SIGKILLed mid-way and resumed, shared by the assertions below
(resume without re-measuring, the SQLite study, ordinary results, recipe, report in Chromium); the space and
settings parsing are checked without processes."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import optuna
import pytest
from helpers import FAST, LOOP, ROOT, TOY_ENV, corescale
from serving import Service

from corescale.errors import UserError
from corescale.tune import settings as tune_settings
from corescale.tune import space as spaces

TUNE = [*FAST, "duration=0.6", "tune.screen=0.3", "trials=3", "tune.top_k=1", "tune.repeats=2",
        "space.backend=[pytorch]", "space.precision=[fp32,int8]", "space.batch_size=[1,2]", "--no-progress"]


def _results(tune_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in tune_dir.glob("*/result.json")]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tune killed with SIGKILL once three measurements are committed, then the same command again."""
    out = tmp_path_factory.mktemp("tune") / "outputs"
    argv = [sys.executable, "-m", "corescale.cli", "tune", *TUNE, f"output_dir={out}"]
    first = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(out.glob("tune-*/*/result.json"))) < 3:
        assert first.poll() is None, first.stdout.read().decode()
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    tune_dir, = out.glob("tune-*")
    before = {p.parent.name for p in tune_dir.glob("*/result.json")}
    proc = corescale("tune", *TUNE, f"output_dir={out}", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"out": out, "dir": tune_dir, "before": before, "proc": proc,
            "doc": json.loads((tune_dir / "tune.json").read_text())}


@pytest.mark.slow
def test_resumed_without_measuring_anything_twice(tuned):
    records = [r for r in _results(tuned["dir"]) if r["status"] == "ok"]
    keys = [(r["trial_key"], r["repeat"]) for r in records]
    assert len(keys) == len(set(keys)), "a measurement was made twice"
    assert tuned["before"] <= {p.parent.name for p in tuned["dir"].glob("*/result.json")}
    assert tuned["proc"].stdout.count("skipped (valid result exists") >= 1
    finished = [t for t in tuned["doc"]["trials"] if t["state"] in ("COMPLETE", "PRUNED") and t["repeat_of"] is None]
    assert len(finished) == 3  # trials=3 counts configurations measured (one asked again is free)
    assert "trials=3 reached" in tuned["doc"]["search_end"]
    assert f"search: {tuned['doc']['search_end']}" in tuned["proc"].stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a whole (small) tune: minutes on a busy 2-core machine
def test_a_second_tune_on_a_running_tunes_folder_is_one_line_and_the_first_finishes(tmp_path):
    """The same command twice at once: the second names the first (pid, command) and exits 2 before touching
    the study, whose recovery would mark the first's running trial failed; the first ends normally. The tunes'
    folder lock is the subject, not a framework: the toy backend's trials (no PyTorch imports)."""
    words = [*LOOP, "duration=0.3", "tune.screen=0.15", "trials=1", "tune.top_k=1", "tune.repeats=2",
             "space.backend=[toy]", "space.precision=[fp32]", "space.batch_size=[1,2]", "--no-progress",
             f"output_dir={tmp_path / 'out'}"]
    first = subprocess.Popen([sys.executable, "-m", "corescale.cli", "tune", *words], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, **TOY_ENV))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not list((tmp_path / "out").glob("tune-*/*/result.json")):
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.2)
        seconds = [corescale("tune", *words, env=TOY_ENV, timeout=120) for _ in range(2)]  # refused every time, at once
        out, _ = first.communicate(timeout=1000)
    finally:
        first.kill()
    for second in seconds:
        (line,) = second.stderr.splitlines()
        assert second.returncode == 2 and second.stdout == "", second.stdout + second.stderr
        assert "is already running (pid " + str(first.pid) + ": " in line and " tune " in line, line
    assert first.returncode == 0 and "Traceback" not in out, out
    (tune_dir,) = (tmp_path / "out").glob("tune-*")
    doc = json.loads((tune_dir / "tune.json").read_text())
    assert not [t for t in doc["trials"] if t["state"] == "FAIL"], doc["trials"]


@pytest.mark.slow
def test_study_is_a_sqlite_file_in_wal_mode(tuned):
    path = tuned["dir"] / "study.db"
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    name = json.loads((tuned["dir"] / "tune.json").read_text())["study"]  # the folder's name and its space's digest
    assert name.startswith(tuned["dir"].name + "-")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{path}")
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len([t for t in done if "repeat_of" not in t.user_attrs]) == 3
    assert all(t.user_attrs["overrides"] and t.user_attrs["label"] for t in done)


@pytest.mark.slow
def test_every_measurement_is_an_ordinary_result_with_a_baseline_and_drift_checks(tuned):
    proc = corescale("results", str(tuned["dir"]), "--all", "--csv", "-")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) - 1 == len(_results(tuned["dir"]))
    records = _results(tuned["dir"])
    baseline = [r for r in records if r["config"]["backend"]["name"] == "pytorch" and r["config"]["instances"] == 1
                and r["config"]["cores_per_instance"] is None and r["config"]["precision"] == "fp32"]
    assert len(baseline) == 2  # the full window and the final repeat
    for r in records:
        if r["config"]["precision"] == "int8":
            assert r["config"]["reference"] == "pytorch" and r["drift"] is not None
    screens = {r["config"]["duration"] for r in records}
    assert screens == {0.3, 0.6}  # successive halving: screening and full windows


@pytest.mark.slow
def test_recommendation_has_intervals_and_the_baseline_ratio(tuned):
    doc, out = tuned["doc"], tuned["proc"].stdout
    assert doc["winner"] and doc["speedup"]["low"] <= doc["speedup"]["ratio"] <= doc["speedup"]["high"]
    assert "× the out-of-box throughput (" in out and "tune: recommendation" in out  # its CI, or its repeats
    winner = next(f for f in [*doc["finalists"], doc["baseline"]] if f["role"] == "winner")  # out-of-box may win
    assert winner["throughput"]["n"] == 2 and winner["throughput"]["low"] is not None
    assert doc["baseline"]["baseline"] and doc["baseline"]["throughput"]["n"] == 2
    assert doc["finalists"] and not any(f["baseline"] for f in doc["finalists"])  # out-of-box once, in its own entry
    table = out[out.index("tune: recommendation"):out.index("recommended")]
    assert table.count("out-of-box pytorch") == 1
    # no price given: every row still has a cost, at a catalog kind's core-hour rate that the table names
    assert winner["cost_per_1m"]["mean"] > 0 and winner["cost_per_1m_tokens"]["mean"] > 0
    assert "core-hour" in doc["cost_source"] and "US$/1M tok" in table
    assert f"tune: {tuned['dir']}\n" in out and f"recipe: {doc['recipe']['recipe.sh']}\n" in out


@pytest.mark.slow
def test_the_winner_is_a_bundle_that_one_command_serves(tuned, tmp_path):
    doc, out = tuned["doc"], tuned["proc"].stdout
    bundle = Path(doc["recipe"]["bundle"])
    assert f"bundle: {bundle}\n" in out and bundle == tuned["dir"] / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    record = json.loads((bundle / "record.json").read_text())
    assert record["trial_key"] == doc["recipe"]["key"] and manifest["backend"] == "pytorch"
    assert "tokenizer/tokenizer.json" in manifest["files"] and manifest["config"]["model"] == "bert-tiny"
    with Service(bundle, tmp_path / "serve.log") as service:
        answer = httpx.post(f"{service.url}/embed_all", json={"inputs": ["a first text", "a text"]}, timeout=60)
        assert answer.status_code == 200 and [np.array(row).shape for row in answer.json()] == [(5, 128), (4, 128)]
        code, _ = service.terminate()
    assert code == 0


@pytest.mark.slow
def test_tune_json_is_a_typed_versioned_document(tuned, tmp_path):
    from corescale.tune import document

    doc = document.read(tuned["dir"])
    assert doc is not None and tuned["doc"]["schema_version"] == doc.schema_version == document.SCHEMA_VERSION
    assert doc.winning is not None and doc.winning.label == doc.winner and doc.to_dict() == tuned["doc"]
    unversioned = {k: v for k, v in tuned["doc"].items() if k != "schema_version"}  # tune.json before schema 2
    (tmp_path / "tune.json").write_text(json.dumps(unversioned))
    assert document.read(tmp_path) == doc


def _tune_document(**changes):
    from corescale.tune.document import Figure, TunedFinalist, TuneDocument, TuneObjective

    figure = Figure(10.0, 9.0, 11.0, 2)
    winner = TunedFinalist("backend=onnxruntime", "winner", ["backend=onnxruntime"], False, ["/r/1"], 2, 1, True,
                           False, figure, figure, figure, Figure(), figure, Figure())
    base = TuneDocument("2026-12-02T06:00:00+0000", "/t", {"repeats": 2}, {}, 4, 0.3, 0.6, 2,
                        TuneObjective("throughput", "throughput", "maximize", "samples/s"), [], [winner], None,
                        ["recommended: backend=onnxruntime"], winner="backend=onnxruntime")
    return {**base.to_dict(), **changes}


@pytest.mark.parametrize("changes, message", [
    ({"schema_version": 9}, "schema_version 9 (this corescale reads 1, 2)"),
    ({"space_size": "four"}, "tune.json.space_size: expected an integer, got 'four'"),
    ({"objective": None}, "tune.json.objective: expected an object, got None"),
    ({"trials": [{"number": 0}]}, "tune.json.trials[0]: 'state' is missing"),
])
def test_a_malformed_tune_document_is_one_clear_line(tmp_path, changes, message):
    from corescale.tune import document

    (tmp_path / "tune.json").write_text(json.dumps(_tune_document()))
    doc = document.read(tmp_path)
    assert doc is not None and doc.winning is not None and doc.winning.figure("throughput").mean == 10.0
    assert document.read(tmp_path / "nothing") is None
    (tmp_path / "tune.json").write_text(json.dumps(_tune_document(**changes)))
    with pytest.raises(UserError) as error:
        document.read(tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_recipe_starts_each_copy_pinned_with_the_measured_environment(tuned, tmp_path):
    doc = tuned["doc"]
    recipe = Path(doc["recipe"]["recipe.sh"])
    winner_path = next(f for f in [*doc["finalists"], doc["baseline"]] if f["role"] == "winner")["paths"][0]
    record = json.loads((Path(winner_path) / "result.json").read_text())
    probes = tmp_path / "probes"
    probes.mkdir()
    probe = (f"import json, os, pathlib; pathlib.Path({str(probes)!r}, os.environ['CORESCALE_INSTANCE_INDEX']"
             f"+ '.json').write_text(json.dumps({{'cpus': sorted(os.sched_getaffinity(0)), 'env': dict(os.environ)}}))")
    # a file per copy: the copies run at once, and lines of several KB from two of them interleave on one pipe
    proc = subprocess.run([str(recipe), "--", sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    copies = sorted((json.loads(p.read_text()) for p in probes.glob("*.json")),
                    key=lambda c: int(c["env"]["CORESCALE_INSTANCE_INDEX"]))
    assert len(copies) == len(record["specs"])
    for copy, spec, report in zip(copies, record["specs"], record["instance_reports"]):
        assert copy["cpus"] == spec["cpus"]
        assert copy["env"]["CORESCALE_INSTANCE_INDEX"] == str(spec["id"])
        assert copy["env"]["CORESCALE_INSTANCES"] == str(len(copies))
        for name, value in report["launch"]["env"].items():
            assert copy["env"][name] == value, name
    # no command: the corescale run line that measures the same config key again
    again = subprocess.run([str(recipe)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert again.returncode == 0, again.stderr
    result, = tmp_path.glob("outputs/*/result.json")
    assert json.loads(result.read_text())["trial_key"] == doc["recipe"]["key"] == record["trial_key"]
    assert (recipe.parent / "snippet.py").is_file() and "config:" in (recipe.parent / "config.yaml").read_text()


@pytest.mark.slow
def test_report_tuner_section_renders_offline_and_hover_shows_the_config(tuned):
    from playwright import sync_api
    from test_report import CHROMIUM, CHROMIUM_FLAGS

    report = tuned["dir"] / "report.html"
    text = report.read_text()
    assert '<section id="tuner">' in text and "<script src" not in text and 'id="tune-pareto"' in text
    assert f"Serve it: <code>corescale serve {tuned['doc']['recipe']['bundle']}</code>" in text
    problems, requests = [], []
    with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(profile, executable_path=CHROMIUM,
                                                                args=CHROMIUM_FLAGS, headless=True,
                                                                viewport={"width": 1400, "height": 1000})
        page = browser.new_page()
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning")
                else None)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("data:", "file:")) else None)
        page.goto(report.as_uri())
        page.wait_for_selector("#tune-pareto .scatterlayer .point")
        page.locator("#tune-pareto .scatterlayer .point").first.hover(force=True)
        page.wait_for_selector("#tune-pareto .hoverlayer .hovertext", timeout=10_000)
        hover = page.text_content("#tune-pareto .hoverlayer")
        importance = page.locator("#tune-importance").count()  # or one line saying how to get it, no empty box
        missing = page.inner_text("#not-measured-line") if page.locator("#not-measured-line").count() else ""
        browser.close()
    assert "backend.name=pytorch" in hover and "samples/s" in hover
    assert importance == 1 or "parameter importances (two finished trials at least): corescale tune" in missing
    assert not problems, problems
    assert not requests, requests


@pytest.mark.slow
def test_an_infeasible_slo_says_the_closest_and_exits_1_with_the_report(tuned):
    """Measurements of the first tune under the same results root are reused by key: few new ones."""
    proc = corescale("tune", *[w for w in TUNE if not w.startswith("trials=")], "trials=1", "objective=throughput",
                     "slo_p99_ms=0.001",
                     f"output_dir={tuned['out']}", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no configuration meets the constraints; the closest:" in proc.stdout
    report = next(line for line in proc.stdout.splitlines() if line.startswith("report: ")).split(" ", 1)[1]
    assert Path(report).is_file()


# --- without processes ---------------------------------------------------------------------------------------

ISA = {"avx2": True, "fma": True}


def _space(overrides=(), narrow=None, cores=2, latency=False):
    from corescale.overrides import compose

    return spaces.derive(compose(list(overrides)), list(overrides), narrow or {}, cores, ISA, latency)


def test_space_follows_the_cpu_and_the_install():
    space = _space()
    assert "bf16" not in {p for v in space.precisions.values() for p in v}  # no bf16 instructions here
    assert space.layouts == ["1x1", "2x1", "1x2"] and space.threads[2] == ["", "1"]
    assert "int8" in space.precisions["pytorch"] and space.batch_sizes == list(spaces.THROUGHPUT_BATCHES)
    assert _space(latency=True).batch_sizes == ["1"]
    assert _space(["batch_size=4"]).batch_sizes == ["4"]  # a plain override fixes a dimension
    assert _space(["backend=onnxruntime"]).backends == ["onnxruntime"]
    assert spaces.candidate_layouts(8) == ["1x1", "2x1", "4x1", "8x1", "1x2", "2x2", "4x2", "1x4", "2x4", "1x8"]


def test_first_trials_are_each_backend_at_its_fastest_and_quality_safe_precisions_and_the_objectives_layout():
    space = _space([], {"backend": ["pytorch", "onnxruntime"]})  # 2 cores: layouts 1x1, 2x1, 1x2
    # the exported graph's runtime first, fastest and fp32 screens alternating, PyTorch's int8 last (since issue 50:
    # each backend at fp32 too, which the quality gate cannot withhold)
    assert spaces.starting_points(space, latency=False) == [
        {"backend": "onnxruntime", "precision[onnxruntime]": "int8", "layout": "2x1"},
        {"backend": "pytorch", "precision[pytorch]": "fp32", "layout": "2x1"},
        {"backend": "onnxruntime", "precision[onnxruntime]": "fp32", "layout": "2x1"},
        {"backend": "pytorch", "precision[pytorch]": "int8", "layout": "2x1"}]
    assert [p["layout"] for p in spaces.starting_points(space, latency=True)] == ["1x2"] * 4
    fixed = _space(["instances=1", "cores_per_instance=2"], {"backend": ["pytorch"], "precision": ["fp32"]})
    assert spaces.starting_points(fixed, latency=False) == []  # nothing left to choose: the sampler's draw


def test_space_narrowing_and_suggest():
    space = _space(narrow={"backend": ["onnxruntime", "pytorch"], "layout": ["2x1"], "backend.fusion": ["true"]})
    assert space.backends == ["pytorch", "onnxruntime"] and space.options["onnxruntime"]["fusion"] == ["true"]
    trial = optuna.trial.FixedTrial({"backend": "onnxruntime", "precision[onnxruntime]": "int8",
                                     "onnxruntime.graph_optimization_level": "basic",
                                     "onnxruntime.execution_mode": "sequential", "batch_size": "2",
                                     "allocator": "default", "onnxruntime.quantization": "static",
                                     "onnxruntime.per_channel": "true", "onnxruntime.keep_fp32": "ffn_output"})
    overrides = spaces.suggest(trial, space)
    assert {"backend=onnxruntime", "precision=int8", "backend.fusion=true", "instances=2", "cores_per_instance=1",
            "batch_size=2", "backend.quantization=static", "backend.keep_fp32=ffn_output"} <= set(overrides)
    assert not any(o.startswith("openmp=") for o in overrides)  # onnxruntime has its own thread pool


@pytest.mark.parametrize("overrides, narrow, message", [
    (["precision=bf16"], {"backend": ["openvino"]}, "the search space is empty"),
    ([], {"precision": ["bf16"]}, "space.precision: bf16 not possible here"),
    ([], {"flavour": ["x"]}, "unknown search dimension 'space.flavour'"),
    ([], {"backend.nosuch": ["1"]}, "no backend in the space has option 'nosuch'"),
])
def test_space_errors_are_one_line(overrides, narrow, message):
    with pytest.raises(UserError) as info:
        _space(overrides, narrow)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_settings_parse_words_apart_from_overrides():
    s = tune_settings.parse(["objective=cost", "price_per_hour=0.5", "budget=1m30s", "slo_p99_ms=20",
                             "space.backend=[pytorch, onnxruntime]", "model=bert-tiny", "tune.top_k=2"])
    assert s.objective.name == "cost" and s.budget_s == 90 and s.slo_p99_ms == 20 and s.top_k == 2
    assert s.space == {"backend": ["pytorch", "onnxruntime"]} and s.overrides == ["model=bert-tiny"]
    assert tune_settings.parse([]).trials == 20
    assert set(tune_settings.OBJECTIVES) == {"throughput", "latency", "cost", "server_qps"}


def test_node_types_sharing_a_hosts_cpus_are_tuned_one_after_the_other():
    from corescale.tune import fleet
    from corescale.tune.fanout import together

    def kind(node_type, *cpus):
        return SimpleNamespace(node_type=node_type, cpus=frozenset(cpus))

    apart = [kind("a", ("host1", 0), ("host1", 1)), kind("b", ("host1", 2)), kind("c", ("host2", 0))]
    assert fleet.sharing(apart) == [] and together(apart)
    shared = [*apart, kind("d", ("host2", 0), ("host2", 1))]  # CPU 0 of host2 is c's and d's
    assert fleet.sharing(shared) == [("c", "d")] and not together(shared)
    assert not together(apart[:1])  # one type: nothing to run beside


def test_node_types_and_their_prices_are_parsed_per_type():
    s = tune_settings.parse(["executor=ray", "executor.node_type=[small, big]", "price_per_hour={small:0.36,big:2.1}",
                             "model=bert-tiny"])
    assert s.node_types == ["small", "big"] and s.overrides == ["executor=ray", "model=bert-tiny"]
    assert s.for_node_type("big").price_per_hour == 2.1 and s.for_node_type("big").node_types == ["big"]
    assert s.identity() == tune_settings.parse(["executor=ray", "executor.node_type=small", "model=bert-tiny",
                                                "price_per_hour={small:0.36}"]).identity()  # adding a type resumes
    one = tune_settings.parse(["executor=ray", "executor.node_type=a,b", "machine={a:c6i.2xlarge,b:c6i.12xlarge}"])
    assert one.for_node_type("a").machine == "c6i.2xlarge" and one.for_node_type("b").machine == "c6i.12xlarge"


@pytest.mark.parametrize("words, message", [
    (["executor=ray", "executor.node_type=a,b"], "the node types are ranked by cost per 1M inferences, so each "
     "needs a price; missing for a, b: give price_per_hour={a:USD_PER_HOUR,b:USD_PER_HOUR}"),
    (["executor=ray", "executor.node_type=a,b", "price_per_hour={a:1}"], "missing for b"),
    (["executor=ray", "executor.node_type=a", "price_per_hour={z:1}"], "name node type 'z', which is not tuned"),
    (["executor=ray", "executor.node_type=a", "price_per_hour={a:nan}"], "is not a finite number"),
    (["executor=ray", "executor.node_type=a", "price_per_hour={a:}"], "expected a value or {type:value,...}"),
])
def test_node_type_settings_errors_are_one_line(words, message):
    with pytest.raises(UserError) as info:
        tune_settings.parse(words)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_node_type_without_ray_is_refused_before_anything_runs(tmp_path):
    proc = corescale("tune", "model=bert-tiny", "executor.node_type=a", f"output_dir={tmp_path / 'out'}")
    assert proc.returncode == 2 and "executor.node_type needs executor=ray" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_server_qps_searches_the_server_scenario_and_its_batching():
    import dataclasses

    from corescale.overrides import compose
    from corescale.record.sections import InstanceReport
    from corescale.record.trial import TrialRecord
    from corescale.tune.verdict import figures, samples_per_s

    s = tune_settings.parse(["objective=server_qps", "slo_p99_ms=130", "model=bert-tiny"])
    assert tune_settings.scenario_overrides(s) == ["scenario=server", "target_qps=auto", "slo_p99_ms=130"]
    assert tune_settings.scenario_overrides(tune_settings.parse([])) == []
    space = spaces.derive(compose([]), [], {"batch_size": ["1", "4"]}, 2, ISA, False, batch_key="server.max_batch")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(30):  # every suggestion composes: no backend.linear=onednn with int8, a server.max_batch
        words = spaces.suggest(study.ask(), space)
        assert any(w.startswith("server.max_batch=") for w in words) and not any(w.startswith("batch_size=")
                                                                                     for w in words)
        compose(words)
    served = next(p for p in (ROOT / "tests" / "data" / "schema2").rglob("result.json") if "pytorch" in str(p))
    record = TrialRecord.from_json(json.loads(served.read_text()))  # a real server search, its figures set here
    assert record.server is not None
    record.server = dataclasses.replace(record.server, max_valid_qps=61.5, latency_ms={"p50": 40.0, "p99": 117.8})
    record.instance_reports = [InstanceReport(0, rss_bytes=200_000_000)]
    figs = figures(record)
    assert figs["server_qps"] == 61.5 and figs["p99_ms"] == 117.8 and figs["memory_gb"] == 0.2
    assert samples_per_s(record) == 61.5
    record.server = dataclasses.replace(record.server, max_valid_qps=None)  # no rate met the SLO: nothing to judge
    assert figures(record)["server_qps"] is None and figures(record)["p99_ms"] is None


def _finalist(label, throughputs, cores=2, complexity=1, baseline=False):
    from corescale.tune.verdict import Finalist

    figures = [{"valid": True, "throughput": t, "p50_ms": 1000 / t, "p99_ms": 1200 / t, "memory_gb": 0.5,
                "drift_ok": True} for t in throughputs]
    return Finalist(label, [], [], [], figures, baseline=baseline, complexity=complexity, cores=cores)


def test_a_tie_is_reported_with_the_simpler_first_and_a_clear_winner_is_not():
    from corescale.tune.outputs import tie_words
    from corescale.tune.verdict import decide

    settings = tune_settings.parse(["objective=throughput", "slo_p99_ms=100"])
    baseline = _finalist("baseline", [8.0, 8.2, 7.9], baseline=True)
    close = [_finalist("ort int8 2x1", [50.0, 52.0, 49.0], complexity=3),
             _finalist("ort fp32 2x1", [49.5, 51.0, 50.5], complexity=2)]
    verdict = decide(close, baseline, settings.objective, settings)
    assert verdict.tie == ["ort fp32 2x1", "ort int8 2x1"] and verdict.winner.label == "ort fp32 2x1"
    assert verdict.tie_simpler_first and tie_words(verdict, "throughput").startswith("statistical tie (p = ")
    ratio, low, high = verdict.speedup
    assert low < ratio < high and 5.5 < ratio < 7
    clear = [_finalist("fast", [50.0, 50.5, 49.8]), _finalist("slow", [30.0, 30.2, 29.9], complexity=0)]
    verdict = decide(clear, baseline, settings.objective, settings)
    assert verdict.winner.label == "fast" and not verdict.tie
    noisy = [_finalist("1 core", [44, 36, 51], complexity=1), _finalist("2x1", [50, 43, 57], complexity=3)]
    verdict = decide(noisy, baseline, settings.objective, settings)  # a tie, but 13 % apart: the faster first
    assert verdict.tie == ["2x1", "1 core"] and verdict.winner.label == "2x1" and not verdict.tie_simpler_first
    words = tie_words(verdict, "throughput")  # not called a tie: the repeats cannot separate a 14.5 % gap
    assert words.startswith("not separated by 3 repeat(s) each (p = ") and "means 1.15x apart" in words
    over = decide([_finalist("over the SLO", [5.0, 5.1, 5.2])], baseline, settings.objective, settings)
    assert over.winner is None and over.infeasible[0].label == "over the SLO"  # p99 240 ms > 100 ms


def test_a_baseline_that_met_the_slo_at_no_rate_bounds_the_speedup_from_below():
    """Out-of-box PyTorch on 2 AVX2 cores missed 100 ms at 29.6 QPS and its bounded search ended there: it serves
    less than 29.6 QPS, so the answer's 80.8 QPS is at least 2.73x it (the weakest of the repeats' claims)."""
    import dataclasses

    from corescale.tune.outputs import headline
    from corescale.tune.verdict import Finalist, decide

    settings = tune_settings.parse(["objective=server_qps", "slo_p99_ms=100"])
    missed = [{"valid": True, "throughput": None, "server_qps": None, "p99_ms": None, "memory_gb": 0.5,
               "drift_ok": True, "lowest_miss": rate} for rate in (29.6, 20.0)]
    baseline = Finalist("baseline: out-of-box pytorch", [], [], [], missed, baseline=True)
    answer = _finalist("openvino fp32 2x1", [80.0, 81.6])
    answer.figures = [{**f, "server_qps": f["throughput"]} for f in answer.figures]
    verdict = decide([answer], baseline, settings.objective, settings)
    assert verdict.winner is answer and verdict.speedup is None and baseline.serves_below == 29.6
    assert abs(verdict.speedup_at_least - 80.8 / 29.6) < 1e-9
    tune = type("Tune", (), {"settings": settings, "node_type": None})()
    lines = headline(tune, verdict)
    assert any(line.startswith("≥ 2.73× the out-of-box throughput") and "the lowest 29.6 QPS" in line
               for line in lines), lines
    established = dataclasses.replace(baseline, figures=[{**missed[0], "throughput": 12.0, "server_qps": 12.0,
                                                           "lowest_miss": None}])
    assert established.serves_below is None  # a repeat that met the SLO: the ratio is measured, not bounded


def test_when_the_budget_ends_the_search_the_tune_says_so_and_what_searches_more():
    """One screened configuration of 96 when a 5-minute budget ends the search: said in words (the console's
    `search:` line and tune.json's search_end), with the budget that searches more."""
    from corescale.tune.progress import Progress
    from corescale.tune.search import Tuner

    tuner = Tuner.__new__(Tuner)
    tuner.search_end = ""
    tuner.tune = SimpleNamespace(space=SimpleNamespace(size=lambda: 96), screen_s=1.0, peer=None,
                                 cfg=SimpleNamespace(duration=3.0), settings=SimpleNamespace(top_k=2, repeats=3, eta=3))
    tuner.study = optuna.create_study()
    tuner.study.add_trial(optuna.trial.create_trial(value=1.0))
    tuner.progress = Progress(started=time.monotonic() - 280, elapsed_before=0.0, budget_s=300.0, trials=None,
                              screen_s=[4.0], full_s=[6.0])
    assert tuner._done({"one": {}}) is True
    assert tuner.search_end == ("the budget (5m) ended it, keeping 45s for the final repeats "
                                "(budget=15m searches more)")
    for text in ("36s", "5m", "15m", "1h30m", "2h"):  # what it says, budget= takes back
        assert tune_settings.budget_text(tune_settings.parse_budget(text)) == text
    tuner.progress = Progress(started=time.monotonic(), elapsed_before=0.0, budget_s=3600.0, trials=None,
                              screen_s=[4.0], full_s=[6.0])
    tuner.search_end = ""
    assert tuner._done({"one": {}}) is False and tuner.search_end == ""
