"""`corescale serve`: a real service on loopback, started from a bundle measured in the test, called by the
official openai client and plain HTTP; overload, SIGTERM, a killed worker, bad requests, a tampered bundle."""

import base64
import json
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import corescale, processes_with_env
from serving import Service, measure_bundle, minilm_folder

pytestmark = pytest.mark.slow

CARD = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
KEY = "test-key"


@pytest.fixture(scope="module")
def model():
    return minilm_folder()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """Fused by ONNX Runtime's transformer optimizer: the bundle holds the derived graph, served without
    deriving it again (the encoder's weights are not in the bundle: an export would fail)."""
    return measure_bundle("all-minilm-l6-v2", tmp_path_factory.mktemp("measured"), "backend.fusion=true")


@pytest.fixture(scope="module")
def service(bundle, tmp_path_factory):
    with Service(bundle, tmp_path_factory.mktemp("log") / "serve.log", "--api-key", KEY, "--max-inputs", "8") as s:
        yield s


@pytest.fixture(scope="module")
def reference(model):
    """The fp32 reference: sentence-transformers on the same folder (mean pooling, normalised), in this process."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(str(model), device="cpu")
    return lambda texts: encoder.encode(texts, normalize_embeddings=True, convert_to_numpy=True)


def short_texts(model, count=12):
    """Built-in real texts that fit the measured 64 tokens."""
    from tokenizers import Tokenizer

    from corescale.workload.corpus import texts

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return [t for t in texts(200) if len(tokenizer.encode(t).ids) <= 64][:count]


def post(service, route, body, key=KEY, **kwargs):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{service.url}{route}", json=body, headers=headers, timeout=60, **kwargs)


def test_the_bundle_holds_the_measured_artifact_and_layout(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert {"artifact/model.onnx", "model/tokenizer.json", "model/config.json", "record.json"} <= set(manifest["files"])
    assert "model/model.safetensors" not in manifest["files"]  # the ONNX file is what ran
    record = json.loads((bundle / "record.json").read_text())
    assert manifest["layout"]["instances"][0]["cpus"] == record["specs"][0]["cpus"]
    assert manifest["layout"]["instances"][0]["env"] == record["instance_reports"][0]["launch"]["env"]
    assert manifest["config"]["server"]["max_batch"] == 4 and manifest["head"]["task"] == "embed"
    steps = manifest["artifact"]["steps"]  # the ONNX export's hooks: the export, then its fusion
    assert manifest["artifact"]["kind"] == "onnx" and len(steps) == 2 and "-fused-" in steps[1]
    assert "Attention" in record["instance_reports"][0]["framework"]["operators"]
    assert (bundle / "corescale-serve.service").is_file() and (bundle / "Dockerfile.example").is_file()


def test_openai_client_gets_the_reference_vectors(service, model, reference):
    import openai

    client = openai.OpenAI(base_url=f"{service.url}/v1", api_key=KEY, max_retries=0)
    texts = CARD + short_texts(model)
    expected = reference(texts)
    for encoding in (None, "float", "base64"):  # by default the client asks for base64 and decodes it itself
        answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[:8],
                                          **({"encoding_format": encoding} if encoding else {}))
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") if encoding == "base64" else d.embedding
                        for d in answer.data], dtype=np.float32)
        cosine = (got * expected[:8]).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected[:8], axis=1)
        assert cosine.min() >= 0.9999, cosine
        assert answer.usage.prompt_tokens > len(texts[:8]) * 3
    one = np.array(client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts[9])
                   .data[0].embedding)
    assert float(one @ expected[9]) >= 0.9999
    card = np.array([d.embedding for d in client.embeddings.create(model="all-minilm-l6-v2", input=CARD).data])
    similarity = card @ card.T  # the model card's figures
    assert similarity[0, 1] == pytest.approx(0.6660, abs=1e-3) and similarity[0, 2] == pytest.approx(0.1046, abs=1e-3)


def test_tei_routes_and_timing_headers(service, reference):
    answer = post(service, "/embed", {"inputs": CARD[0]})
    assert answer.status_code == 200
    assert float(np.array(answer.json()[0]) @ reference([CARD[0]])[0]) >= 0.9999
    for header in ("X-Tokenization-Time", "X-Queue-Time", "X-Inference-Time", "X-Total-Time"):
        assert float(answer.headers[header]) >= 0
    assert float(answer.headers["X-Inference-Time"]) > 0
    tokens = post(service, "/tokenize", {"inputs": "Hello world"}).json()[0]
    assert [t["id"] for t in tokens] == [101, 7592, 2088, 102] and tokens[1]["text"] == "Hello"
    assert httpx.get(f"{service.url}/health").status_code == 200  # no key needed


def test_info_says_what_runs_as_tei_does_and_where(service, bundle):
    assert httpx.get(f"{service.url}/info").status_code == 401  # it names the layout: the key is needed
    info = httpx.get(f"{service.url}/info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info["model_dtype"] == "fp32" and info["max_input_length"] == 256 and info["max_client_batch_size"] == 8
    assert info["model_type"]["embedding"]["task"] == "embed"  # TEI's shape: the kind, then its head
    manifest = json.loads((bundle / "manifest.json").read_text())
    runs = info["corescale"]
    assert runs["source"] == str(bundle) and runs["backend"] == "onnxruntime"
    for served, measured in zip(runs["layout"]["instances"], manifest["layout"]["instances"], strict=True):
        assert {k: v for k, v in served.items() if k != "artifact"} == measured
        assert Path(served["artifact"]).name == "model.onnx" and Path(served["artifact"]).is_file()


def test_bad_requests_get_their_status_and_the_service_stays_up(service):
    cases = [
        (post(service, "/v1/embeddings", {"input": "x"}, key=None), 401, "API key"),
        (post(service, "/v1/embeddings", {"input": "x"}, key="wrong"), 401, "API key"),
        (httpx.post(f"{service.url}/v1/embeddings", content=b'{"input": ', timeout=30,
                    headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"}), 422,
         "malformed JSON"),
        (post(service, "/v1/embeddings", {"input": 3}), 422, "input"),
        (post(service, "/v1/embeddings", {"text": "x"}), 422, "input: Field required"),
        (post(service, "/v1/embeddings", {"input": []}), 422, "input"),
        (post(service, "/v1/embeddings", {"input": "x", "encoding_format": "int8"}), 422, "encoding_format"),
        (post(service, "/embed", {"inputs": "word " * 300}), 413, "at most 256"),  # the model's, not 64
        (post(service, "/embed", {"inputs": ["a"] * 9}), 413, "at most 8"),
        (post(service, "/rerank", {"query": "a", "texts": ["b"]}), 400, "serves task 'embed'"),
    ]
    for answer, status, words in cases:
        assert answer.status_code == status, answer.text
        assert words in answer.json()["error"], answer.text
    assert post(service, "/embed", {"inputs": "word " * 300, "truncate": True}).status_code == 200
    assert post(service, "/embed", {"inputs": "word " * 100}).status_code == 200  # past the measured 64
    assert post(service, "/embed", {"inputs": "still up"}).status_code == 200


def test_metrics(service):
    post(service, "/embed", {"inputs": CARD})
    text = httpx.get(f"{service.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for name in ('corescale_requests_total{route="/embed",status="200"}', "corescale_batch_size_bucket",
                 "corescale_queue_seconds_bucket", "corescale_inference_seconds_bucket",
                 'corescale_instance_busy_fraction{instance="0"}', "corescale_front_cpu_seconds",
                 "corescale_front_cores_used", "process_cpu_seconds_total"):
        assert name in text, name
    busy = float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("corescale_instance_busy_fraction")))
    assert 0 < busy < 1


def test_overload_is_429_and_no_accepted_request_is_lost(bundle, tmp_path, reference):
    texts = [f"request number {i} about the weather" for i in range(40)]
    expected = reference(texts)
    answers: dict[int, httpx.Response] = {}
    with Service(bundle, tmp_path / "serve.log", "--max-queue", "4") as service:
        def send(i):
            answers[i] = httpx.post(f"{service.url}/embed", json={"inputs": texts[i]}, timeout=120)
        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(texts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        queued = httpx.get(f"{service.url}/metrics").text
    statuses = [answers[i].status_code for i in range(len(texts))]
    assert set(statuses) <= {200, 429} and statuses.count(429) > 0 and statuses.count(200) >= 4, statuses
    for i, answer in answers.items():
        if answer.status_code == 429:
            assert answer.headers["Retry-After"] == "1" and "overloaded" in answer.json()["error"]
        else:
            assert float(np.array(answer.json()[0]) @ expected[i]) >= 0.9999
    assert "corescale_queue_inputs 0.0" in queued


def test_sigterm_drains_accepted_requests_and_exits_0(bundle, tmp_path):
    service = Service(bundle, tmp_path / "serve.log")
    answers = []

    def send():
        answers.append(httpx.post(f"{service.url}/embed", json={"inputs": ["a text to embed"] * 4}, timeout=120))
    threads = [threading.Thread(target=send) for _ in range(12)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while accepted_inputs(service) < 48:  # every request in (SIGTERM stops accepting: a later one is refused)
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.01)
        code, out = service.terminate()
        for thread in threads:
            thread.join()
    finally:
        service.stop()
    assert code == 0, out + (tmp_path / "serve.log").read_text()[-2000:]
    assert len(answers) == 12 and all(a.status_code == 200 for a in answers), [a.status_code for a in answers]
    assert "the front used" in out and "48 inputs served" in out
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{service.url}/health")


def accepted_inputs(service) -> float:
    """Inputs the service holds or has computed (its queue and its computed count, from /metrics)."""
    found = {line.split()[0]: float(line.split()[-1]) for line in httpx.get(f"{service.url}/metrics").text.splitlines()
             if line.startswith(("corescale_queue_inputs ", "corescale_inputs_total "))}
    return found.get("corescale_queue_inputs", 0.0) + found.get("corescale_inputs_total", 0.0)


def test_a_killed_worker_is_restarted_and_the_service_answers_again(bundle, tmp_path):
    marker = f"CORESCALE_SERVE_TEST={uuid.uuid4()}"
    name, value = marker.split("=")
    with Service(bundle, tmp_path / "serve.log", env={name: value}) as service:
        assert post(service, "/embed", {"inputs": "before"}, key=None).status_code == 200
        (worker,) = [pid for pid in processes_with_env(marker) if pid != service.process.pid
                     and b"corescale.measure.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 120
        answer = None
        while time.monotonic() < deadline:
            answer = httpx.post(f"{service.url}/embed", json={"inputs": "after"}, timeout=120)
            if answer.status_code == 200:
                break
            assert answer.status_code == 503, answer.text  # only the one in flight when it died
        assert answer is not None and answer.status_code == 200
        assert 'corescale_instance_restarts_total{instance="0"} 1.0' in httpx.get(f"{service.url}/metrics").text
        code, out = service.terminate()
    assert code == 0 and "restarted 1 time(s)" in out


def test_a_tampered_or_incomplete_bundle_is_refused_before_any_worker(bundle, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    with open(copy / "model" / "tokenizer_config.json", "a") as handle:
        handle.write(" ")
    proc = corescale("serve", str(copy), "--port", "0", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "model/tokenizer_config.json" in proc.stderr and "sha256" in proc.stderr
    (copy / "artifact" / "model.onnx").unlink()
    proc = corescale("serve", str(copy), "--port", "0", timeout=60)
    assert proc.returncode == 2 and "missing" in proc.stderr
    proc = corescale("serve", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "not a corescale bundle" in proc.stderr


def test_run_refuses_a_bundle_folder_in_use_before_measuring(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    proc = corescale("run", "model=bert-tiny", f"output_dir={tmp_path / 'out'}", "--bundle", str(tmp_path / "taken"))
    assert proc.returncode == 2 and "not empty" in proc.stderr and not (tmp_path / "out").exists()
    proc = corescale("run", "model=roberta-base", f"output_dir={tmp_path / 'out'}", "--bundle", str(tmp_path / "new"))
    assert proc.returncode == 2 and "has no tokenizer" in proc.stderr and not (tmp_path / "out").exists()


def artifact_outputs(bundle, items, pairs=False):
    """The bundle's ONNX file run here, one input at a time: what the service must answer."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer_dir = json.loads((bundle / "manifest.json").read_text())["config"]["workload"]["tokenizer"]
    tokenizer = Tokenizer.from_file(str(bundle / tokenizer_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    session = ort.InferenceSession(str(bundle / "artifact" / "model.onnx"), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    rows = []
    for item in items:
        encoded = tokenizer.encode(*item) if pairs else tokenizer.encode(item)
        feed = {"input_ids": [encoded.ids], "attention_mask": [encoded.attention_mask],
                "token_type_ids": [encoded.type_ids]}
        rows.append(session.run(None, {k: np.asarray(v, dtype=np.int64) for k, v in feed.items() if k in names})[0][0])
    return np.array(rows)


def test_rerank_and_predict_serve_their_heads(tmp_path, tiny_service):
    service = tiny_service("rerank")  # the session's bert-tiny reranker (test_managed_endpoint.py calls it too)
    query, texts = "which package manages fonts", ["font configuration library", "a web server", "fonts"]
    logits = artifact_outputs(service.bundle, [(query, t) for t in texts], pairs=True)[:, 0]
    ranked = httpx.post(f"{service.url}/rerank", json={"query": query, "texts": texts, "return_text": True},
                        timeout=60).json()
    raw = httpx.post(f"{service.url}/rerank", json={"query": query, "texts": texts, "raw_scores": True},
                     timeout=60).json()
    wrong = httpx.post(f"{service.url}/embed", json={"inputs": "x"}, timeout=60)
    assert [r["index"] for r in ranked] == list(np.argsort(-logits))
    assert {r["index"]: r["score"] for r in raw} == pytest.approx(dict(enumerate(logits.tolist())), abs=1e-4)
    assert ranked[0]["text"] == texts[ranked[0]["index"]] and wrong.status_code == 400
    classifier = measure_bundle("bert-tiny", tmp_path / "classify", "task=classify")
    labels = json.loads((classifier / "manifest.json").read_text())["head"]["labels"]
    logits = artifact_outputs(classifier, ["a happy text", "a sad one"])
    with Service(classifier, tmp_path / "classify.log") as service:
        one = httpx.post(f"{service.url}/predict", json={"inputs": "a happy text"}, timeout=60).json()
        both = httpx.post(f"{service.url}/predict", json={"inputs": ["a happy text", "a sad one"]}, timeout=60).json()
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert [p["label"] for p in one] == [labels[i] for i in np.argsort(-probabilities[0])]
    assert [p["score"] for p in both[1]] == pytest.approx(sorted(probabilities[1], reverse=True), abs=1e-4)


def test_serve_a_layout_from_overrides(tmp_path):
    layout = f"model=bert-tiny task=embed backend=onnxruntime sequence_length=32 batch_size=2 cache_dir={tmp_path}"
    with Service(layout, tmp_path / "serve.log") as service:
        answer = httpx.post(f"{service.url}/v1/embeddings", json={"input": ["one", "two", "three"]}, timeout=60)
        too_long = httpx.post(f"{service.url}/embed", json={"inputs": "word " * 300}, timeout=60)
        info = httpx.get(f"{service.url}/info", timeout=60).json()["corescale"]
        code, out = service.terminate()
    assert info["source"] == "overrides" and info["config"]["backend"]["name"] == "onnxruntime"
    (instance,) = info["layout"]["instances"]  # started as a run starts it: the variables a run records
    assert instance["env"]["OMP_NUM_THREADS"] == str(instance["threads"])
    assert Path(instance["artifact"]).is_relative_to(tmp_path)  # built in the layout's cache_dir
    assert info["config"]["compiled_cache"] is None  # ONNX Runtime keeps nothing compiled
    assert answer.status_code == 200 and [len(d["embedding"]) for d in answer.json()["data"]] == [128] * 3
    assert too_long.status_code == 413 and "at most 256" in too_long.json()["error"]  # the model's length
    assert code == 0 and "3 inputs served" in out
    proc = corescale("serve", "model=no-such-model", "backend=onnxruntime", env={"HF_HUB_OFFLINE": "1"}, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown model" in proc.stderr
