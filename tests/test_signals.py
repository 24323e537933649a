"""Killing the CLI (SIGTERM, SIGHUP, SIGINT) mid-window stops every worker, removes its temp directories, records
the trial as interrupted with the calls the instances had streamed, and exits 130 with one line. The runs measure
the toy backend (LOOP) in real worker processes: the subject is the loop's handling of signals, not a framework."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pandas as pd
import pytest
from helpers import LOOP, ROOT, left_after, needs_two_cpus, processes_with_env

pytestmark = [pytest.mark.slow, needs_two_cpus, pytest.mark.usefixtures("toy_everywhere")]


def default_signals():
    """The run starts as from a terminal: a suite started under `nohup … &` ignores SIGHUP and SIGINT, and an
    ignored signal is inherited (corescale then keeps it ignored, as nohup asks)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_mid_window_leaves_nothing_behind(tmp_path, sig):
    marker = f"CORESCALE_SIGNAL_TEST_{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    env = {**os.environ, marker: "1", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "corescale.cli", "run", *LOOP, "duration=60", "instances=2",
                             "cores_per_instance=1", f"output_dir={out}", "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    deadline = time.monotonic() + 120
    streams = []
    while time.monotonic() < deadline and proc.poll() is None:  # wait for the window: calls streamed to disk
        streams = [p for p in tmp.glob("corescale-*/samples-*.npz.stream") if p.stat().st_size > 0]
        if len(streams) == 2:
            break
        time.sleep(0.1)
    assert len(streams) == 2, "the run never reached its window"
    time.sleep(1.5)  # a second of progress: the next stream flush
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert left_after(marker) == []  # no worker outlived the CLI
    assert not [p for p in tmp.glob("corescale-*") if p.is_dir()]  # its temp directories are gone
    (run,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "failed" and record["failure"]["kind"] == "interrupted"
    assert signal.Signals(sig).name in record["reason"]
    assert sum(record["partial"]["streamed_calls"].values()) > 0
    samples = pd.read_parquet(run / "samples.parquet")
    assert samples["streamed"].fillna(False).astype(bool).sum() == sum(record["partial"]["streamed_calls"].values())


def test_workers_die_with_a_killed_parent(tmp_path):
    """SIGKILL cannot be handled: the kernel's parent-death signal stops the workers instead."""
    marker = f"CORESCALE_SIGNAL_TEST_{uuid.uuid4().hex}"
    env = {**os.environ, marker: "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "corescale.cli", "run", *LOOP, "duration=60",
                             f"output_dir={tmp_path / 'out'}", "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob("corescale-*/samples-*.npz.stream")):
        time.sleep(0.1)  # the worker's window has begun (a count of processes can catch a short-lived probe)
    assert len(processes_with_env(marker)) >= 2  # the CLI and its worker
    proc.kill()
    proc.wait()
    assert left_after(marker) == []


def test_nohup_keeps_sighup_ignored_and_sigterm_still_stops_the_run(tmp_path):
    """Started with SIGHUP ignored (as `nohup` starts it): a SIGHUP mid-window changes nothing, SIGTERM stops it
    as ever (exit 130, the trial recorded as interrupted by SIGTERM)."""
    marker = f"CORESCALE_SIGNAL_TEST_{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    env = {**os.environ, marker: "1", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "corescale.cli", "run", *LOOP, "duration=60",
                             f"output_dir={out}", "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 240
        streams = []
        while time.monotonic() < deadline and proc.poll() is None and not streams:
            streams = [p for p in tmp.glob("corescale-*/samples-*.npz.stream") if p.stat().st_size > 0]
            time.sleep(0.1)
        assert streams, "the run never reached its window"
        proc.send_signal(signal.SIGHUP)
        time.sleep(2)
        assert proc.poll() is None, proc.communicate()[1]  # still measuring
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # SIGHUP cannot end it: never left behind by a failed assertion
        proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err
    (run,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    assert "SIGTERM" in json.loads((run / "result.json").read_text())["reason"]
    assert left_after(marker) == []
