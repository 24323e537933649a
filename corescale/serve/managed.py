"""A `corescale serve` in its own process for as long as a caller measures it over HTTP (benchmarks/serve.py;
the tune's `endpoint=managed`): started on a free loopback port, its URL read from its ready line, stopped
with SIGTERM (it drains and exits 0)."""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

READY = "listening on http://"
STOP_S = 90.0


@contextmanager
def started(source: list[str], log: Path, *options: str, ready_s: float = 600.0) -> Iterator[str]:
    """`corescale serve SOURCE --port 0 OPTIONS` (SOURCE: a bundle folder, or overrides); yields its base URL.
    RuntimeError with the end of its log when it exits or is not ready within `ready_s`."""
    with open(log, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "corescale.cli", "serve", *source, "--port", "0",
                                    "--host", "127.0.0.1", *options], stdout=subprocess.PIPE, stderr=stderr,
                                   text=True, start_new_session=True)
    try:
        yield wait_ready(process, log, ready_s)
    finally:
        stop(process)


def wait_ready(process: subprocess.Popen, log: Path, timeout_s: float) -> str:
    assert process.stdout is not None, "started with its stdout piped"
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if selector.select(timeout=1.0):
            line = process.stdout.readline()
            if not line:
                break
            if READY in line:
                return "http://" + line.split(READY, 1)[1].strip()
        elif process.poll() is not None:
            break
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    raise RuntimeError(f"corescale serve did not start ({'; '.join(tail) or 'no output'})")


def stop(process: subprocess.Popen) -> int:
    """SIGTERM (it drains), then SIGKILL after STOP_S; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
    return process.returncode
