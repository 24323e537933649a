"""A task from outside the package (tests/toy_task) registered with one line: the config accepts it, the service
exposes its route, the HTTP measurement sends it there, the quality gate judges it with its own metrics; an
incomplete or malformed entry is refused at registration. Nothing here lists tasks: each stage reads the entry."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from corescale.errors import RegistrationError, UserError
from corescale.measure.http.contract import Layout
from corescale.overrides import compose
from corescale.serve.limits import Limits
from corescale.workload.heads import HeadSpec
from corescale.workload.tasks import TASKS, Route, Task, register


def test_the_config_accepts_it_and_every_stage_reads_its_entry(toy_task):
    from corescale.analysis.store import _quality_names
    from corescale.backends import BACKENDS
    from corescale.http_keys import api_tasks
    from corescale.workload.heads import head_for_task

    assert compose([f"task={toy_task.name}"]).task == toy_task.name  # pytorch computes a pooled head
    assert toy_task.name in BACKENDS["onnxruntime"].tasks() and toy_task.name not in BACKENDS["tensorflow"].tasks()
    head = head_for_task(HeadSpec(), toy_task.name, "preset", "m", decoder=False)
    assert (head.task, head.pooling, head.normalize, head.output_name) == (toy_task.name, "mean", True,
                                                                           "sentence_embedding")
    assert head.identity() == {"head": head.to_json()}  # a head of its own enters the trial key
    assert toy_task.name in api_tasks("tei") and toy_task.name not in api_tasks("openai")
    assert "quality_norm_drift_max" in _quality_names()


def test_an_unregistered_task_is_one_line():
    with pytest.raises(UserError, match="unknown task 'toyscore'; allowed: embed, rerank, classify, encode"):
        compose(["task=toyscore"])


def test_the_http_measurement_sends_it_to_its_route(toy_task):
    from corescale.measure.http.api import BadAnswer, api_of, route_of

    api = api_of(compose([f"task={toy_task.name}", "endpoint=managed", "scenario=server", "target_qps=10"]))
    assert (api.name, api.path, api.about) == ("tei", "/toy", ("/info",))
    assert api.body("a text", "m") == b'{"inputs": ["a text"]}'
    assert api.check(b'{"norms": [1.5]}') is None
    with pytest.raises(BadAnswer):
        api.check(b"[[0.1, 0.2]]")
    with pytest.raises(UserError, match=f"task={toy_task.name} is sent over api=tei: give api=tei \\(POST /toy\\)"):
        route_of("openai", toy_task.name)


def judged(task: str, out: np.ndarray, ref: np.ndarray) -> tuple:
    """The runner's verdict on one instance's quality check: (the judged quality, the trial's failures)."""
    from corescale.measure.quality import task_metrics
    from corescale.measure.runner import judge_quality
    from corescale.record.sections import Quality

    failures: list = []
    checked = Quality(task, task_metrics(task, out, ref, None), len(ref), "texts", "reference")
    record = SimpleNamespace(instance_reports=[SimpleNamespace(quality=checked)], quality=None, ok=True,
                             fail=lambda failure, valid: failures.append(failure))
    judge_quality(record, SimpleNamespace(cfg=SimpleNamespace(min_quality=None), model=SimpleNamespace(task=task)))
    return record.quality, failures


def test_the_quality_gate_judges_with_its_metrics(toy_task):
    from corescale.workload.quality import parse_gate

    ref = np.array([[3.0, 4.0], [1.0, 0.0]])
    close, far = judged(toy_task.name, ref * 1.001, ref), judged(toy_task.name, ref * 1.1, ref)  # norms move by
    assert close[0].gate == ["norm_drift_max<=0.01"] and close[0].passed and not close[1]  # 0.005, then 0.5
    assert far[0].failed == ["norm_drift_max<=0.01"] and far[0].passed is False and len(far[1]) == 1
    with pytest.raises(UserError, match="'cosine_p1' \\(a metric of task embed\\), not a metric of task=toyscore"):
        parse_gate("cosine_p1>=0.9", toy_task.name)


class Pool:
    """Answers every row at once with the vector (3, 4): what the service's instances would compute."""

    def __init__(self):
        self.instances = [SimpleNamespace(artifact=None)]
        self.bundle = SimpleNamespace(layout=Layout([]), cfg=compose([]), root=None)

    def admit(self, rows):
        pass

    def release(self, rows):
        pass

    def submit(self, request):
        request.future.set_result([np.array([3.0, 4.0]) for _ in request.rows])

    def ready_count(self):
        return 1


class Tokens:
    max_inputs, max_length, limits = 8, 32, Limits(max_inputs=8)

    def check(self, texts):
        pass

    def encode(self, texts, truncate, pairs):
        return SimpleNamespace(rows=[np.arange(3) for _ in texts], types=None, tokens=3 * len(texts))


def client(task: str) -> TestClient:
    from corescale.serve.app import Front, create_app
    from corescale.serve.metrics import Metrics

    head = dataclasses.replace(HeadSpec(task=task), pooling="mean")
    return TestClient(create_app(Front(Pool(), Tokens(), head, ["m"], Metrics()), None))


def test_the_service_exposes_its_route(toy_task):
    served = client(toy_task.name)
    answer = served.post("/toy", json={"inputs": ["a", "b"]})
    assert answer.status_code == 200 and answer.json() == {"norms": [5.0, 5.0]}
    assert "x-inference-time" in answer.headers
    assert served.post("/toy", json={"inputs": "a"}).status_code == 422  # its schema validates the body
    assert served.get("/info").json()["model_type"] == {"toy": served.get("/info").json()["model_type"]["toy"]}
    refused = served.post("/embed", json={"inputs": "a"})
    assert refused.status_code == 400 and "this one serves task 'toyscore'" in refused.json()["error"]
    assert client("embed").post("/toy", json={"inputs": ["a"]}).status_code == 400


def test_without_it_the_service_has_no_such_route():
    assert client("embed").post("/toy", json={"inputs": ["a"]}).status_code == 404


@pytest.mark.parametrize("entry, message", [
    (Task("half"), "task 'half' is incomplete: noun missing, head missing, output missing, tei_type missing"),
    (Task("odd", "n", "tokens", "o", "t", labels=("a",)), "labels are given exactly for a logits head"),
    (Task("odd", "n", "pooled", "o", "t", metrics=(("m", "up"),), judge="x:y"), "metrics must be (name, higher"),
    (Task("odd", "n", "pooled", "o", "t", metrics=(("m", "lower"),), gate="n<=1", judge="x:y"),
     "gate names n, not among its metrics"),
    (Task("odd", "n", "pooled", "o", "t", metrics=(("m", "lower"),)), "a judge is given exactly when there are"),
    (Task("odd", "n", "pooled", "o", "t", routes=(Route("tei", "/embed", "a:B", "a:c"),)),
     "route /embed is taken by task 'embed'"),
    (Task("odd", "n", "pooled", "o", "t", routes=(Route("grpc", "/x", "a.B", "a:c"),)), "schema is not 'module:"),
])
def test_an_incomplete_or_malformed_entry_is_refused_at_registration(entry, message):
    with pytest.raises(RegistrationError) as info:
        register(entry)
    assert message in str(info.value) and entry.name not in TASKS


@pytest.mark.slow
def test_a_worker_knows_a_task_registered_from_a_plug_in_before_it_reads_its_job():
    """A task from outside the package comes in as a backend does, through CORESCALE_BACKENDS: a worker's first
    imports (those it reads its job with) load the plug-ins, so a job naming the task resolves (one interpreter
    doing exactly that, not a whole run: ~1 s)."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    code = ("from corescale.measure import imports; imports.timed_imports(list(imports.JOB_MODULES)); "
            "from corescale.workload.tasks import get; print(get('toyscore').judge)")
    env = {**os.environ, "CORESCALE_BACKENDS": "toy_task.plugin",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "toy_task:judge", proc.stderr
    env["CORESCALE_BACKENDS"] = ""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown task 'toyscore'" in proc.stderr  # the plug-in, not the test, registered it
