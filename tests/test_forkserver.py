"""A loop of several trials forks its workers from pre-imported servers: each worker is pinned and configured
exactly as a fresh one, is this process's child, and nothing outlives the loop or a killed CLI."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import FAST, LOOP, ROOT, left_after, needs_two_cpus, processes_with_env

from corescale.measure.forkserver import ForkServers
from corescale.overrides import expand_sweep
from corescale.trials.local import Listener
from corescale.trials.sweep import plan_sweep, run_sweep

pytestmark = needs_two_cpus


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise KeyError(name)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.slow
def test_forked_workers_are_pinned_configured_children(tmp_path):
    seen = {}

    class Probe(Listener):
        def worker_event(self, item, instance, event):
            if event["event"] == "loaded":  # the worker is alive, waiting for its siblings' warm-up signal
                pid = event["pid"]
                seen[(item.number, instance)] = (status_field(pid, "PPid"), status_field(pid, "Cpus_allowed_list"),
                                                 environ(pid).get("OMP_NUM_THREADS"), os.getsid(pid) == pid)

    planned = plan_sweep(expand_sweep([*FAST, "instances=2", "cores_per_instance=1", "batch_size=1,2",
                                       f"output_dir={tmp_path}"]))
    state = run_sweep(planned, Probe(), resume=False)
    assert [row.status for row in state.rows] == ["ok", "ok"]
    servers = {}
    for row in state.rows:
        for inst in row.record.instance_reports:
            assert inst.launch["forked_from"] is not None
            imported = inst.imports  # torch was imported by the server, once; the fork found it there
            assert imported is not None and imported.fork_server_seconds is not None
            assert imported.seconds["torch"] < 0.01 < imported.fork_server_seconds["torch"]
            servers.setdefault(inst.instance, set()).add(inst.launch["forked_from"])
    assert all(len(pids) == 1 for pids in servers.values())  # the second trial reused each instance's server
    assert len({pid for pids in servers.values() for pid in pids}) == 2  # one server per instance launch
    specs = {spec.id: spec for spec in state.rows[0].record.specs}
    for (_, instance), (ppid, cpus, threads, own_session) in seen.items():
        assert int(ppid) == os.getpid() and own_session  # adopted by the loop's process, in its own session
        assert cpus == ",".join(map(str, specs[instance].cpus)) and threads == "1"
    for pid in {p for pids in servers.values() for p in pids}:
        assert not Path(f"/proc/{pid}").exists() or status_field(pid, "State").startswith("Z")


def test_tensorflow_is_never_forked(tmp_path):
    with ForkServers(tmp_path) as servers:
        assert servers.spawn([], dict(os.environ), [0], "tensorflow", "bert", tmp_path / "job.json",
                             tmp_path / "err.log") is None
        assert servers.servers == {}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")  # the toy is forked from its server as PyTorch is; it starts sooner
def test_killed_sweep_leaves_no_worker_or_server(tmp_path, sig):
    marker = f"CORESCALE_FORKSERVER_TEST_{uuid.uuid4().hex}"
    env = {**os.environ, marker: "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "corescale.cli", "run", "-m", *LOOP, "duration=60",
                             "batch_size=1,2", f"output_dir={tmp_path / 'out'}", "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if list(tmp_path.glob("corescale-*/samples-*.npz.stream")):  # the first trial's window has begun
            break
        time.sleep(0.1)
    assert len(processes_with_env(marker)) >= 3  # the CLI, the fork server and the worker forked from it
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert left_after(marker) == []
