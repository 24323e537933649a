"""An explain worker that overruns `timeout` is killed with every process of its session, and the CLI says so
in one line (no traceback), leaving no process behind."""

import time
import uuid

import pytest
from helpers import FAST, corescale, processes_with_env

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # starts the CLI and its worker; bounds its time


def test_an_explain_that_overruns_its_timeout_is_one_line(tmp_path):
    marker = f"CORESCALE_TEST_MARK_{uuid.uuid4().hex}"
    fast = [o for o in FAST if not o.startswith(("warmup.", "duration="))]
    never_stable = ["warmup.min_iterations=100000", "warmup.max_iterations=100000", "warmup.max_seconds=1000"]
    started = time.monotonic()
    proc = corescale("explain", *fast, *never_stable, "duration=1", "timeout=8", f"output_dir={tmp_path}",
                     env={marker: "1"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("corescale: error: ")]
    assert errors == proc.stderr.splitlines()[-1:] and "Traceback" not in proc.stderr  # after its progress line
    assert "did not finish within timeout=8 s" in errors[0]
    assert time.monotonic() - started < 60
    assert processes_with_env(marker) == []
