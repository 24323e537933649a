"""Nothing left behind: temporary directories of killed processes are collected at the next start (and only
theirs), the CLI reaps the orphans it adopts as a subreaper, and a disk that fills during a commit ends the trial
with one line and no half-written result."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import FAST, LOOP, ROOT, corescale

from corescale.errors import UserError
from corescale.machine import scratch
from corescale.record.files import TMP_PREFIX, PendingRun, iter_run_dirs

# --- temporary directories ------------------------------------------------------------------------------------


def _unused_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # beyond every pid the kernel hands out


def _left(folder: Path, name: str, **changes) -> Path:
    """A directory as a process that died would have left it (its marker, with `changes`)."""
    path = folder / name
    path.mkdir()
    (path / "samples.npz").write_bytes(b"x" * 100)
    if not changes.pop("no_marker", False):
        (path / scratch.OWNER_FILE).write_text(json.dumps({**scratch.owner(), **changes}))
    return path


@pytest.mark.parametrize("changes", [{"pid": _unused_pid()}, {"started": "0"}, {"boot": "an earlier boot"}],
                         ids=["dead-pid", "pid-reused", "rebooted"])
def test_a_dead_owners_directory_is_collected(tmp_path, changes):
    left = _left(tmp_path, "corescale-abc", **changes)
    assert scratch.collect(tmp_path, "corescale-") == [left]
    assert not left.exists()


@pytest.mark.parametrize("changes", [{}, {"host": "another-host", "pid": _unused_pid()},
                                     {"pidns": 1, "pid": _unused_pid()}, {"pid": "12"}, {"no_marker": True}],
                         ids=["alive", "other-host", "other-pid-namespace", "malformed", "no-marker"])
def test_a_directory_whose_owner_lives_or_cannot_be_told_is_kept(tmp_path, changes):
    left = _left(tmp_path, "corescale-abc", **changes)
    assert scratch.collect(tmp_path, "corescale-") == []
    assert (left / "samples.npz").is_file()


def test_only_the_prefix_and_never_through_a_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = _left(elsewhere, "corescale-target", pid=_unused_pid())
    (tmp_path / "corescale-link").symlink_to(target)
    other = _left(tmp_path, "mine-abc", pid=_unused_pid())
    assert scratch.collect(tmp_path, "corescale-") == []
    assert target.is_dir() and other.is_dir()


def test_a_marked_malformed_marker_is_kept(tmp_path):
    left = tmp_path / "corescale-x"
    left.mkdir()
    (left / scratch.OWNER_FILE).write_text("[not a marker")
    assert scratch.collect(tmp_path, "corescale-") == [] and left.is_dir()


def test_scratch_dirs_are_marked_removed_and_collect_first(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    stale = _left(tmp_path, "corescale-peak-old", pid=_unused_pid())
    with scratch.scratch("explain") as work:
        assert work.parent == tmp_path and work.name.startswith("corescale-explain-")
        assert json.loads((work / scratch.OWNER_FILE).read_text())["pid"] == os.getpid()
        assert not stale.exists()
    assert not work.exists()


def test_a_result_directory_left_unfinished_is_collected_by_the_next_commit(tmp_path):
    stale = _left(tmp_path, f"{TMP_PREFIX}run-a-x1", pid=_unused_pid())
    alive = PendingRun(tmp_path, "run-b")  # another writer, still at work: kept
    done = PendingRun(tmp_path, "run-c").commit({"status": "ok"})
    assert not stale.exists() and alive.tmp.is_dir()
    assert not (done / scratch.OWNER_FILE).exists()  # the marker never stays in a committed result


@pytest.mark.slow
def test_sigkilled_writers_leave_what_the_next_start_collects(tmp_path):
    """Real processes killed with SIGKILL mid-write: their result dir and scratch dir are collected by the next
    corescale process, a live one's are not."""
    code = ("import sys, time; from pathlib import Path\n"
            "from corescale.record.files import PendingRun\n"
            "from corescale.machine.scratch import scratch\n"
            "with scratch('x') as work:\n"
            "    pending = PendingRun(Path(sys.argv[1]), 'run')\n"
            "    print(pending.tmp, work, flush=True); time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out")], stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    made = [proc.stdout.readline().split() for proc in procs]
    for proc in procs[:2]:
        proc.kill()
        proc.wait()
    try:
        collected = subprocess.run([sys.executable, "-c", code.replace("time.sleep(600)", "pass"),
                                    str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=60)
        assert collected.returncode == 0, collected.stderr
        for pending, work in made[:2]:
            assert not Path(pending).exists() and not Path(work).exists()
        assert all(Path(p).is_dir() for p in made[2])  # the live one's
    finally:
        procs[2].kill()
        procs[2].wait()


# --- orphans --------------------------------------------------------------------------------------------------

def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _zombies(pids, deadline_s=20.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if all(_state(p) == "Z" for p in pids):
            return True
        time.sleep(0.05)
    return False


def _orphans(count: int) -> list[int]:
    """Processes whose parent exits at once, so that the kernel re-parents them to their subreaper."""
    spawner = subprocess.run(["sh", "-c", f"for i in $(seq {count}); do sleep 0.2 & echo $!; done"],
                             capture_output=True, text=True, timeout=30)
    return [int(p) for p in spawner.stdout.split()]


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 3])
def test_orphans_adopted_by_a_loop_are_reaped(tmp_path, count):
    """A loop's ForkServers make this process a subreaper: the orphans it adopts are waited for at the next trial
    and at its end, not left as zombies."""
    from corescale.measure.forkserver import ForkServers

    with ForkServers(tmp_path) as servers:
        if not servers.enabled:
            pytest.skip("PR_SET_CHILD_SUBREAPER is not available here")
        pids = _orphans(count)
        assert _zombies(pids), "the orphans were not adopted by this process"
        servers.for_repeat(0)  # what the loop calls before each trial
        assert all(_state(p) is None for p in pids)
        late = _orphans(count)
        assert _zombies(late)
    assert all(_state(p) is None for p in late)  # and at the loop's end


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3, -signal.SIGKILL])
def test_a_child_that_a_popen_waits_for_keeps_its_exit_status(tmp_path, code):
    from corescale.measure.forkserver import ForkServers, reap_orphans

    with ForkServers(tmp_path) as servers:
        if not servers.enabled:
            pytest.skip("PR_SET_CHILD_SUBREAPER is not available here")
        known = subprocess.Popen(["sh", "-c", "kill -9 $$" if code < 0 else f"exit {code}"])
        pids = _orphans(2)
        assert _zombies([*pids, known.pid])
        assert sorted(reap_orphans({known.pid})) == sorted(pids)
        assert known.wait(10) == code


