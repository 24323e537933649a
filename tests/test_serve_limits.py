"""`corescale serve` bounded and to the contracts it mimics (issue 29 items 2, 3, 5; review-0.3-audit H2, M1, M5,
M6, M7, L4, L5): one real service on loopback for the whole file, serving a tiny BERT folder made here (random
weights, a mean-pooling head that does not normalise) with a doctored tokenizer (no special tokens, one added
token past the vocabulary), measured at 32 tokens while the model takes 128. Real clients: httpx, raw sockets
(slow and hostile bodies), the official openai client."""

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from serving import Service, minilm_folder

from corescale.serve.limits import Limits
from corescale.serve.tokens import Tokens, TooLarge, Unservable, longest_served

VOCAB = 30522
PAST_VOCAB = "zzqxvword"  # the added token: id 30522, one past the model's embeddings
MAX_LENGTH = 128  # tokenizer_config.json's model_max_length (config.json allows 512; measured at 32)
RECEIVE_S = 2.0


def tiny_model(folder):
    """A 2-layer BERT (random weights), mean pooling without Normalize, MiniLM's vocabulary without special
    tokens, plus one token past the vocabulary."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(folder)
    tokenizer = Tokenizer.from_file(str(minilm_folder() / "tokenizer.json"))
    tokenizer.post_processor = None  # "" and "   " give no ids (a ByteLevel/WordLevel-style tokenizer does)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.add_tokens([AddedToken(PAST_VOCAB, single_word=True)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": MAX_LENGTH}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                  "pooling_mode_mean_tokens": True}))
    return folder


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    where = tmp_path_factory.mktemp("limits")
    model = tiny_model(where / "model")
    layout = (f"model={model} backend=onnxruntime sequence_length=32 batch_size=2 pad=bucket "
              f"cache_dir={where / 'cache'} workload.tokenizer={model}")
    with Service(layout, where / "serve.log", "--max-inputs", "8", "--max-input-chars", "400000",
                 "--max-request-chars", "1600000", "--receive-timeout", str(RECEIVE_S)) as served:
        yield served


def post(service, route, body, **kwargs):
    return httpx.post(f"{service.url}{route}", json=body, timeout=60, **kwargs)


def refused(answer, status, words):
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error", "error_type"} and words in body["error"], body


def inputs_computed(service) -> float:
    text = httpx.get(f"{service.url}/metrics", timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("corescale_inputs_total")))


def probe_health(service, during):
    """/health's answer times (seconds) while `during` runs in another thread."""
    times, errors = [], []
    worker = threading.Thread(target=lambda: errors.extend(during()))
    with httpx.Client(timeout=30) as client:
        worker.start()
        while worker.is_alive():
            began = time.monotonic()
            assert client.get(f"{service.url}/health").status_code == 200
            times.append(time.monotonic() - began)
            time.sleep(0.02)
    worker.join()
    return times, errors


@pytest.mark.slow
def test_inputs_up_to_the_models_length_are_served_and_longer_ones_refused_unless_truncated(service):
    """Item 3: measured at 32 tokens, the model takes 128: 100 tokens are served (the batcher and the worker
    pad to the batch's longest row, past the measured length), 200 get 413 unless truncate=true."""
    info = httpx.get(f"{service.url}/info", timeout=30).json()
    assert info["max_input_length"] == MAX_LENGTH and info["measured_length"] == 32
    assert info["limits"] == {**Limits(max_inputs=8, input_chars=400_000, request_chars=1_600_000).to_json()}
    answer = post(service, "/embed", {"inputs": ["word " * 100, "short one"]})
    assert answer.status_code == 200, answer.text
    refused(post(service, "/embed", {"inputs": "word " * 200}), 413, "at most 128")
    assert post(service, "/embed", {"inputs": "word " * 200, "truncate": True}).status_code == 200


@pytest.mark.slow
def test_poison_inputs_get_422_and_no_instance_dies(service):
    """M1: an empty or whitespace input (no ids with this tokenizer), an id past the vocabulary: 422 from the
    front; the instance never sees them (no restart)."""
    for body, words in (({"inputs": ""}, "empty"), ({"inputs": ["fine", "   "]}, "input 1 is empty"),
                        ({"inputs": f"a {PAST_VOCAB} b"}, "past the model's vocabulary"),
                        ({"inputs": "\u200b"}, "gives no tokens")):
        refused(post(service, "/embed", body), 422, words)
    assert post(service, "/embed", {"inputs": "still here"}).status_code == 200
    assert 'corescale_instance_restarts_total{instance="0"}' not in httpx.get(f"{service.url}/metrics").text


