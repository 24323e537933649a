"""Faults of real instances: killed, stopped, overrunning, raising. The run fails, nothing survives it. The
instances run the toy backend (LOOP, a real one in real processes) where the subject is the launcher, not a
framework; the overrun needs a warm-up that cannot settle in time, which PyTorch's slower calls give."""

import dataclasses
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from helpers import FAST, LOOP, corescale, execute, needs_two_cpus, processes_with_env

from corescale.measure.launcher import Launcher
from corescale.measure.runner import prepare_trial
from corescale.overrides import compose
from corescale.record.files import read_result, read_samples

pytestmark = [pytest.mark.slow, needs_two_cpus, pytest.mark.alone]  # bounds how soon survivors stop
TWO = ["instances=2", "cores_per_instance=1", "timeout=120"]


def process_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group (each worker leads its own)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


class Saboteur:
    """on_event hook: records worker pids and sends signals when given events arrive."""

    def __init__(self, actions):
        self.actions = actions  # {(instance, event kind): (target instance, signal)}
        self.pids: dict[int, int] = {}
        self.fired: dict[tuple, float] = {}

    def __call__(self, instance, event):
        if instance >= 0:
            self.pids[instance] = event["pid"]
        key = (instance, event["event"])
        if key in self.actions and key not in self.fired:
            target, sig = self.actions[key]
            os.kill(self.pids[target], sig)
            self.fired[key] = time.monotonic()


def trial(tmp_path, *overrides):
    """Two toy instances (the test registers the toy here and for its workers: toy_everywhere)."""
    return prepare_trial(compose([*LOOP, f"output_dir={tmp_path}", *TWO, *overrides]))


@pytest.mark.usefixtures("toy_everywhere")
def test_killed_instance_fails_the_run_and_stops_the_others(tmp_path):
    saboteur = Saboteur({(1, "progress"): (1, signal.SIGKILL)})  # first progress = inside the window
    outcome = execute(trial(tmp_path, "duration=20"), on_event=saboteur)
    stopped_after = time.monotonic() - saboteur.fired[(1, "progress")]
    record = read_result(outcome.path)
    assert record.status == "failed" and record.valid is False
    failure = record.failure
    assert failure.kind == "signal" and failure.instance == 1 and failure.signal == "SIGKILL"
    assert failure.exit_code == -9
    assert record.reason == "instance 1: killed by SIGKILL while running"
    assert isinstance(failure.stderr_tail, str)
    assert record.partial.states["0"]["state"] == "running"  # instance 0 was stopped mid-window
    assert record.partial.finished_instances == []
    assert stopped_after < 10  # not the 20 s window: the survivors were stopped
    assert all(not process_group(pid) for pid in saboteur.pids.values()), "orphan worker processes"


@pytest.mark.usefixtures("toy_everywhere")
def test_partial_samples_of_finished_instances_are_kept_but_invalid(tmp_path):
    # instance 1 is frozen in its window, so instance 0 finishes first; then instance 1 is killed
    saboteur = Saboteur({(1, "progress"): (1, signal.SIGSTOP), (0, "result"): (1, signal.SIGKILL)})
    outcome = execute(trial(tmp_path), on_event=saboteur)
    record = read_result(outcome.path)
    assert record.status == "failed" and record.valid is False
    assert record.failure.instance == 1 and record.failure.signal == "SIGKILL"
    partial = record.partial
    assert partial.finished_instances == [0]
    assert partial.metrics.samples_in_window > 0
    assert record.metrics is None  # nothing that reads metrics mistakes it for a valid result
    samples = read_samples(outcome.path)
    finished = samples[~samples["streamed"].fillna(False).astype(bool)]
    assert set(finished["instance"]) == {0} and finished["in_window"].sum() > 0
    streamed = samples[samples["streamed"].fillna(False).astype(bool)]  # what the killed instance had streamed
    assert set(streamed["instance"]) <= {1} and not streamed["in_window"].any()
    assert partial.streamed_calls.get(1, partial.streamed_calls.get("1", 0)) == len(streamed)
    assert all(not process_group(pid) for pid in saboteur.pids.values())


@pytest.mark.usefixtures("toy_everywhere")
def test_instance_raising_an_error_reports_its_traceback(tmp_path):
    t = trial(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    specs = t.instance_specs(work)
    specs[1] = dataclasses.replace(specs[1], samples_path=str(tmp_path / "missing-dir" / "samples.npz"))  # fails
    outcome = Launcher(work, 120).run(specs, t.cfg, t.model)  # after its window
    failure = outcome.failure
    assert failure.instance == 1 and failure.kind == "error"
    assert failure.reason.startswith("instance 1:") and "missing-dir" in failure.reason
    assert "Traceback" in failure.traceback
    assert all(not process_group(state["pid"]) for state in outcome.states.values())


def test_overrunning_the_timeout_fails_the_cli_with_no_survivors(tmp_path):
    marker = f"CORESCALE_TEST_MARK_{uuid.uuid4().hex}"
    started = time.monotonic()
    # a warm-up that never settles (and may take 1000 s) runs into the 8 s timeout
    never_stable = ["warmup.min_iterations=100000", "warmup.max_iterations=100000", "warmup.max_seconds=1000"]
    fast = [o for o in FAST if not o.startswith(("warmup.", "duration="))]
    proc = corescale("run", *fast, *TWO[:2], *never_stable, "duration=1", "timeout=8", f"output_dir={tmp_path}",
                     "--no-progress", env={marker: "1"}, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "timed out after 8 s" in proc.stderr
    assert time.monotonic() - started < 40
    assert processes_with_env(marker) == []
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    record = read_result(run_dir)
    assert record.status == "failed" and record.failure.kind == "timeout" and record.failure.instance in (0, 1)
