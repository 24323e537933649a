"""Servers the endpoint tests drive on loopback: a tiny stdlib HTTP server (threads in the test process) that
answers like TEI or OpenAI with TEI's timing headers, and can fail on purpose; and the sentence-transformers
FastAPI peer (benchmarks/peer_servers/st_fastapi.py) in its own process, with the trained all-MiniLM-L6-v2."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PEERS = Path(__file__).resolve().parent.parent / "benchmarks" / "peer_servers"
sys.path.insert(0, str(PEERS))
from peer_launch import free_port, started  # noqa: E402  (the peers' own launcher: benchmarks/peer_servers/peer_launch.py)

TIMES = {"X-Queue-Time": "2", "X-Tokenization-Time": "1", "X-Inference-Time": "5", "X-Total-Time": "8"}


class TinyHandler(BaseHTTPRequestHandler):
    """/health, /info, and /embed or /v1/embeddings answering one 4-float embedding; `fail` in the server picks
    what the embedding routes do: None (answer), "500" (every request), "mixed" (500, drop, answer in turn);
    `slow_first` answers that many requests 25 ms late (a warm-up slower than the test, as on a busy machine);
    `slow_s` answers every request that late (a server too slow for the SLO)."""

    protocol_version = "HTTP/1.1"  # keep-alive, as a real server
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, b"{}")
        elif self.path == "/info":
            self._answer(200, json.dumps({"model_id": "tiny", "version": "0"}).encode())
        else:
            self._answer(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        if self.path not in ("/embed", "/v1/embeddings"):
            self._answer(404, b'{"error": "not found"}')
            return
        turn = next(self.server.turns)  # type: ignore[attr-defined]
        if turn < self.server.slow_first:  # type: ignore[attr-defined]
            time.sleep(0.025)
        time.sleep(self.server.slow_s)  # type: ignore[attr-defined]
        fail = self.server.fail  # type: ignore[attr-defined]
        if fail == "500" or (fail == "mixed" and turn % 3 == 0):
            self._answer(500, b'{"error": "boom"}')
            return
        if fail == "mixed" and turn % 3 == 1:
            self.close_connection = True  # no answer: the client sees the connection closed
            return
        vector = [0.5, 0.5, 0.5, 0.5]
        if self.path == "/embed" and "inputs" in body:
            self._answer(200, json.dumps([vector]).encode(), TIMES)
        elif self.path == "/v1/embeddings" and "input" in body:
            self._answer(200, json.dumps({"data": [{"embedding": vector, "index": 0}], "model": body.get("model")})
                         .encode())
        else:
            self._answer(422, b'{"error": "wrong schema"}')

    def _answer(self, status: int, payload: bytes, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class TinyServer(ThreadingHTTPServer):
    request_queue_size = 1024  # the listen backlog: a burst of new connections is not refused (the default is 5)
    daemon_threads = True


@contextmanager
def tiny_server(fail: str | None = None, slow_first: int = 0, slow_s: float = 0.0):
    """Its URL while it runs (threads of this process)."""
    server = TinyServer(("127.0.0.1", 0), TinyHandler)
    server.fail, server.turns, server.slow_first = fail, itertools.count(), slow_first  # type: ignore[attr-defined]
    server.slow_s = slow_s  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def st_fastapi(model_dir: Path):
    """The sentence-transformers FastAPI peer in its own process (1 torch thread); its URL once /health answers."""
    port = free_port()
    with started([sys.executable, str(PEERS / "st_fastapi.py"), "--model", str(model_dir), "--port", str(port),
                  "--threads", "1"], port) as url:
        yield url