# --- a full disk ----------------------------------------------------------------------------------------------

def _uncommitted(out: Path):
    from corescale.measure.runner import failed_result, prepare_trial
    from corescale.overrides import compose
    from corescale.record.trial import Failure

    trial = prepare_trial(compose([*FAST, f"output_dir={out}"]))
    return failed_result(trial, Failure("error", "measured"), None, time.time())


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
@pytest.mark.parametrize("step", ["write_config", "result", "rename"])
def test_a_write_that_fails_during_the_commit_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, code, step):
    from corescale.measure.runner import commit
    from corescale.record import files

    measured = _uncommitted(tmp_path / "out")
    measured.logs = {"instance-0.stderr.log": b"log"}

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    target = {"write_config": (PendingRun, "write_config"), "result": (files, "write_json_atomic"),
              "rename": (files.os, "rename")}[step]
    monkeypatch.setattr(*target, fail)
    with pytest.raises(UserError) as refused:
        commit(measured)
    message = str(refused.value)
    assert "\n" not in message and os.strerror(code) in message and "nothing of it was written" in message
    assert list((tmp_path / "out").iterdir()) == []  # no run dir, no .tmp- dir


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")  # the toy backend measures: the subject is the commit
def test_a_full_disk_during_a_real_commit_ends_the_run_with_one_line(tmp_path):
    """A tiny tmpfs as output_dir, filled but for a few KiB: the trial measures, its commit fails, the CLI says
    so in one line, exits 2 and leaves no half-written result."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as exc:  # the tmpfs is full; any other error is not the test's
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        os.truncate(filler, max(filler.stat().st_size - 8192, 0))  # room for the write probe, not a result
        out = disk / f"out-{uuid.uuid4().hex[:6]}"
        proc = corescale("run", *LOOP, f"output_dir={out}", "--no-progress", timeout=300)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [x for x in proc.stderr.strip().splitlines() if not x.startswith("waiting for another")]
        assert len(lines) == 1, proc.stderr
        (line,) = lines
        assert "cannot write the result" in line and "No space left on device" in line, line
        assert "Traceback" not in proc.stdout + proc.stderr
        assert not out.exists() or (list(iter_run_dirs(out)) == []
                                    and not [p for p in out.iterdir() if p.name.startswith(TMP_PREFIX)])
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_directory_from_before_a_reboot_of_this_host_is_collected(tmp_path):
    left = _left(tmp_path, "corescale-abc", boot="an earlier boot", pid=os.getpid())  # even a pid alive now
    assert scratch.collect(tmp_path, "corescale-") == [left]


# --- durable commits ------------------------------------------------------------------------------------------

@pytest.fixture
def fsynced(monkeypatch):
    """The paths os.fsync is called on (the real fsync still runs): a power loss cannot be staged here."""
    seen: list[Path] = []
    real = os.fsync

    def spy(fd):
        seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


@pytest.mark.parametrize("data", [b"bytes", "text", lambda path: path.write_text("by a callable")],
                         ids=["bytes", "text", "callable"])
def test_every_atomic_write_is_fsynced_with_its_rename(tmp_path, fsynced, data):
    from corescale.record.files import write_atomic

    target = write_atomic(tmp_path / "figure.png", data)
    assert target.read_bytes() and tmp_path in fsynced  # the directory, after the rename
    assert any(p.name.startswith(TMP_PREFIX) and p.suffix == ".png" for p in fsynced)  # the file, before it


def test_a_committed_result_has_every_file_on_disk(tmp_path, fsynced):
    import pandas as pd

    pending = PendingRun(tmp_path, "run")
    (pending.tmp / "instance-0.stderr.log").write_bytes(b"log")
    pending.write_samples(pd.DataFrame({"latency_ms": [1.0, 2.0]}))
    pending.write_config({"model": "bert-tiny"})
    final = pending.commit({"status": "ok"})
    names = {p.name for p in fsynced}
    assert {"instance-0.stderr.log", "samples.parquet", "config.yaml", tmp_path.name} <= names
    assert (final / "samples.parquet").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("children", [0, 1, 3])
def test_a_killed_child_takes_what_it_started_with_it(children):
    """explain's worker on timeout or interrupt, a calibration on its timeout: the whole session goes."""
    from corescale.machine import instance_env

    script = "".join("sleep 600 & echo $!; " for _ in range(children)) + "echo ready; sleep 600"
    process = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    started = [int(process.stdout.readline()) for _ in range(children)]
    assert process.stdout.readline() == "ready\n"
    instance_env.kill(process)
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_state(p) not in (None, "Z") for p in started):
        time.sleep(0.05)
    assert all(_state(p) in (None, "Z") for p in started)  # killed (a zombie until init reaps it)
