"""endpoint=managed (each trial starts `corescale serve` on its layout, measures it over HTTP, stops it) and the
rerank / classify routes driven over HTTP (api=tei): real services on loopback, bert-tiny, short LoadGen tests."""

import json

import pytest
from helpers import assert_one_line_error, corescale, raw_record

from corescale.tune import settings as tune_settings

pytestmark = pytest.mark.alone  # QPS searches of served layouts

# LoadGen's shortest valid tests (459 queries at p99), the search cut to two tests, a wide SLO
QUICK = ["scenario=server", "duration=0.5", "server.min_query_count=459", "server.max_steps=2",
         "server.search_precision=0.5", "warmup.max_iterations=8", "timeout=120"]
TINY = ["model=bert-tiny", "backend=onnxruntime", "calibrate=false", "sequence_length=32"]


@pytest.mark.parametrize("words, message", [
    (["objective=server_qps", "slo_p99_ms=100", "endpoint=http://127.0.0.1:8080"], "give endpoint=managed"),
    (["objective=throughput", "endpoint=managed"], "give objective=server_qps"),
])
def test_a_tune_over_http_is_managed_and_searches_qps(words, message):
    assert_one_line_error(tune_settings.parse, words, message)


@pytest.mark.parametrize("front", ["CPUs 2-3", "shared with the instances"])
def test_the_ready_line_serve_prints_is_the_one_the_trial_reads(front):
    from corescale.measure.http.contract import front_in, ready_line, url_in

    line = ready_line("2 instance(s) of bert-tiny on onnxruntime (fp32)", front, "127.0.0.1", 40123)
    assert url_in(line) == "http://127.0.0.1:40123" and front_in(line) == front
    assert front_in("listening on http://127.0.0.1:1") == ""  # a line that does not say where its front runs
    assert url_in(ready_line("1 instance(s)", front, "::1", 8000)) == "http://[::1]:8000"  # IPv6: bracketed


