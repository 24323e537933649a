"""One machine lock for everything that measures: another process waits for it (and is told who holds it), the
holder's own nested measurements (a trial's calibration) take it again at once, another thread waits its turn."""

import fcntl
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT

from corescale.errors import UserError
from corescale.machine.lock import holder, machine_lock

pytestmark = pytest.mark.alone  # waits for the machine lock

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
                                 "--precisions", "fp32", "--cache-dir", str(cache), "--json"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    from corescale.measure.calibrate import disturbed

    rows = json.loads(out)["peak"]  # cached, unless other processes used its CPUs meanwhile (a busy machine)
    kept = [entry for row in rows for entry in (row, row.get("bandwidth")) if entry and disturbed(entry) is None]
    assert any(cache.rglob("*.json")) is bool(kept)


def test_holder_is_empty_when_nobody_holds_it(tmp_path):
    path = tmp_path / "lock"
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert holder(fd) == ""
    finally:
        os.close(fd)


# --- a shared machine: whatever another user left at the lock's path ------------------------------------------

def _victim(tmp_path, mode=0o600):
    target = tmp_path / "victim"
    target.write_text("secret\n")
    target.chmod(mode)
    return target


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path, dangling):
    """Following it would chmod (or create) the victim's file: one line instead, the target unchanged."""
    target = _victim(tmp_path)
    path = tmp_path / "lock"
    path.symlink_to(tmp_path / "absent" if dangling else target)
    with pytest.raises(UserError) as refused, machine_lock(path):
        pass
    assert "symbolic link" in str(refused.value) and "CORESCALE_LOCK" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == "secret\n"
    assert not (tmp_path / "absent").exists()


def test_a_symlink_to_a_directory_or_the_lock_itself_is_refused(tmp_path):
    for name, points_to in (("to-dir", tmp_path), ("to-self", tmp_path / "to-self")):
        path = tmp_path / name
        path.symlink_to(points_to)
        with pytest.raises(UserError, match="symbolic link"), machine_lock(path):
            pass


def test_a_fifo_socket_or_directory_at_the_lock_path_is_refused_without_blocking(tmp_path):
    fifo, directory, sock_path = tmp_path / "fifo", tmp_path / "dir", tmp_path / "sock"
    os.mkfifo(fifo)
    directory.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for path, kind in ((fifo, "a FIFO"), (directory, "a directory"), (sock_path, "a socket")):
            with pytest.raises(UserError) as refused, machine_lock(path):
                pass
            assert f"is {kind}, not a regular file" in str(refused.value)
    finally:
        sock.close()


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o444])
def test_an_existing_lock_file_is_used_as_it_is(tmp_path, mode):
    """Found there (another user's, any mode it can be read with): locked, never chmod'ed."""
    path = tmp_path / "lock"
    path.write_text("")
    path.chmod(mode)
    with machine_lock(path) as waited:
        assert waited < 5
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_a_lock_created_here_is_shared_with_every_user_whatever_the_umask(tmp_path):
    path = tmp_path / "lock"
    old = os.umask(0o077)
    try:
        with machine_lock(path):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_lock_file_still_locks(tmp_path):
    nobody = pwd.getpwnam("nobody")
    path = tmp_path / "lock"
    path.write_text("")
    path.chmod(0o644)
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    with machine_lock(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # really held: another open file description cannot take it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert path.stat().st_uid == nobody.pw_uid and stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_a_lock_that_this_user_cannot_read_says_what_to_do(tmp_path):
    """Another user's 0600 lock: one line naming its owner and the two ways out (run as `nobody`)."""
    shared = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own folders are private to root
    shared.chmod(0o755)
    try:
        _unreadable_lock_as_nobody(shared / "lock")
    finally:
        shutil.rmtree(shared)


def _unreadable_lock_as_nobody(path):
    path.write_text("")
    path.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    code = ("import sys; from pathlib import Path; from corescale.errors import UserError\n"
            "from corescale.machine.lock import machine_lock\n"
            "try:\n    machine_lock(Path(sys.argv[1])).__enter__()\nexcept UserError as e:\n    print(e)\n")
    for python in (sys.executable, "/usr/bin/python3"):  # the first that `nobody` may run
        try:
            out = subprocess.run([python, "-c", code, str(path)], capture_output=True, text=True, cwd="/",
                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, user=nobody.pw_uid, timeout=60)
            break
        except PermissionError:
            continue
    else:
        pytest.skip("no Python that the user nobody may run")
    if "Error" in out.stderr:
        pytest.skip(f"the checkout cannot be read as nobody: {out.stderr.strip().splitlines()[-1]}")
    assert out.stdout.count("\n") == 1, out.stderr
    assert "owner uid 0, mode 0600" in out.stdout and "chmod 644" in out.stdout and "CORESCALE_LOCK" in out.stdout


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")  # the toy backend measures: the subject is the lock
def test_a_ray_nodes_trial_waits_for_that_machines_lock(tmp_path, monkeypatch):
    """The Ray task (run_on_node, called here as Ray calls it) holds the node's machine lock while it measures: a
    local run or `info --peak` there is never measured beside it."""
    from helpers import LOOP

    from corescale.machine import lock
    from corescale.measure.runner import prepare_trial
    from corescale.overrides import compose
    from corescale.trials.ray import run_on_node

    path = tmp_path / "lock"
    monkeypatch.setattr(lock, "LOCK_PATH", path)
    trial = prepare_trial(compose([*LOOP, f"output_dir={tmp_path / 'out'}"]))
    holding = hold_in_another_process(path)
    done = []
    task = threading.Thread(target=lambda: done.append(run_on_node(trial, {})), daemon=True)
    try:
        task.start()
        time.sleep(1.5)
        assert task.is_alive() and not done  # waiting: nothing measured
        release(holding)
        task.join(240)
    finally:
        holding.kill()
        holding.wait()
    (measured,) = done
    assert measured.record.ok, measured.record.reason
    assert measured.record.lock_wait_s >= 1.0
