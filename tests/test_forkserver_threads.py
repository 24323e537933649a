"""A fork server whose imports left threads running that are not known to be fork-safe is not forked from: its
launch starts fresh. OpenBLAS's workers are known fork-safe (numpy's import starts them)."""

import os
import sys

import pytest
from helpers import ROOT

from corescale.measure.forkserver import ForkServers

pytestmark = pytest.mark.slow  # starts fork servers

STARTS_A_THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
STARTS_TWO = STARTS_A_THREAD * 2


@pytest.mark.parametrize("modules, unknown", [
    (["numpy"], 0),  # numpy's OpenBLAS workers: known fork-safe
    (["json"], 0),  # no thread at all
    (["starts_a_thread"], 1),
    (["numpy", "starts_two"], 2),
])
def test_threads_not_known_fork_safe_stop_forking(tmp_path, modules, unknown):
    (tmp_path / "starts_a_thread.py").write_text(STARTS_A_THREAD)
    (tmp_path / "starts_two.py").write_text(STARTS_TWO)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    with ForkServers(tmp_path) as servers:
        if not servers.enabled:
            pytest.skip("this kernel does not let a process become a child subreaper")
        server = servers._start([], env, sorted(os.sched_getaffinity(0)), modules)
        assert server is not None
        try:
            safe = server.wait_ready()
            assert server.threads is not None and server.unknown_threads == unknown
            assert safe == (unknown == 0)
        finally:
            server.close()


JEMALLOC = [p for p in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", *(str(q) for q in ROOT.glob(
    ".venv/lib/python*/site-packages/ray/core/libjemalloc.so"))) if os.path.exists(p)]


@pytest.mark.skipif(not JEMALLOC, reason="no jemalloc here")
def test_jemalloc_background_threads_are_known_fork_safe(tmp_path):
    (tmp_path / "allocates.py").write_text("import time\nx = [bytearray(100000) for _ in range(2000)]\ndel x\n"
                                           "time.sleep(0.3)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LD_PRELOAD": JEMALLOC[0],
           "MALLOC_CONF": "background_thread:true"}
    with ForkServers(tmp_path) as servers:
        if not servers.enabled:
            pytest.skip("this kernel does not let a process become a child subreaper")
        server = servers._start([], env, sorted(os.sched_getaffinity(0)), ["allocates"])
        try:
            assert server.wait_ready() and server.threads >= 2 and server.unknown_threads == 0
        finally:
            server.close()


def test_an_unsafe_server_is_closed_and_its_launch_starts_fresh(tmp_path, monkeypatch):
    (tmp_path / "starts_a_thread.py").write_text(STARTS_A_THREAD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    monkeypatch.setattr("corescale.measure.forkserver.server_modules", lambda backend, model_type: ["starts_a_thread"])
    with ForkServers(tmp_path) as servers:
        if not servers.enabled:
            pytest.skip("this kernel does not let a process become a child subreaper")
        cpus = sorted(os.sched_getaffinity(0))
        assert servers.spawn([], env, cpus, "pytorch", "bert", tmp_path / "job.json", tmp_path / "err.log") is None
        assert list(servers.servers.values()) == [None]  # this launch starts fresh from now on
        assert servers.spawn([], env, cpus, "pytorch", "bert", tmp_path / "job.json", tmp_path / "err.log") is None
    assert sys.modules.get("starts_a_thread") is None  # imported by the server only
