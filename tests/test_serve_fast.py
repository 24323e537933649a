"""The computed routes' fast path (serve/app.py's Served, issue 31): every registered task's POST route is answered
before FastAPI's stack, with the same checks, answers and errors as through it. In process (no instance): the
front with a pool that answers at once, each request sent once through the fast path and once through FastAPI's."""

import functools

import fastapi
import numpy as np
import pytest
from fastapi.testclient import TestClient
from serving import minilm_folder
from test_serve_limits import VOCAB, FakePool

from corescale.serve.limits import Limits
from corescale.serve.tokens import Tokens

KEY = "k3y"
PAYLOAD = 4_000
TIMINGS = ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time")


def clients(task="embed", key=KEY, room=8, rows=lambda ids: np.arange(1, 33, dtype=np.float32)):
    """Two clients of the same front: through the fast path, and with it emptied (FastAPI's stack)."""
    from corescale.serve.app import Front, create_app
    from corescale.serve.metrics import Metrics
    from corescale.workload.heads import HeadSpec

    made = []
    for fast in (True, False):
        head = HeadSpec(task=task, pooling="mean", normalize=False)
        metrics = Metrics()
        app = create_app(Front(FakePool(room=room, rows=rows), tokens(), head, ["m"], metrics, width=32), key,
                         payload_bytes=PAYLOAD, loopback_only=key is None)
        if not fast:
            app.fast.clear()
        made.append((TestClient(app, base_url="http://localhost", raise_server_exceptions=False), metrics))
    return made


@functools.cache
def tokens() -> Tokens:
    """One tokenizer for every front here (it holds no state between requests)."""
    return Tokens(minilm_folder() / "tokenizer.json", 64, Limits(max_inputs=8, answer_floats=1000), VOCAB)


AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "content-type": "application/json"}
REQUESTS = [
    ("/embed", {"json": {"inputs": "a few words"}, "headers": AUTH}),
    ("/embed", {"json": {"inputs": ["one", "two words"], "normalize": True, "truncate": True}, "headers": AUTH}),
    ("/embed", {"json": {"inputs": "x", "normalize": False}, "headers": AUTH}),
    ("/v1/embeddings", {"json": {"input": "hello", "model": "m"}, "headers": AUTH}),
    ("/v1/embeddings", {"json": {"input": ["a", "b"], "encoding_format": "base64"}, "headers": AUTH}),
    ("/v1/embeddings", {"json": {"input": "a", "model": "other"}, "headers": AUTH}),  # 404
    ("/v1/embeddings", {"json": {"input": [1, 2]}, "headers": AUTH}),  # token ids: 422
    ("/v1/embeddings", {"json": {"input": "a", "dimensions": 7}, "headers": AUTH}),  # 422
    ("/v1/embeddings", {"json": {"input": "a", "encoding_format": "int8"}, "headers": AUTH}),  # 422
    ("/v1/embeddings", {"json": {"text": "x"}, "headers": AUTH}),  # 422 Field required
    ("/embed", {"json": {"inputs": []}, "headers": AUTH}),  # 422
    ("/embed", {"json": {"inputs": ["a", ""]}, "headers": AUTH}),  # 422 empty
    ("/embed", {"json": {"inputs": ["a"] * 9}, "headers": AUTH}),  # 413 --max-inputs
    ("/embed", {"json": {"inputs": "word " * 100}, "headers": AUTH}),  # 413 longer than the model takes
    ("/embed", {"json": {"inputs": "a"}}),  # 401 without the key
    ("/embed", {"json": {"inputs": "a"}, "headers": {"Authorization": "Bearer wrong"}}),  # 401
    ("/embed", {"content": b"{not json", "headers": JSON}),  # 422 malformed
    ("/embed", {"content": b'{"inputs": "\xff\xfe"}', "headers": JSON}),  # 422 not UTF-8
    ("/embed", {"content": b'{"inputs": "a"}', "headers": {**AUTH, "content-type": "text/plain"}}),  # 422
    ("/embed", {"content": b'{"inputs": "a"}', "headers": {**AUTH, "content-type": ""}}),  # 422
    ("/embed", {"content": b'{"inputs": "a"}', "headers": AUTH}),  # no content type: JSON
    ("/embed", {"content": b'{"inputs": "' + b"a" * PAYLOAD + b'"}', "headers": JSON}),  # 413 declared
    ("/embed", {"content": (b'{"inputs": "', b"a" * PAYLOAD, b'"}'), "headers": JSON}),  # 413 counted
    ("/rerank", {"json": {"query": "q", "texts": ["a"]}, "headers": AUTH}),  # 400: an embed bundle
    ("/embed", {"json": {"inputs": "a"}, "headers": {**AUTH, "host": "evil.example"}}),  # a key: any host
]


@pytest.mark.parametrize(("path", "request_"), REQUESTS, ids=[f"{i}{p}" for i, (p, _) in enumerate(REQUESTS)])
def test_the_fast_path_answers_as_fastapi_does(path, request_):
    (fast, fast_metrics), (slow, slow_metrics) = clients()
    chunked = isinstance(request_.get("content"), tuple)  # sent without a length: counted as it arrives
    a, b = (client.post(path, **(request_ | {"content": iter(request_["content"])} if chunked else request_))
            for client in (fast, slow))
    assert a.status_code == b.status_code, (a.text, b.text)
    assert a.content == b.content
    assert {k: v for k, v in a.headers.items() if k not in TIMINGS} == \
        {k: v for k, v in b.headers.items() if k not in TIMINGS}
    assert (set(TIMINGS) <= set(a.headers)) == (a.status_code == 200) == (set(TIMINGS) <= set(b.headers))
    counted = [[line for line in metrics.text().decode().splitlines() if line.startswith("corescale_requests_total")]
               for metrics in (fast_metrics, slow_metrics)]
    assert counted[0] == counted[1] and counted[0]


def test_the_fast_path_skips_fastapis_stack_and_the_rest_goes_through_it(monkeypatch):
    (fast, _), _ = clients(key=None)

    def entered(*args, **kwargs):
        raise AssertionError("FastAPI's stack was entered")

    assert fast.post("/embed", json={"inputs": "a"}).status_code == 200
    monkeypatch.setattr(fastapi.FastAPI, "__call__", entered)
    assert fast.post("/embed", json={"inputs": "a"}).status_code == 200
    assert fast.post("/v1/embeddings", json={"input": "a"}).status_code == 200
    assert fast.post("/embed", json={"inputs": "a"}, headers={"host": "evil.example"}).status_code == 400
    monkeypatch.undo()
    assert fast.get("/embed").status_code == 405 and fast.post("/nowhere", json={}).status_code == 404
    assert fast.post("/tokenize", json={"inputs": "a b"}).status_code == 200


def test_the_fast_path_refuses_a_full_queue_with_retry_after():
    for client, _ in clients(room=1):
        answer = client.post("/embed", json={"inputs": ["a", "b"]}, headers=AUTH)
        assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
        assert answer.json()["error_type"] == "Overloaded"
