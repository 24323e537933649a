"""What the tests share: the real CLI in a fresh process, one trial through the local loop, the records they
write, one two-CPU skip, and the checks the backend tests have in common. Fixtures and hooks stay in conftest.py."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAST = ["model=bert-tiny", "duration=0.5", "min_iterations=5", "calibrate=false", "warmup.max_iterations=5",
        "sequence_length=32"]
QUICK_ANY_MODEL = [*FAST[1:], "quality_samples=32"]  # FAST's settings for the model a test names (a real one)
# The toy backend (tests/toy_backend: pure numpy, a real registered backend run in real worker processes, without
# PyTorch's seconds of imports): what every process started with TOY_ENV inherits, the workers included, is the
# toy's module and its registration. LOOP is FAST on the toy, for the tests of the loop's mechanics (resume,
# signals, locks, failures, repeats, paths), not of a framework.
TOY_ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p),
           "CORESCALE_BACKENDS": "toy_backend"}
LOOP = [*FAST, "backend=toy"]
needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs")


def corescale(*args, env=None, timeout=300):
    """Runs the real CLI in a fresh process; returns CompletedProcess (text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "corescale.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def execute(trial, on_event=None, forkservers=None):
    """One prepared trial through the local trial loop (lock, measure, commit); returns its TrialOutcome.
    forkservers (conftest's fixture): its workers start as forks of servers that imported their framework once."""
    from corescale.trials.local import run_trial

    return run_trial(trial, on_event=on_event, forkservers=forkservers and forkservers.for_repeat(0))


def raw_record(path) -> dict:
    """result.json as written (what a user's script reads)."""
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


def left_after(marker: str, timeout: float = 10) -> list[int]:
    """processes_with_env(marker), polled until none is left or `timeout` s have passed (not a fixed wait)."""
    deadline = time.monotonic() + timeout
    while (left := processes_with_env(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def assert_one_line_error(compose_overrides, overrides, message) -> None:
    """compose(overrides) refuses them with one line holding `message`."""
    from corescale.errors import UserError

    with pytest.raises(UserError) as info:
        compose_overrides(overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


# ---- the backend tests ----------------------------------------------------------------------------------------


def run_record(out_dir, *overrides) -> dict:
    """A real `corescale run` (fresh worker processes); returns its result record, which must be ok."""
    proc = corescale("run", "--no-progress", *FAST, f"output_dir={out_dir}", *overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run,) = list(out_dir.iterdir())
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "ok", record.get("reason")
    return record


def assert_judged(quality: dict) -> None:
    """The record's quality verdict agrees with its own figures: each bound of the gate met unless listed as
    failed, each failed one really missed, and passed only when none failed."""
    assert quality["passed"] is (not quality["failed"]) and set(quality["failed"]) <= set(quality["gate"]), quality
    for bound in quality["gate"]:
        parsed = re.fullmatch(r"(\w+)(>=|<=)([0-9.]+)", bound)
        assert parsed, bound
        name, sign, limit = parsed.groups()
        value = quality_values(quality)[name]
        met = value >= float(limit) if sign == ">=" else value <= float(limit)
        assert met is (bound not in quality["failed"]), (bound, value)


def quality_values(quality: dict) -> dict:
    """What a record's gate may bound (record/sections.py Quality.values): the task's metrics, batch_change, the
    evaluation's metrics and their drops."""
    from corescale.record.sections import Quality

    return Quality.from_dict(quality, "the record's quality").values()


def library_installed(library) -> bool:
    from corescale.errors import UserError
    from corescale.machine import instance_env

    try:
        return bool(instance_env.find_library(library))
    except UserError:
        return False


def load(backend: str, cache_dir, **overrides):
    """The backend loaded in this process on bert-tiny (for checks that need no timed run)."""
    from corescale.backends import create_backend
    from corescale.config import BenchmarkConfig
    from corescale.workload.inputs import make_inputs
    from corescale.workload.models import resolve_model

    spec = resolve_model("bert-tiny")
    inputs = make_inputs(spec, 1, 8, seed=0)
    b = create_backend(backend)
    b.load(spec, BenchmarkConfig(model="bert-tiny", backend=backend, cache_dir=str(cache_dir), **overrides), 1, inputs)
    return b


def error_line(proc) -> str:
    """The CLI's one-line error (other stderr lines, e.g. waiting for the machine's trial lock, are not errors)."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("corescale: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    return errors[0]


def assert_agrees_with_pytorch(record: dict, tight: float = 1e-4) -> None:
    drift = record["drift"]
    assert drift["reference"] == "pytorch" and drift["within_tolerance"], drift
    assert drift["max_rel_error"] < tight and drift["cosine_similarity"] > 0.99999, drift


def assert_threads_honoured(one: dict, two: dict) -> None:
    """`one`'s instance 0 has 1 thread, `two`'s 2 on 2 CPUs: more OS threads; every thread stays inside the
    instance's CPUs and together they may use all of them (not all bound to one, as GNU OpenMP leaves the thread
    that loads torch) — what the tool guarantees whatever the machine's other load, whichever way a framework pins
    its own pool. How busy the threads keep those cores depends on that load: benchmarks/threads.py measures it."""
    cpus = set(two["plan"]["instances"][0]["cpus"])
    assert len(cpus) == 2, two["plan"]  # callers are marked needs_two_cpus
    inst = two["instance_reports"][0]
    assert inst["thread_count"] > one["instance_reports"][0]["thread_count"]
    affinities = [set(allowed) for allowed in inst["thread_affinity"].values()]
    assert all(allowed <= cpus for allowed in affinities), inst["thread_affinity"]
    assert set().union(*affinities) == cpus, inst["thread_affinity"]
