"""A result directory is either complete or invisible, even when the writer is SIGKILLed mid-write."""

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from helpers import raw_record

from corescale.errors import UserError
from corescale.record.files import (
    PendingRun,
    iter_run_dirs,
    read_result,
    read_samples,
    write_atomic,
    write_json_atomic,
)

WRITER = r"""
import sys, numpy as np, pandas as pd
from corescale.record.files import PendingRun
root = sys.argv[1]
big = {"payload": ["x" * 100] * 20000}
i = 0
print("ready", flush=True)
while True:
    run = PendingRun(root, f"run-{i}")
    run.write_samples(pd.DataFrame({"latency_ms": np.random.rand(400_000)}))
    run.write_config({"i": i})
    path = run.commit({"status": "ok", "i": i, **big})
    print(path, flush=True)
    i += 1
"""


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.6, 0.9])
@pytest.mark.slow
def test_killed_writer_leaves_no_valid_looking_result(tmp_path, delay):
    """Killed `delay` s after its imports (each case inside the write loop: a commit or a temp dir to look at)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for run in iter_run_dirs(tmp_path):  # whatever is visible is whole
        record = raw_record(run)
        assert record["status"] == "ok" and len(record["payload"]) == 20000
        assert len(read_samples(run)) == 400_000
    committed = {p.name for p in iter_run_dirs(tmp_path)}
    leftovers = [p for p in tmp_path.iterdir() if p.name not in committed]
    assert all(p.name.startswith(".tmp-") for p in leftovers)  # only hidden temp dirs, never a run dir
    assert committed or leftovers, "killed before the first write: the case checked nothing"


def test_discard_and_name_collisions(tmp_path):
    first = PendingRun(tmp_path, "same").commit({"status": "ok"})
    second = PendingRun(tmp_path, "same").commit({"status": "ok"})
    assert first != second and first.exists() and second.exists()
    pending = PendingRun(tmp_path, "gone")
    pending.write_samples(pd.DataFrame({"a": [1]}))
    pending.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same", "same.1"]


def test_json_atomic_and_schema_check(tmp_path):
    write_json_atomic(tmp_path / "x.json", {"a": 1})
    assert (tmp_path / "x.json").read_text().strip().startswith("{")
    with pytest.raises(UserError, match="not a corescale result"):
        read_result(tmp_path / "x.json")
    write_json_atomic(tmp_path / "future.json", {"schema_version": 99})
    with pytest.raises(UserError, match="schema_version 99"):  # a newer corescale's record: refused, one line
        read_result(tmp_path / "future.json")
    with pytest.raises(UserError, match="cannot write figure"):
        write_atomic(tmp_path / "no" / "dir" / "f.png", b"x", "figure")
    assert not (tmp_path / "no").exists()
