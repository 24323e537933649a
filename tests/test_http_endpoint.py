"""scenario=server endpoint=URL api=openai|tei: LoadGen drives a running server over HTTP. Servers started here on
loopback: the sentence-transformers FastAPI peer with the trained all-MiniLM-L6-v2, and a tiny stdlib server that
sends TEI's timing headers or fails on purpose (500s, dropped connections)."""

import csv
import io
import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import assert_one_line_error, corescale, raw_record
from http_servers import TIMES, free_port, st_fastapi, tiny_server
from serving import minilm_folder

from corescale.errors import UserError
from corescale.measure.http.api import BadAnswer, route_of, timings
from corescale.overrides import compose

pytestmark = pytest.mark.alone  # QPS searches and latencies over HTTP

QUICK = ["scenario=server", "duration=0.5", "server.min_query_count=459", "warmup.max_iterations=8", "timeout=120"]


# --- no processes -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["endpoint=http://127.0.0.1:8080", "api=grpc"], "unknown api 'grpc'"),
    (["api=tei"], "add endpoint=http://HOST:PORT"),
    (["scenario=offline", "target_qps=null", "endpoint=http://127.0.0.1:8080"], "give scenario=server"),
    (["endpoint=http://127.0.0.1:8080", "executor=ray"], "executor=local"),
    (["endpoint=http://127.0.0.1:8080", "request_timeout=0"], "request_timeout must be > 0"),
    (["endpoint=http://127.0.0.1:8080", "workload.lengths=uniform(4,8)"], "cannot be sent to a server as text"),
    (["endpoint=http://127.0.0.1:8080", "tokenize=true"], "tokenize= does not apply to a server measured over HTTP"),
    (["endpoint=http://127.0.0.1:8080", "task=rerank"], "api=openai sends task embed only"),
    (["endpoint=http://127.0.0.1:8080", "api=tei", "task=encode"], "task=encode is not driven over HTTP"),
    (["endpoint=managed", "reference=pytorch"], "no drift check runs over HTTP"),
    (["endpoint=managed", "scenario=single_stream", "target_qps=null"], "give scenario=server"),
])
def test_bad_endpoint_settings_are_one_line(overrides, message):
    assert_one_line_error(compose, ["scenario=server", "target_qps=5", *overrides], message)


@pytest.mark.parametrize("overrides, message", [
    (["endpoint=localhost:8080"], "is not an http(s) URL"),
    (["endpoint=http://:8080"], "is not an http(s) URL"),
    (["endpoint=http://127.0.0.1:99999"], "is not a URL"),
    (["endpoint=http://127.0.0.1:8080", "api=tei", "task=rerank", "workload=q.txt"], "sends the built-in rerank sets"),
])
def test_what_the_trial_checks_before_any_request_is_one_line(overrides, message, tmp_path):
    from corescale.measure.runner import prepare_trial

    cfg = compose(["scenario=server", "target_qps=5", f"output_dir={tmp_path}", *overrides])
    with pytest.raises(UserError) as info:
        prepare_trial(cfg)  # refused before any request: nothing listens on these
    assert message in str(info.value) and "\n" not in str(info.value)


def test_requests_and_answers_of_each_api():
    openai, tei = route_of("openai", "embed"), route_of("tei", "embed")
    rerank, predict = route_of("tei", "rerank"), route_of("tei", "classify")
    assert json.loads(openai.body("a text", "m")) == {"input": "a text", "model": "m"}
    assert json.loads(tei.body("a text", "m")) == {"inputs": "a text", "truncate": True}
    assert json.loads(rerank.body(("q", ("a", "b")), "m")) == {"query": "q", "texts": ["a", "b"], "truncate": True}
    assert json.loads(predict.body("a text", "m")) == {"inputs": "a text", "truncate": True}
    assert openai.check(b'{"data": [{"embedding": [0.1, 0.2, 0.3]}]}') == 3
    assert tei.check(b"[[0.1, 0.2]]") == 2
    assert rerank.check(b'[{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]') is None
    assert predict.check(b'[{"label": "POS", "score": 0.8}, {"label": "NEG", "score": 0.2}]') is None
    assert predict.check(b'[[{"label": "POS", "score": 0.8}]]') is None  # TEI's answer to a list of inputs
    bad = ((openai, b'{"data": []}'), (tei, b"[[1], [2]]"), (tei, b"<html>"), (openai, b"[[1]]"), (rerank, b"[]"),
           (rerank, b'[{"index": 0}]'), (rerank, b"[[0.1]]"), (predict, b'[{"score": 1}]'), (predict, b'{"x": 1}'))
    for api, answer in bad:
        with pytest.raises(BadAnswer):
            api.check(answer)
    assert timings({"x-queue-time": "2", "x-inference-time": "5.5", "x-total-time": "n/a"}) == \
        {"queue": 2.0, "inference": 5.5}