@pytest.mark.slow
def test_oversized_and_hostile_bodies_while_health_answers(service):
    """H2: bodies past the limit are refused as they arrive (declared or not); large inputs within the limits are
    tokenized off the event loop: /health answers within 0.5 s throughout (one probe of a busy machine's may take up to
    1 s; a loop blocked by tokenizing held every probe 1.3 s, three times, on an idle Zen 5)."""
    host, port = service.url.removeprefix("http://").split(":")

    def hostile():
        statuses = []
        with socket.create_connection((host, int(port)), timeout=30) as sock:  # declares 50 MB
            sock.sendall(b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 50000000\r\n\r\n" + b"x" * 65536)
            statuses.append(sock.recv(4096).split(b" ")[1])

        def chunks():  # chunked, no length: counted as it arrives
            for _ in range(40):
                yield b'["' + b"y" * 100_000
        statuses.append(httpx.post(f"{service.url}/embed", content=chunks(), timeout=60,
                                   headers={"content-type": "application/json"}).status_code)
        many = ["word " * 38_000 + str(i) for i in range(8)]  # 1.5 MB, 1.5M characters, cut to 128 tokens each
        with httpx.Client(timeout=120) as client:
            for _ in range(3):
                statuses.append(client.post(f"{service.url}/embed", json={"inputs": many, "truncate": True})
                                .status_code)
            statuses.append(client.post(f"{service.url}/tokenize", json={"inputs": many[:4]}).status_code)
        return statuses

    times, statuses = probe_health(service, hostile)
    assert statuses == [b"413", 413, 200, 200, 200, 413], statuses  # /tokenize: 38000 tokens, over 128
    assert len(times) >= 5 and sum(t > 0.5 for t in times) <= 1 and max(times) < 1.0, sorted(times)[-5:]


@pytest.mark.slow
def test_limits_are_checked_before_tokenizing(service):
    """H2: too many characters per input or per request, or tokens per request: 413 naming the option."""
    refused(post(service, "/embed", {"inputs": "x" * 400_001}), 413, "--max-input-chars")
    refused(post(service, "/embed", {"inputs": ["x " * 175_000] * 5}), 413, "--max-request-chars")
    refused(post(service, "/embed", {"inputs": ["a"] * 9}), 413, "--max-inputs")
    refused(post(service, "/tokenize", {"inputs": "word " * 200}), 413, "at most 128")


@pytest.mark.slow
def test_slow_clients_are_cut_at_the_receive_deadline_and_others_are_answered(service):
    """M6: a client trickling header bytes (slow loris), or a body, is disconnected after --receive-timeout; the
    service answers others meanwhile."""
    host, port = service.url.removeprefix("http://").split(":")
    slow = []
    for opening in (b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                    b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{"):
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(opening)
        sock.settimeout(0.2)
        slow.append(sock)
    began, closed = time.monotonic(), {}
    while len(closed) < len(slow) and time.monotonic() - began < RECEIVE_S + 10:
        assert post(service, "/embed", {"inputs": "others are served"}).status_code == 200
        for number, sock in enumerate(slow):
            if number in closed:
                continue
            try:
                sock.sendall(b"X-Slow: 1\r\n" if number == 0 else b" ")
                if sock.recv(4096) == b"":
                    closed[number] = time.monotonic() - began
            except TimeoutError:
                pass
            except OSError:
                closed[number] = time.monotonic() - began
        time.sleep(0.3)
    for sock in slow:
        sock.close()
    assert sorted(closed) == [0, 1] and min(closed.values()) >= RECEIVE_S * 0.9, closed
    limits = Path(f"/proc/{service.process.pid}/limits").read_text()
    soft, hard = next(line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files"))
    assert soft == hard  # raised at start: each connection is a descriptor
    assert "Traceback" not in service.log.read_text()  # a client cut while sending its body is no error of ours


@pytest.mark.slow
def test_openai_semantics(service):
    """M7: unit-length vectors (the head does not normalise), `model` the served one or 404 model_not_found,
    `dimensions` refused before any compute, token ids refused with a clear message (L4)."""
    import openai

    client = openai.OpenAI(base_url=f"{service.url}/v1", api_key="unused", max_retries=0)
    served = httpx.get(f"{service.url}/info", timeout=30).json()["model_id"]
    answer = client.embeddings.create(model=served, input=["one text", "another one"], encoding_format="float")
    assert answer.model == served
    assert [round(float(np.linalg.norm(d.embedding)), 5) for d in answer.data] == [1.0, 1.0]
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="text-embedding-3-large", input="x")
    assert missing.value.status_code == 404 and missing.value.response.json()["error_type"] == "model_not_found"
    before = inputs_computed(service)
    for asked, words in (({"input": "x", "dimensions": 16}, "dimensions: this model gives 32"),
                         ({"input": [[101, 2023, 102]]}, "token ids are not accepted")):
        with pytest.raises(openai.UnprocessableEntityError) as wrong:
            client.embeddings.create(model=served, **asked)
        assert words in wrong.value.response.json()["error"]
    assert inputs_computed(service) == before
    raw = post(service, "/embed", {"inputs": "one text", "normalize": True}).json()[0]
    assert float(np.linalg.norm(raw)) == pytest.approx(1.0, abs=1e-5)
    plain = post(service, "/embed", {"inputs": "one text", "normalize": False}).json()[0]
    assert float(np.linalg.norm(plain)) != pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_every_error_has_the_documented_shape_and_labels_stay_bounded(service):
    """L4: the framework's own 404/405, non-UTF-8, deep nesting, huge integers; M5: unknown paths are one
    metric label; L5: no /openapi.json, and a loopback service without a key answers only to loopback names."""
    json_type = {"content-type": "application/json"}
    refused(httpx.get(f"{service.url}/no-such-path-1"), 404, "Not Found")
    refused(httpx.get(f"{service.url}/no-such-path-2"), 404, "Not Found")
    refused(httpx.get(f"{service.url}/embed"), 405, "Method Not Allowed")
    refused(httpx.get(f"{service.url}/openapi.json"), 404, "Not Found")
    refused(httpx.post(f"{service.url}/embed", content=b'{"inputs": "\xff\xfe"}', headers=json_type), 422, "JSON")
    refused(httpx.post(f"{service.url}/embed", content=b"[" * 100_000, headers=json_type), 422, "JSON")
    refused(httpx.post(f"{service.url}/embed", content=b'{"inputs": ' + b"9" * 5000 + b"}", headers=json_type),
            422, "JSON")
    refused(httpx.post(f"{service.url}/embed", content=b'{"inputs": "x"}', headers={"content-type": "text/plain"}),
            422, "Content-Type")
    refused(httpx.get(f"{service.url}/info", headers={"host": "rebound.example.com"}), 400, "loopback")
    assert httpx.get(f"{service.url}/info", headers={"host": "localhost:1"}).status_code == 200
    refused(httpx.get(f"{service.url}/health", headers={"x-filler": "y" * 20_000}), 400, "headers passed")
    body = json.dumps({"inputs": "word " * 30_000}).encode()  # headers and a large body arrive in one read
    assert httpx.post(f"{service.url}/embed", content=body, headers=json_type).status_code == 413
    metrics = httpx.get(f"{service.url}/metrics").text
    assert "no-such-path" not in metrics and 'route="other",status="404"' in metrics


def test_a_rerank_query_is_tokenized_once_and_gives_the_pairs_ids():
    tokens = Tokens(minilm_folder() / "tokenizer.json", 10, Limits(), VOCAB)
    pairs = [("which query", "a document here and more words to cut"), ("which query", "short")]
    for truncate in (False, True):
        if not truncate:
            with pytest.raises(TooLarge):
                tokens.encode(pairs, truncate, pairs=True)
            continue
        encoded = tokens.encode(pairs, truncate, pairs=True)
        expected = tokens.truncating.encode_batch(pairs)
        assert [list(r) for r in encoded.rows] == [e.ids for e in expected]
        assert [list(t) for t in encoded.types] == [e.type_ids for e in expected]
    tokens = Tokens(minilm_folder() / "tokenizer.json", 16, Limits(request_chars=1000, auto_truncate=True), VOCAB)
    assert len(tokens.encode(["word " * 100]).rows[0]) == 16  # --auto-truncate
    tokens.check([("q" * 900, "a"), ("q" * 900, "b")])  # the query counted once
    with pytest.raises(TooLarge):
        tokens.check([("q" * 900, "a" * 101)])
    with pytest.raises(Unservable):
        tokens.check([("q", " ")])


def test_the_longest_served_length_is_the_models_declared_one(tmp_path):
    assert longest_served(tmp_path, 512, 128) == 512
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    assert longest_served(tmp_path, 512, 128) == 512
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    assert longest_served(tmp_path, 512, 128) == 256 and longest_served(tmp_path, None, 384) == 384
    assert longest_served(minilm_folder(), 512, 128) == 256  # all-MiniLM-L6-v2: 256, whatever was measured


class FakePool:
    """The pool's side of the front, in this process: room for `room` inputs, answers `rows` for each input."""

    def __init__(self, room=8, rows=None):
        self.room, self.rows, self.pending, self.submitted = room, rows, 0, 0
        self.instances = []

    def admit(self, rows):
        from corescale.serve.pool import Overloaded

        if self.pending + rows > self.room:
            raise Overloaded(f"the queue holds {self.pending} inputs (at most {self.room})")
        self.pending += rows

    def release(self, rows):
        self.pending -= rows

    def submit(self, request):
        self.submitted += 1
        self.pending -= len(request.rows)
        request.future.set_result([self.rows(ids) for ids in request.rows])

    def ready_count(self):
        return 1


class CountedTokens(Tokens):
    calls = 0

    def encode(self, *args, **kwargs):
        CountedTokens.calls += 1
        return super().encode(*args, **kwargs)


def front_client(task="embed", key=None, **pool):
    from fastapi.testclient import TestClient

    from corescale.serve.app import Front, create_app
    from corescale.serve.metrics import Metrics
    from corescale.workload.heads import HeadSpec

    tokens = CountedTokens(minilm_folder() / "tokenizer.json", 64, Limits(max_inputs=8, answer_floats=1000), VOCAB)
    pool = FakePool(**pool)
    head = HeadSpec(task=task, pooling=None if task == "encode" else "mean", normalize=task == "embed")
    metrics = Metrics()
    app = create_app(Front(pool, tokens, head, ["m"], metrics, width=32), key)
    return TestClient(app, raise_server_exceptions=False), pool, metrics


def test_admission_is_checked_before_tokenizing():
    client, pool, _ = front_client(room=2, rows=lambda ids: np.ones(4, np.float32))
    CountedTokens.calls = 0
    answer = client.post("/embed", json={"inputs": ["a", "b", "c"]})
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "1" and CountedTokens.calls == 0
    assert pool.pending == 0
    refused(client.post("/embed", json={"inputs": ["a", ""]}), 422, "empty")  # refused after admission: released
    assert pool.pending == 0 and client.post("/embed", json={"inputs": ["a", "b"]}).status_code == 200


def test_a_non_finite_output_and_an_answer_too_large_are_refused_in_shape():
    client, pool, _ = front_client(rows=lambda ids: np.array([np.nan, 1.0], np.float32))
    refused(client.post("/embed", json={"inputs": "a"}), 500, "non-finite")
    client, pool, _ = front_client("encode", rows=lambda ids: np.ones((len(ids), 32), np.float32))
    assert client.post("/embed_all", json={"inputs": "a few words"}).status_code == 200  # 5 tokens x 32
    refused(client.post("/embed_all", json={"inputs": "word " * 40}), 413, "--max-answer-floats")
    assert pool.submitted == 1  # refused before computing


def test_refused_requests_on_random_paths_are_one_metric_label():
    """M5: with a key, a refused request's path is not a label (the key is checked before routing)."""
    client, _, metrics = front_client(key="k")
    for number in range(20):
        refused(client.get(f"/random-{number}"), 401, "API key")
    text = metrics.text().decode()
    assert "random-" not in text and 'corescale_requests_total{route="other",status="401"} 20.0' in text


def test_only_loopback_host_names_pass_a_loopback_services_host_check():
    """DNS rebinding: a name an attacker owns that starts with "127." (127.0.0.1.rebind.example) is not loopback."""
    from corescale.serve.guard import Guard, Refused

    guard = Guard(None, None, None, 1000, loopback_only=True)
    for host in (b"localhost:8080", b"127.0.0.1", b"127.3.4.5:1", b"[::1]:8080", b"LOCALHOST"):
        guard.check({"headers": [(b"host", host)], "path": "/info"})
    for host in (b"127.0.0.1.rebind.example", b"127.evil.example:8080", b"rebound.example.com", b"[::2]:80"):
        with pytest.raises(Refused):
            guard.check({"headers": [(b"host", host)], "path": "/info"})


@pytest.mark.slow
def test_health_survives_a_flood_of_idle_connections_and_they_are_cut_soon(tiny_bundle, tmp_path):
    """Review 0.4 F7: connections that send nothing hold the connection limit (uvicorn counts open connections);
    /health is answered past it, and an idle connection is closed after FIRST_BYTES_S, not the receive deadline."""
    from corescale.serve.guard import FIRST_BYTES_S

    with Service(tiny_bundle("embed"), tmp_path / "serve.log", "--max-connections", "6", "--receive-timeout",
                 "60") as service:
        host, port = service.url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(8)]
        began = time.monotonic()
        try:
            assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200
            assert httpx.post(f"{service.url}/embed", json={"inputs": "x"}, timeout=10).status_code == 503
            for sock in idle:  # each closed by the service after its first-bytes deadline
                sock.settimeout(FIRST_BYTES_S + 10)
                assert sock.recv(16) == b""
            assert FIRST_BYTES_S * 0.9 <= time.monotonic() - began < 30
            assert httpx.post(f"{service.url}/embed", json={"inputs": "x"}, timeout=10).status_code == 200
        finally:
            for sock in idle:
                sock.close()
