"""Start a peer server as its own process and wait until it answers (benchmarks/http_peers.py and the tests)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def started(command: list[str], port: int, health: str = "/health", wait_s: float = 300.0):
    """The server `command` starts, until the block ends; its URL once GET `health` answers."""
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                urllib.request.urlopen(url + health, timeout=5).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    assert process.stderr is not None
                    raise RuntimeError(f"{command[0]} did not start: {process.stderr.read()[-1500:]!r}") from None
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