def test_search_stops_at_a_broken_step_and_goes_below_an_overloaded_one():
    import types

    from corescale.measure.qps_search import search

    def step(broken):
        return lambda qps: types.SimpleNamespace(target_qps=qps, meets_slo=qps <= 10, latency_ms={}, broken=broken)

    steps = []
    assert search(step(True), 100.0, 0.1, 8, steps).best is None and len(steps) == 1  # refused or 5xx: stop
    steps = []
    assert search(step(False), 100.0, 0.1, 8, steps).best is not None  # timed out: overload, lower rates are tried


def test_the_first_rate_tried_counts_the_instances_the_server_says_it_runs(tmp_path):
    """A corescale serve says its layout in GET /info: the search starts at one request at a time on each instance
    (a managed 2x1 started at half its rate and spent its longest test there); a server that says nothing: one."""
    from corescale.measure.http.contract import InstanceLayout, Layout, ServiceInfo, WhatRuns
    from corescale.measure.http.endpoint import Warm, instances_said
    from corescale.measure.http.load import HttpServer

    layout = Layout([InstanceLayout(i, [i], [0], 1, 1) for i in range(2)])
    info = ServiceInfo("m", "float32", {"embedding": "pooled"}, 32, 8, 8, "1",
                       WhatRuns("overrides", "onnxruntime", "fp32", {}, layout)).to_dict()
    assert instances_said({"/info": info}) == 2
    assert instances_said({}) == instances_said({"/info": {"model_id": "m"}}) == 1  # TEI's own /info: no layout
    cfg = compose([*QUICK, "target_qps=auto", "slo_p99_ms=500", "endpoint=http://127.0.0.1:9", "api=tei"])
    warm = Warm(requests=8, errors=0, durations_ms=[50.0] * 8, dimension=None)
    alone, each = HttpServer(cfg, [b"{}"], warm, tmp_path), HttpServer(cfg, [b"{}"], warm, tmp_path, 2)
    assert (alone._first_guess(), each._first_guess()) == (20.0, 40.0)
    alone.loop.close(), each.loop.close()


def test_an_unreachable_endpoint_is_refused_before_loadgen(tmp_path):
    from corescale.measure.runner import prepare_trial

    cfg = compose([*QUICK, "target_qps=20", f"endpoint=http://127.0.0.1:{free_port()}", f"output_dir={tmp_path}"])
    with pytest.raises(UserError) as info:
        prepare_trial(cfg)
    assert "cannot be reached" in str(info.value) and "\n" not in str(info.value)


def test_a_request_the_server_refuses_names_the_api_to_try(tmp_path):
    from corescale.measure.runner import prepare_trial

    with tiny_server() as url:  # a path it does not serve: the 404 is ours to fix, not a server error to measure
        cfg = compose([*QUICK, "target_qps=20", f"endpoint={url}/nowhere", f"output_dir={tmp_path}"])
        with pytest.raises(UserError) as info:
            prepare_trial(cfg)
    assert "404" in str(info.value) and "try api=tei" in str(info.value)


# --- servers driven through the CLI ----------------------------------------------------------------------------

def _run(url, *overrides, out):
    given = dict(item.split("=", 1) for item in [*QUICK, f"endpoint={url}", f"output_dir={out}", *overrides])
    return corescale("run", *(f"{key}={value}" for key, value in given.items()), "--no-progress")


def _result(out):
    path = next(out.glob("*/result.json")).parent
    return path, raw_record(path)


