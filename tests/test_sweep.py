"""Sweeps through the real CLI: resume, failures recorded, SIGKILL mid-sweep, concurrent writers. The loop's
mechanics, not a framework's: the trials measure the toy backend (LOOP) in real worker processes."""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest
from helpers import FAST, LOOP, ROOT, corescale

from corescale.analysis import store
from corescale.record.files import PendingRun, iter_run_dirs, read_result
from corescale.trials.sweep import plan_sweep

# every test here starts processes; they and this one (which reads the records) know the toy backend
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("toy_everywhere")]


def run_dirs(root):
    return list(iter_run_dirs(root)) if root.exists() else []


def expected_keys(overrides):
    from corescale.overrides import expand_sweep

    return {item.key for item in plan_sweep(expand_sweep(overrides))}


def test_failed_trial_is_recorded_and_the_sweep_goes_on(out_dir):
    # the toy refuses to load inside the worker when told to: a real failure found by the worker, with a reason
    # (a timeout would not do: it is not part of the trial key, so both trials would be one)
    grid = [*LOOP, "backend.refuse=no,broken", f"output_dir={out_dir}"]
    proc = corescale("run", "-m", *grid, "--no-progress")
    assert proc.returncode == 1
    assert "1 measured ok, 1 failed" in proc.stdout and "the toy backend refuses to load: broken" in proc.stderr
    records = {r.config.backend.refuse: r for r in map(read_result, run_dirs(out_dir))}
    assert records["broken"].status == "failed" and "refuses to load: broken" in records["broken"].reason
    assert records["no"].status == "ok"
    table = store.load(out_dir).frame
    assert sorted(table["status"]) == ["failed", "ok"]

    rerun = corescale("run", "-m", *grid, "--no-progress")  # the failure is redone, the success is not
    assert rerun.returncode == 1 and "0 measured ok, 1 failed, 1 skipped" in rerun.stdout
    assert len(store.load(out_dir).frame) == 2  # latest attempt per key
    assert len(store.load(out_dir, latest=False).frame) == 3  # every attempt with --all
    listed = corescale("results", str(out_dir), "--all", "--csv", "-")
    assert listed.returncode == 0 and len(listed.stdout.strip().splitlines()) == 1 + 3


def test_fail_fast_stops_at_first_failure(out_dir):
    grid = ["backend.refuse=broken,no"]  # the first refuses to load in its worker: it fails
    proc = corescale("run", "-m", *LOOP, *grid, f"output_dir={out_dir}", "--no-progress", "--fail-fast")
    assert proc.returncode == 1 and "--fail-fast" in proc.stderr
    assert [r.status for r in map(read_result, run_dirs(out_dir))] == ["failed"]


