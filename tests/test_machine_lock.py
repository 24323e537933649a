"""One machine lock for everything that measures: another process waits for it (and is told who holds it), the
holder's own nested measurements (a trial's calibration) take it again at once, another thread waits its turn."""

import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import ROOT

from corescale.machine.lock import holder, machine_lock

HOLD = """
import sys, time
from pathlib import Path

import pytest
from corescale.machine.lock import machine_lock
with machine_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def hold_in_another_process(path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline() == "held\n"
    return proc


def release(proc) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def test_a_holder_takes_it_again_and_other_threads_wait(tmp_path):
    path = tmp_path / "lock"
    entered = threading.Event()

    def other_thread():
        with machine_lock(path):
            entered.set()

    with machine_lock(path):
        with machine_lock(path) as waited:  # nested: no wait, no deadlock
            assert waited == 0.0
        thread = threading.Thread(target=other_thread, daemon=True)
        thread.start()
        assert not entered.wait(0.5)  # still ours after the nested block ended
    assert entered.wait(10)
    thread.join(10)


@pytest.mark.slow
def test_another_process_waits_and_is_told_the_holder(tmp_path):
    path = tmp_path / "lock"
    proc = hold_in_another_process(path)
    told = []
    try:
        threading.Timer(0.5, release, [proc]).start()
        with machine_lock(path, on_wait=lambda p, who: told.append((p, who))) as waited:
            assert proc.wait(10) == 0  # we got it only once the holder let go
    finally:
        proc.kill()
        proc.wait()
    assert waited >= 0.3
    ((where, who),) = told
    assert where == path and who.startswith(f"pid {proc.pid}: ") and "\n" not in who


@pytest.mark.slow
def test_info_peak_waits_for_the_lock_instead_of_measuring(tmp_path):
    """`info --peak` runs pinned GEMMs on every core: never while another process measures."""
    lock, cache = tmp_path / "lock", tmp_path / "cache"
    env = {**os.environ, "CORESCALE_LOCK": str(lock)}
    holding = hold_in_another_process(lock)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "corescale.cli", "info", "--peak", "--libraries", "numpy",
                                 "--cache-dir", str(cache), "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        line = proc.stderr.readline()  # the one line it prints before it waits
        assert line.startswith("waiting for another corescale trial or measurement on this machine to finish "
                               f"(lock {lock}; held by pid {holding.pid}: "), line
        time.sleep(1)
        assert proc.poll() is None and not cache.exists()  # waiting: nothing measured, nothing cached
        holding.communicate("go\n", timeout=10)
        out, err = proc.communicate(timeout=300)
    finally:
        holding.kill()
        proc.kill()
    assert proc.returncode == 0, err
    assert '"peak"' in out and any(cache.rglob("*.json"))


def test_holder_is_empty_when_nobody_holds_it(tmp_path):
    path = tmp_path / "lock"
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert holder(fd) == ""
    finally:
        os.close(fd)
