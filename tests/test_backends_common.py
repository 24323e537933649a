"""Shared helpers for the per-framework backend tests, and the missing-extra contract for every framework."""

import json
import subprocess
import sys

import pytest
from conftest import FAST, ROOT, corescale

pytestmark = pytest.mark.slow  # every test here starts processes


def run_record(out_dir, *overrides) -> dict:
    """A real `corescale run` (fresh worker processes); returns its result record, which must be ok."""
    proc = corescale("run", "--no-progress", *FAST, f"output_dir={out_dir}", *overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run,) = list(out_dir.iterdir())
    record = json.loads((run / "result.json").read_text())
    assert record["status"] == "ok", record.get("reason")
    return record


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


def busy_cores(record: dict) -> float:
    """CPU seconds per wall second of instance 0 during the timed window."""
    inst = record["instances"][0]
    return inst["cpu_seconds"] / inst["wall_seconds"]


def assert_agrees_with_pytorch(record: dict, tight: float = 1e-4) -> None:
    drift = record["drift"]
    assert drift["reference"] == "pytorch" and drift["within_tolerance"], drift
    assert drift["max_rel_error"] < tight and drift["cosine_similarity"] > 0.99999, drift


def assert_threads_honoured(one: dict, two: dict, busy: bool = True) -> None:
    """`one`'s instance 0 has 1 thread, `two`'s 2: more OS threads; every thread stays inside the instance's CPUs
    and together they use all of them (not all bound to one, as GNU OpenMP leaves the thread that loads torch) —
    what the tool guarantees, whichever way a framework pins its own pool; on a quiet machine more busy cores."""
    cpus = set(two["plan"]["instances"][0]["cpus"])
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    inst = two["instances"][0]
    assert inst["thread_count"] > one["instances"][0]["thread_count"]
    affinities = [set(allowed) for allowed in inst["thread_affinity"].values()]
    assert all(allowed <= cpus for allowed in affinities), inst["thread_affinity"]
    assert set().union(*affinities) == cpus, inst["thread_affinity"]
    if busy and not (one["metrics"]["contaminated"] or two["metrics"]["contaminated"]):
        assert busy_cores(two) > 1.3 * busy_cores(one), (busy_cores(one), busy_cores(two))


# A meta-path finder placed before the real one hides frameworks from importlib.util.find_spec, which is what
# the backend registry asks; the CLI must then name the extra to install, in one line, exit 2. One process
# runs every case (the CLI's start-up is the slow part).
BLOCKER = """
import contextlib, importlib.machinery, io, json, sys
BLOCKED = set()
class Hidden(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [Hidden if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from corescale.cli import main
results = []
for hidden, args in json.loads(sys.argv[1]):
    BLOCKED.clear(); BLOCKED.add(hidden)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""
CASES = [  # backend override, hidden module, extra named
    ("backend=onnxruntime", "onnxruntime", "onnxruntime"),
    ("backend=onnxruntime", "onnx", "onnxruntime"),
    ("backend=openvino", "openvino", "openvino"),
    ("backend=tensorflow_xla", "tensorflow", "tensorflow"),
    ("reference=tensorflow", "tensorflow", "tensorflow"),  # the reference is checked before anything runs
]


@pytest.fixture(scope="module")
def blocked_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("blocked") / "outputs"
    calls = [[hidden, ["run", "--no-progress", *FAST, override, f"output_dir={out}"]]
             for override, hidden, _ in CASES]
    proc = subprocess.run([sys.executable, "-c", BLOCKER, json.dumps(calls)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]}-without-{c[1]}" for c in CASES])
def test_missing_framework_names_its_extra(blocked_runs, case):
    out, results = blocked_runs
    code, stderr = results[case]
    _, hidden, extra = CASES[case]
    line = error_line(subprocess.CompletedProcess([], code, "", stderr))
    assert f"pip install 'corescale[{extra}]'" in line and hidden in line, line
    assert not out.exists()  # nothing written
