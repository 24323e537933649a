"""A `corescale serve` in its own process for as long as a caller measures it over HTTP (endpoint=managed's
trials; benchmarks/serve.py): started on a free loopback port and killed if this process dies, its URL read from
its ready line, stopped with SIGTERM (it drains and exits 0); its exit status and the end of its log are kept."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from corescale.machine import instance_env
from corescale.measure.http.api import headers
from corescale.measure.http.contract import FRONT_CPU_METRIC, READY, STOP_S, front_in, url_in

LOG_TAIL_LINES = 3
METRICS_LIMIT = 4 << 20  # bytes of /metrics read, at most


class ServeFailed(RuntimeError):
    """`corescale serve` exited, or was not ready in time: its exit status and the end of its log."""


@dataclass
class Service:
    url: str
    front: str  # where its front runs: "CPUs 2-3" or "shared with the instances"
    process: subprocess.Popen
    log: Path
    exit_code: int | None = None  # once stopped

    def tail(self) -> str:
        return log_tail(self.log)


@contextmanager
def started(source: list[str], log: Path, *options: str, ready_s: float = 600.0) -> Iterator[Service]:
    """`corescale serve SOURCE --port 0 OPTIONS` (SOURCE: a bundle folder, overrides, or a config file); yields it
    once ready. ServeFailed (its exit status and the end of its log) when it exits or is not ready within
    `ready_s`. It runs in its own session on every CPU this process may use, and dies with this process."""
    launch = instance_env.Launch([], dict(os.environ), tuple(sorted(os.sched_getaffinity(0))))
    with open(log, "wb") as stderr:
        process = instance_env.spawn(launch, "corescale.cli", "serve", *source, "--port", "0", "--host", "127.0.0.1",
                                     *options, stdout=subprocess.PIPE, stderr=stderr, text=True)
    service = Service("", "", process, log)
    try:
        ready = wait_ready(process, log, ready_s)
        service.url, service.front = url_in(ready), front_in(ready)
        yield service
    finally:
        service.exit_code, said = stop(process)
        with open(log, "a") as kept:  # its closing lines (the front's CPU, each instance's inputs) after its log
            kept.write(said)


def wait_ready(process: subprocess.Popen, log: Path, timeout_s: float) -> str:
    """Its ready line; ServeFailed when it exits first or is not ready within timeout_s. The lines are read by a
    thread with a blocking readline: select() on a buffered pipe misses a line that arrived with the one before it
    (both in the buffer, nothing left on the pipe). The thread stops at the ready line, so what follows stays in
    the pipe for stop()."""
    assert process.stdout is not None, "started with its stdout piped"
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=read_until_ready, args=(process.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=min(left, 1.0))
        except queue.Empty:
            if process.poll() is not None and lines.empty():
                break
            continue
        if READY in line:
            return line
        if not line:  # its output closed: it is exiting (its status comes a moment later)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            break
    code = process.poll()
    when = f"exited with status {code}" if code is not None else f"was not ready within {timeout_s:g} s"
    raise ServeFailed(f"corescale serve {when} ({log_tail(log)})")


def read_until_ready(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Every line up to the ready line, then "" if the output closed first."""
    for line in iter(stream.readline, ""):
        lines.put(line)
        if READY in line:
            return
    lines.put("")


def log_tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    return "; ".join(lines[-LOG_TAIL_LINES:]) or "no output"


def stop(process: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM (it drains), then SIGKILL to its whole session after STOP_S; its exit status and what it printed
    since its ready line."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        said, _ = process.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        instance_env.kill(process)
        said = ""
    return process.returncode, said or ""


def scraped_front_cpu(url: str) -> float | None:
    """The front's CPU seconds so far (its /metrics FRONT_CPU_METRIC); None when it does not say."""
    try:
        request = urllib.request.Request(url.rstrip("/") + "/metrics", headers=headers())  # the key, when set
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read(METRICS_LIMIT).decode()
    except OSError:
        return None
    return front_cpu_in(text)


def front_cpu_in(exposition: str) -> float | None:
    """FRONT_CPU_METRIC in a /metrics text: the sum over its samples (one per front with `serve --fronts`)."""
    found = [float(line.rsplit(None, 1)[-1]) for line in exposition.splitlines()
             if line.startswith((f"{FRONT_CPU_METRIC} ", f"{FRONT_CPU_METRIC}{{"))]
    return sum(found) if found else None