@pytest.mark.slow
def test_managed_with_openai_and_rerank_is_one_line_exit_2(tmp_path):
    proc = corescale("run", *TINY, *QUICK, "endpoint=managed", "api=openai", "task=rerank", "target_qps=5",
                     f"output_dir={tmp_path / 'out'}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "api=openai sends task embed only" in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_service_that_cannot_start_is_its_status_and_log_tail(tmp_path):
    from corescale.measure.http import managed

    with pytest.raises(managed.ServeFailed) as info, \
            managed.started([str(tmp_path / "no-bundle")], tmp_path / "serve.log", ready_s=60):
        pass
    assert "exited with status 2" in str(info.value) and "no-bundle" in str(info.value)


def _records(root):
    return [raw_record(p.parent) for p in sorted(root.rglob("result.json"))]


@pytest.mark.slow
def test_rerank_over_http_against_corescale_serve(tmp_path, tiny_service):
    service = tiny_service("rerank")  # the session's bert-tiny reranker, its queue unbounded: slow, never refused
    proc = corescale("run", *QUICK, f"endpoint={service.url}", "api=tei", "task=rerank",
                     "scenario=single_stream", "server.min_query_count=64", f"output_dir={tmp_path / 'out'}",
                     "--no-progress")  # the route is the subject, not a rate: one query at a time
    assert proc.returncode == 0, proc.stderr
    [record] = _records(tmp_path / "out")
    server = record["server"]
    assert server["endpoint"]["path"] == "/rerank" and server["endpoint"]["warmup_errors"] == 0
    step = server["steps"][0]
    assert step["errors"] == 0 and step["http"]["requests"] == step["queries"] >= 64, step["http"]
    assert server["queries"]["origin"].startswith("built-in rerank sets")
    assert step["http"]["server_ms"]["inference"]["count"] == step["queries"]  # corescale serve's timing headers


@pytest.mark.slow
def test_classify_with_endpoint_managed_records_the_served_layout(tmp_path):
    """The layout served and recorded is the subject, not a rate: 459 queries arrive within 2.3 s (those the two
    instances cannot keep up with wait, inside the default hour-long bound). Two fronts, each before one instance:
    the service measured is the one its bundle would serve."""
    proc = corescale("run", *TINY, *QUICK, "task=classify", "endpoint=managed", "instances=2", "cores_per_instance=1",
                     "server.max_batch=2", "target_qps=200", "server.fronts=2",
                     f"output_dir={tmp_path / 'out'}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    [record] = _records(tmp_path / "out")
    assert record["config"]["endpoint"] == "managed" and record["config"]["task"] == "classify"
    assert len(record["plan"]["instances"]) == 2
    endpoint = record["server"]["endpoint"]
    assert endpoint["path"] == "/predict" and endpoint["api"] == "tei" and endpoint["url"].startswith("http://127.")
    served = endpoint["managed"]
    assert served["layout"].startswith("2 instance(s) on CPUs") and "server.max_batch 2, 2 fronts" in served["layout"]
    assert served["exit_code"] == 0 and served["front_cpu_s"] > 0 and served["front"]
    assert record["server"]["steps"][0]["errors"] == 0
    log = next((tmp_path / "out").glob("*/serve.log")).read_text()
    assert log.count("inputs served") == 2 and "front 1: stopped after" in log  # each front drained on SIGTERM


@pytest.mark.slow
def test_a_server_qps_tune_measures_each_layout_as_a_service(tmp_path):
    out = tmp_path / "out"
    proc = corescale("tune", "objective=server_qps", "endpoint=managed", "slo_p99_ms=3000", "model=bert-tiny",
                     "sequence_length=32", "task=embed",
                     *QUICK, "trials=1", "tune.top_k=1", "tune.repeats=2", "space.backend=[onnxruntime]",
                     "space.layout=[2x1]", "space.batch_size=[2]", "space.server.fronts=[2]",
                     f"output_dir={out}", "--no-progress", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not with endpoint=managed" in proc.stderr  # reduced precisions are left out: no drift check over HTTP
    records = _records(out)
    assert len(records) >= 3 and all(r["config"]["endpoint"] == "managed" for r in records)
    for record in records:
        served = record["server"]["endpoint"]["managed"]
        assert served["exit_code"] == 0 and served["front_cpu_s"] is not None, served
        assert served["layout"].startswith(f"{len(record['plan']['instances'])} instance(s)")
        assert record["status"] == "ok" and record["server"]["steps"], record.get("reason")  # QPS: the machine's
    tuned = [r for r in records if r["config"]["backend"]["name"] == "onnxruntime"]
    assert tuned and all(len(r["plan"]["instances"]) == 2 for r in tuned)  # the layout searched is the one served
    for record in tuned:  # the front count searched is the service's: two fronts, one instance each
        assert record["config"]["server"]["fronts"] == 2
        front = record["server"]["endpoint"]["reports"]["/info"]["corescale"]["front"]
        assert front["fronts"] == 2 and len(front["instances"]) == 1, front
    doc = json.loads(next(out.glob("tune-*/tune.json")).read_text())
    assert doc["winner"] and "endpoint=managed" in doc["recipe"]["run_line"]
    assert "endpoint=managed" not in doc["recipe"]["serve_words"]
    # the winner's bundle: the service's own layout and artifact (its GET /info, in the record), opened as serve does
    from corescale.serve.opened import open_bundle

    (winner,) = [f for f in [*doc["finalists"], doc["baseline"]] if f["role"] == "winner"]
    served = raw_record(winner["paths"][0])["server"]["endpoint"]["reports"]["/info"]["corescale"]["layout"]
    (tmp_path / "serve-work").mkdir()
    bundle = open_bundle(doc["recipe"]["bundle"], tmp_path / "serve-work")
    assert [i.to_dict() for i in bundle.layout.instances] == [{k: v for k, v in i.items() if k != "artifact"}
                                                              for i in served["instances"]]
    assert [list(spec.cpus) for spec in bundle.specs] == [i["cpus"] for i in served["instances"]]
    assert bundle.manifest is not None and bundle.manifest.config["endpoint"] is None
    assert bundle.cfg.server.fronts == raw_record(winner["paths"][0])["config"]["server"]["fronts"]  # as measured
    assert bundle.manifest.measured["max_valid_qps"]
    assert f"serve it: corescale serve {doc['recipe']['bundle']}" in proc.stdout


def test_a_bundle_of_a_server_at_a_url_is_refused_before_measuring(tmp_path):
    from corescale.errors import UserError
    from corescale.overrides import compose
    from corescale.serve.bundle import check_destination

    cfg = compose(["scenario=server", "endpoint=http://127.0.0.1:9", "api=tei", "target_qps=5"])
    with pytest.raises(UserError, match="has no artifact here") as info:
        check_destination(tmp_path / "bundle", cfg)
    assert "\n" not in str(info.value) and not (tmp_path / "bundle").exists()
