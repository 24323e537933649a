"""What framework backends share: a missing framework names its extra; two one-thread instances agree with PyTorch
and report their framework's settings (the shared checks are in helpers.py, the runs in conftest.py)."""

import json
import subprocess
import sys

import pytest
from helpers import FAST, ROOT, assert_agrees_with_pytorch, error_line

pytestmark = pytest.mark.slow  # every test here starts processes


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


# backend -> (framework settings each of two one-thread instances reports, load stages it records apart)
TWO_INSTANCES = {
    "onnxruntime": ({"intra_op_num_threads": 1, "inter_op_num_threads": 1, "providers": ["CPUExecutionProvider"]},
                    {"session"}),
    # the precision hint is explicit, even on CPUs where bf16 would be OpenVINO's default
    "openvino": ({"inference_num_threads": 1, "num_streams": 1, "performance_hint": "LATENCY",
                  "inference_precision_hint": "f32"}, {"convert", "compile"}),
}


@pytest.mark.parametrize("backend", TWO_INSTANCES)
def test_two_instances_agree_with_pytorch(backend, request):
    record = request.getfixturevalue(f"{backend}_runs")["two_instances"]
    settings, stages = TWO_INSTANCES[backend]
    assert len(record["instance_reports"]) == 2
    assert_agrees_with_pytorch(record)
    for inst in record["instance_reports"]:
        framework = inst["framework"]
        assert framework["framework"] == backend, framework
        assert {key: framework.get(key) for key in settings} == settings, framework
        assert stages <= set(inst["stage_seconds"]), inst["stage_seconds"]
