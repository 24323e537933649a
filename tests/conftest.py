import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAST = ["model=bert-tiny", "duration=0.5", "min_iterations=5", "calibrate=false", "warmup.max_iterations=5",
        "sequence_length=32"]


def corescale(*args, env=None, timeout=300):
    """Runs the real CLI in a fresh process; returns CompletedProcess (text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "corescale.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


@pytest.fixture
def out_dir(tmp_path):
    return tmp_path / "outputs"


def execute(trial, on_event=None):
    """One prepared trial through the local trial loop (lock, measure, commit); returns its TrialOutcome."""
    from corescale.trials.local import run_trial

    return run_trial(trial, on_event=on_event)


def raw_record(path) -> dict:
    """result.json as written (what a user's script reads)."""
    import json

    return json.loads((Path(path) / "result.json").read_text())


def processes_with_env(marker: str) -> list[int]:
    """Live processes whose environment holds `marker` (a test's way to find every process it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def assert_one_line_error(compose_overrides, overrides, message) -> None:
    """compose(overrides) refuses them with one line holding `message`."""
    import pytest

    from corescale.errors import UserError

    with pytest.raises(UserError) as info:
        compose_overrides(overrides)
    assert message in str(info.value) and "\n" not in str(info.value)