@pytest.fixture(scope="module")
def minilm_server():
    with st_fastapi(minilm_folder()) as url:  # extracted once into the suite's cache (test_serve.py's too)
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("api", ["openai", "tei"])
def test_sentence_transformers_server_over_each_api(minilm_server, api, tmp_path):
    """Each API's requests and answers against a real peer; the rate is not the subject (the tiny server's tests
    drive the server scenario): one query at a time, 64 of them (at 200 QPS a busy machine's 1-thread peer kept
    up with 15-20, as many seconds as 25 QPS took)."""
    proc = _run(minilm_server, f"api={api}", "scenario=single_stream", "server.min_query_count=64",
                "model=all-MiniLM-L6-v2", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path, record = _result(tmp_path)
    server = record["server"]
    assert record["status"] == "ok" and server["validity"] == "VALID", server["steps"]
    assert record["specs"] == [] and record["model"]["source"] == "endpoint"  # nothing started here
    endpoint = server["endpoint"]
    assert endpoint["dimension"] == 384 and endpoint["health"] == 200 and endpoint["warmup_errors"] == 0
    assert endpoint["path"] == {"openai": "/v1/embeddings", "tei": "/embed"}[api]
    if api == "openai":
        assert endpoint["model_field"] == "all-MiniLM-L6-v2" and "/v1/models" in endpoint["reports"]
    step = server["steps"][0]
    assert step["queries"] >= 64 and step["errors"] == 0 and step["http"]["requests"] == step["queries"]
    assert step["http"]["server_ms"] == {}  # this server sends no timing headers
    response = step["http"]["client_ms"]["response"]
    assert 0 < response["p50"] <= response["p99"] <= step["latency_ms"]["max"] + 1
    rows = list(csv.DictReader(io.StringIO((path / "http-requests.csv").read_text())))
    assert len(rows) == step["queries"] and {r["status"] for r in rows} == {"200"}
    assert all(int(r["issued_ns"]) <= int(r["sent_ns"]) < int(r["done_ns"]) for r in rows)
    assert server["queries"]["origin"].startswith("built-in corpus")
    assert f"{minilm_server}" in proc.stdout and "VALID" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_timing_headers_give_the_breakdown_and_the_search_runs_over_http(tmp_path):
    with tiny_server() as url:
        proc = _run(url, "api=tei", "target_qps=auto", "slo_p99_ms=500", "server.max_steps=3",
                    "server.search_precision=0.5", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path, record = _result(tmp_path)
    server = record["server"]
    assert len(server["steps"]) >= 2 and server["max_valid_qps"], server["steps"]
    assert server["endpoint"]["reports"]["/info"]["model_id"] == "tiny"
    for step in server["steps"]:
        breakdown = step["http"]["server_ms"]
        for name, header in (("queue", "X-Queue-Time"), ("tokenization", "X-Tokenization-Time"),
                             ("inference", "X-Inference-Time"), ("total", "X-Total-Time")):
            assert breakdown[name]["count"] == step["queries"] - step["errors"]  # every answer, none of the failures
            assert breakdown[name]["mean"] == breakdown[name]["p99"] == float(TIMES[header])
    assert "inference (ms, server)" in proc.stdout
    from corescale.record.files import read_result
    from corescale.record.sections import Endpoint, HttpStep

    typed = read_result(path).server  # the typed sections, checked on reading
    assert isinstance(typed.endpoint, Endpoint) and isinstance(typed.steps[0].http, HttpStep)
    assert typed.steps[0].http.server_ms["inference"].mean == 5.0 and typed.batching is None


@pytest.mark.slow
def test_a_bounded_search_over_http_cuts_its_test_at_the_bound(tmp_path):
    """server.max_search_s: a server that answers in 250 ms is tested at the lowest rate whose queries fit the bound
    (1.1 s), LoadGen stops issuing there and the test, its last answers due after it, is cut (its requests in
    flight given up, not counted as the server's errors); the search ends and says why (issue 32: one ran 421 s)."""
    with tiny_server(slow_s=0.25) as url:
        proc = _run(url, "api=tei", "target_qps=auto", "slo_p99_ms=300", "duration=1", "server.max_search_s=1.1",
                    "request_timeout=30", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, record = _result(tmp_path)
    server = record["server"]
    assert "server.max_search_s=1.1" in server["bounded"] and len(server["steps"]) == 1, server["bounded"]
    step = server["steps"][0]
    assert step["target_qps"] >= 459 / 1.1 and step["duration_s"] < 10  # not 30 s of requests waiting
    if step["cut"]:  # the usual case; on a slow machine the bound may fall after the last answer
        assert step["http"]["errors"].get("cut") and step["errors"] == 0 and step["validity"] == "INVALID"
        assert server["max_valid_qps"] is None
    assert "search bounded" in proc.stdout


@pytest.mark.slow
def test_single_stream_over_http(tmp_path):
    """A warm-up slower than the test (a busy machine's) still leaves LoadGen queries enough for min_duration: it
    pre-generates its single-stream queries from the expected latency and ends the test INVALID, min_duration_met
    false, when they run out early (the suite's flake: 64 queries of ~1 ms after a warm-up of 25 ms ones)."""
    with tiny_server(slow_first=16) as url:
        proc = _run(url, "api=openai", "scenario=single_stream", "server.min_query_count=64", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, record = _result(tmp_path)
    server = record["server"]
    step = server["steps"][0]
    assert server["scenario"] == "single_stream" and server["validity"] == "VALID", \
        (step["checks"], step["early_stopping"], step["http"]["errors"], step["http"]["error_examples"])
    assert step["http"]["max_in_flight"] == 1 and step["errors"] == 0 and step["queries"] >= 64


@pytest.mark.slow
def test_a_failing_server_is_counted_not_a_traceback(tmp_path):
    with tiny_server(fail="mixed") as url:
        proc = _run(url, "api=tei", "target_qps=100", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    _, record = _result(tmp_path)
    server = record["server"]
    step = server["steps"][0]
    assert server["validity"] == "INVALID" and step["meets_slo"] is False
    errors = step["http"]["errors"]
    assert errors.get("http_500", 0) > 0 and errors.get("reset", 0) > 0, errors
    assert step["errors"] == sum(errors.values()) == server["errors"]
    assert step["queries"] >= 459 and any("boom" in e for e in step["http"]["error_examples"])


@pytest.mark.slow
def test_a_search_stops_at_a_step_where_every_request_failed(tmp_path):
    with tiny_server(fail="500") as url:
        proc = _run(url, "api=tei", "target_qps=auto", "slo_p99_ms=200", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, record = _result(tmp_path)
    server = record["server"]
    assert len(server["steps"]) == 1 and server["max_valid_qps"] is None and server["steps"][0]["broken"]
    assert server["steps"][0]["http"]["errors"] == {"http_500": server["steps"][0]["queries"]}
    assert server["endpoint"]["warmup_errors"] == server["endpoint"]["warmup_requests"]


@pytest.mark.slow
def test_an_unreachable_endpoint_is_exit_2_and_writes_nothing(tmp_path):
    proc = _run(f"http://127.0.0.1:{free_port()}", "target_qps=20", out=tmp_path / "out")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be reached" in lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_ready_line_is_found_when_it_arrives_with_the_line_before_it(tmp_path):
    """Both lines in one write: a reader that select()s the pipe and reads one line at a time leaves the ready
    line in its buffer, where select() never sees it (a 600 s hang when serve printed a line just before it)."""
    import os

    from corescale.measure.http.contract import READY
    from corescale.measure.http.managed import wait_ready

    read, write = os.pipe()

    class Started:  # a process whose output is the pipe (no child needed: the reading is what is checked)
        stdout = os.fdopen(read, "r")

        def poll(self):
            return None

    os.write(write, f"cold start 1.0 s\nready; front on CPUs 0; {READY}127.0.0.1:9\nlater\n".encode())
    try:
        line = wait_ready(Started(), tmp_path / "log", 5)  # type: ignore[arg-type]
        assert READY in line and "127.0.0.1:9" in line
        assert Started.stdout.readline() == "later\n"  # what follows the ready line is left for stop()
    finally:
        os.close(write)
        Started.stdout.close()


class _Odd(BaseHTTPRequestHandler):
    """A server that misbehaves as `server.odd` says: "redirect" answers POST with 307; "trickle" sends /health's
    body one byte every 0.2 s; "metrics" serves /metrics only with the key."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        odd = self.server.odd  # type: ignore[attr-defined]
        if odd == "trickle":
            self.send_response(200)
            self.send_header("content-length", "1000")
            self.end_headers()
            for _ in range(150):  # 30 s in all, each byte well inside a per-read timeout
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
            return
        if odd == "metrics":
            if self.headers.get("authorization") != "Bearer s3cret":
                self.send_error(401)
                return
            body = b"corescale_front_cpu_seconds 12.5\n"
        else:
            body = b"{}"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(307)
        self.send_header("location", "http://127.0.0.1:9/elsewhere")
        self.send_header("content-length", "0")
        self.end_headers()


@contextmanager
def _odd_server(odd: str):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    server.daemon_threads = True
    server.odd = odd  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirecting_endpoint_is_refused_before_loadgen(tmp_path):
    """Audit L9: the probe's client does not follow a redirect and LoadGen's did, so the load measured another URL
    than the one named; now neither follows, and the probe says so."""
    from corescale.measure.runner import prepare_trial

    with _odd_server("redirect") as url:
        cfg = compose([*QUICK, "target_qps=20", f"endpoint={url}", f"output_dir={tmp_path}"])
        with pytest.raises(UserError) as info:
            prepare_trial(cfg)
    assert "redirect" in str(info.value) and "307" in str(info.value)


def test_a_server_trickling_its_answer_is_given_up_within_the_timeout(tmp_path):
    """Audit L9: httpx's timeouts apply to each read, so a /health sending a byte every 0.2 s for 30 s held the
    probe for 30 s; the probe's reads now have a deadline in all."""
    from corescale.measure.runner import prepare_trial

    with _odd_server("trickle") as url:
        cfg = compose([*QUICK, "target_qps=20", "request_timeout=2", f"endpoint={url}", f"output_dir={tmp_path}"])
        began = time.monotonic()
        with pytest.raises(UserError) as info:
            prepare_trial(cfg)
    assert "cannot be reached" in str(info.value) and time.monotonic() - began < 20


def test_the_front_cpu_is_scraped_with_the_key(monkeypatch):
    """Audit L9: endpoint=managed read /metrics without the key, so with a key set the front's CPU was never known."""
    from corescale.measure.http.contract import API_KEY_ENV
    from corescale.measure.http.managed import scraped_front_cpu

    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    with _odd_server("metrics") as url:
        assert scraped_front_cpu(url) == 12.5