def test_sigkill_mid_sweep_then_resume_gives_exactly_the_grid(out_dir):
    grid = [*LOOP, "batch_size=1,2", f"output_dir={out_dir}"]
    command = [sys.executable, "-m", "corescale.cli", "run", "-m", *grid, "--no-progress"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not run_dirs(out_dir) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(run_dirs(out_dir))
    assert finished == 1  # killed during the second trial

    resumed = corescale("run", "-m", *grid, "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert "1 measured ok, 0 failed, 1 skipped" in resumed.stdout
    every = store.load(out_dir, latest=False).frame
    assert len(every) == 2 and every["key"].is_unique  # no duplicates
    assert set(every["key"]) == expected_keys(grid) and (every["status"] == "ok").all()
    assert sorted(every["batch_size"]) == [1, 2]

    again = corescale("run", "-m", *grid, "--no-progress")  # all done: nothing is measured again
    assert again.returncode == 0 and "0 measured ok, 0 failed, 2 skipped" in again.stdout
    assert len(run_dirs(out_dir)) == 2


def test_two_sweeps_into_one_root_lose_nothing(out_dir):
    grids = ([*LOOP, "batch_size=1", f"output_dir={out_dir}"], [*LOOP, "batch_size=2", f"output_dir={out_dir}"])
    procs = [subprocess.Popen([sys.executable, "-m", "corescale.cli", "run", "-m", *grid, "--no-progress"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for grid in grids]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    table = store.load(out_dir).frame
    assert sorted(table["batch_size"]) == [1, 2] and (table["status"] == "ok").all()
    # trials never overlapped in time: the machine lock serialises them across processes
    spans = sorted((r.finished_at - r.elapsed_s, r.finished_at) for r in map(read_result, run_dirs(out_dir)))
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_the_same_sweep_twice_at_once_commits_each_key_once(out_dir):
    """Both plan every trial; the one that gets the machine lock second finds each result committed meanwhile
    (re-checked under the lock, and again under the commit lock) and measures nothing."""
    grid = [*LOOP, "batch_size=1,2", f"output_dir={out_dir}"]
    procs = [subprocess.Popen([sys.executable, "-m", "corescale.cli", "run", "-m", *grid, "--no-progress"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(out)
    keys = [(r.trial_key, r.repeat) for r in map(read_result, run_dirs(out_dir))]
    assert len(keys) == 2 and len(set(keys)) == 2, keys
    assert "".join(outs).count("skipped (valid result exists") == 2


def _commit_many(root, count):
    for number in range(count):
        pending = PendingRun(root, "same-name")
        pending.commit({"status": "ok", "config": {}, "n": f"{os.getpid()}-{number}"})


def test_concurrent_commits_of_one_run_name_never_clobber(tmp_path):
    with ProcessPoolExecutor(4, mp_context=get_context("fork")) as pool:
        list(pool.map(_commit_many, [tmp_path] * 4, [25] * 4))
    dirs = run_dirs(tmp_path)
    assert len(dirs) == 100
    assert len({json.loads((d / "result.json").read_text())["n"] for d in dirs}) == 100
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_unknown_sweep_key_is_one_clear_line(out_dir):
    proc = corescale("run", "-m", *FAST, "batch_sise=1,2", f"output_dir={out_dir}")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown key 'batch_sise'" in proc.stderr
    assert not out_dir.exists()


def test_resume_counts_only_this_machines_results_unless_asked(out_dir, tmp_path):
    first = corescale("run", "-m", *LOOP, f"output_dir={out_dir}", "--no-progress")
    assert first.returncode == 0, first.stderr
    (run,) = run_dirs(out_dir)
    record = json.loads((run / "result.json").read_text())
    record["environment"]["cpu"]["model"] = "a CPU this machine is not"
    (run / "result.json").write_text(json.dumps(record))
    foreign = corescale("run", "-m", *LOOP, f"output_dir={out_dir}", "--no-progress", "--accept-foreign")
    assert foreign.returncode == 0 and "0 measured ok, 0 failed, 1 skipped" in foreign.stdout
    again = corescale("run", "-m", *LOOP, f"output_dir={out_dir}", "--no-progress")
    assert again.returncode == 0 and "1 measured ok, 0 failed, 0 skipped" in again.stdout
    assert len(run_dirs(out_dir)) == 2


def test_a_result_measured_under_another_inherited_environment_is_measured_again(out_dir, monkeypatch):
    """An allocator or OpenMP variable inherited from the shell changes what runs: its results resume only under
    the same values (and results without any resume only without)."""
    def sweep(**env):
        proc = corescale("run", "-m", *LOOP, f"output_dir={out_dir}", "--no-progress", env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    for name in ("OMP_SCHEDULE", "KMP_BLOCKTIME"):  # whatever the developer's shell sets
        monkeypatch.delenv(name, raising=False)
    assert "1 measured ok, 0 failed, 0 skipped" in sweep()
    assert "1 measured ok, 0 failed, 0 skipped" in sweep(OMP_SCHEDULE="static")
    assert "0 measured ok, 0 failed, 1 skipped" in sweep(OMP_SCHEDULE="static")
    assert "1 measured ok, 0 failed, 0 skipped" in sweep(OMP_SCHEDULE="dynamic")
    assert "1 measured ok, 0 failed, 0 skipped" in sweep(OMP_SCHEDULE="static", KMP_BLOCKTIME="0")
    assert "0 measured ok, 0 failed, 1 skipped" in sweep(OMP_NUM_THREADS="7")  # set per instance: no matter
