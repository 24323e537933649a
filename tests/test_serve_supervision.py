"""`corescale serve` keeps its instances answering: a batch the model cannot take fails alone, a stopped or killed
worker is replaced under load with bounded failures and a truthful /health, the keeper survives a start that
fails, and SIGTERM (to the server, or to every process of the service as systemd's control group gets it) ends in
bounded time with every accepted request answered. A real service on loopback, a real worker, real signals."""

import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from helpers import processes_with_env
from serving import Service

TEXTS = ["a text to embed", "and another one"]
CLIENTS = 4


def test_the_systemd_unit_signals_corescale_alone_and_waits_for_the_whole_drain():
    """KillMode=mixed: SIGTERM to the main process only (the default control-group would signal the workers too);
    the stop timeout longer than the drain, the pool's drain and the instances' stop together."""
    from corescale.measure.http.contract import GRACEFUL_S, STOP_S
    from corescale.serve.examples import systemd_unit
    from corescale.serve.pool import DRAIN_S, STOP_GRACE_S

    unit = dict(line.split("=", 1) for line in systemd_unit().splitlines() if "=" in line and line[0] != "#")
    assert unit["KillSignal"] == "SIGTERM" and unit["KillMode"] == "mixed"
    assert float(unit["TimeoutStopSec"]) == STOP_S > GRACEFUL_S + DRAIN_S + STOP_GRACE_S
    assert unit["RuntimeDirectory"] == "corescale"  # the work folder goes there ($RUNTIME_DIRECTORY)


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    """The session's bert-tiny embed bundle: what is checked is the keeper, the deadlines and the drain, not the
    vectors, so any bundle will do (an out-of-vocabulary id fails a bert-tiny batch as it does a MiniLM one)."""
    return tiny_bundle("embed")


class Running:
    """A `corescale serve` of the bundle shared by the tests that leave it healthy, started again when a test
    ended it; its work folder under $RUNTIME_DIRECTORY, its stdout closed after the ready line (as behind
    `| head -n1`: the service must not mind), a marker in its environment to find its worker."""

    def __init__(self, bundle: Path, where: Path):
        self.bundle, self.where, self.service, self.starts = bundle, where, None, 0

    def get(self, *options: str, fresh: bool = False) -> Service:
        if fresh and self.service is not None:
            self.service.stop()
        if self.service is None or self.service.process.poll() is not None:
            self.starts += 1
            self.marker = f"CORESCALE_SUPERVISION_TEST={uuid.uuid4()}"
            self.runtime = self.where / f"run-{self.starts}"
            self.runtime.mkdir()
            name, value = self.marker.split("=")
            self.log = self.where / f"serve-{self.starts}.log"
            self.service = Service(self.bundle, self.log, "--batch-timeout", "3", *options,
                                   env={name: value, "RUNTIME_DIRECTORY": str(self.runtime)})
            self.service.process.stdout.close()
        return self.service

    def worker(self, timeout: float = 120) -> int:
        """The pid of its one live worker (waits while it is being started again)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [pid for pid in processes_with_env(self.marker) if pid != self.service.process.pid
                     and b"corescale.measure.worker" in read(f"/proc/{pid}/cmdline")
                     and b"State:\tZ" not in read(f"/proc/{pid}/status")]
            if len(found) == 1:
                return found[0]
            time.sleep(0.1)
        raise AssertionError(f"no single worker of the service after {timeout} s")

    def restarts(self) -> float:
        text = httpx.get(f"{self.service.url}/metrics", timeout=10).text
        found = re.search(r'corescale_instance_restarts_total\{instance="0"\} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    def queued(self) -> float:
        text = httpx.get(f"{self.service.url}/metrics", timeout=10).text
        return float(re.search(r"^corescale_queue_inputs (\S+)", text, re.M).group(1))

    def health(self) -> int:
        """/health's status: it must answer at once whatever the instances do."""
        return httpx.get(f"{self.service.url}/health", timeout=5).status_code


def read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def running(bundle, tmp_path_factory):
    shared = Running(bundle, tmp_path_factory.mktemp("serve"))
    yield shared
    if shared.service is not None:
        shared.service.stop()


class Load:
    """CLIENTS threads posting /embed back to back until stopped; each answer's status, each error."""

    def __init__(self, url: str):
        self.url, self.statuses, self.errors, self.done = url, [], [], False
        self.threads = [threading.Thread(target=self.client) for _ in range(CLIENTS)]

    def client(self) -> None:
        while not self.done:
            try:
                self.statuses.append(httpx.post(f"{self.url}/embed", json={"inputs": TEXTS}, timeout=120).status_code)
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))

    def answered(self, more: int, timeout: float = 120) -> None:
        """Waits for `more` answers of 200."""
        target = self.statuses.count(200) + more
        deadline = time.monotonic() + timeout
        while self.statuses.count(200) < target:
            assert time.monotonic() < deadline, f"no {more} answers in {timeout} s: {self.statuses[-20:]}"
            time.sleep(0.05)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done = True
        for thread in self.threads:
            thread.join(timeout=150)


def wait_for(what, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


@pytest.mark.slow
def test_a_batch_the_model_cannot_take_fails_alone_and_the_instance_serves_on(running):
    """Lines the service itself never sends (a token id past the vocabulary, an empty row) written to the worker's
    own input: it answers those batches `unanswered` and serves on (no restart, the same process)."""
    service = running.get()
    worker = running.worker()
    with open(f"/proc/{worker}/fd/0", "w") as stdin:  # the worker's input pipe, beside the service's lines
        stdin.write("infer 900001 101,999999999,102\ninfer 900002 \n")
    for _ in range(3):
        answer = httpx.post(f"{service.url}/embed", json={"inputs": TEXTS}, timeout=60)
        assert answer.status_code == 200, answer.text
    assert running.worker() == worker and running.restarts() == 0


def replaced_under_load(running, sig: int) -> None:
    service = running.get()
    worker, before = running.worker(), running.restarts()
    with Load(service.url) as load:
        load.answered(5)
        os.kill(worker, sig)
        if sig == signal.SIGSTOP:  # overdue: not counted by /health (which answers at once), then killed
            wait_for(lambda: running.health() == 503, 60, "/health kept saying ready with a stopped instance")
        wait_for(lambda: running.restarts() == before + 1, 120, "the instance was not started again")
        assert running.worker() != worker
        load.answered(10)
        assert running.health() == 200
    assert not Path(f"/proc/{worker}").exists()  # killed and reaped, not left stopped
    failed = [s for s in load.statuses if s != 200]  # only the batch in flight, if one was
    assert set(failed) <= {503} and len(failed) <= CLIENTS and not load.errors, (failed, load.errors)
    assert failed or sig != signal.SIGSTOP  # a stopped instance always holds a batch past its deadline


@pytest.mark.slow
def test_a_stopped_worker_is_killed_past_its_deadline_and_replaced(running):
    replaced_under_load(running, signal.SIGSTOP)


@pytest.mark.slow
def test_a_killed_worker_is_replaced_under_load_with_stdout_closed(running):
    """The service's stdout is a closed pipe: logging the restart must not cost the restart."""
    replaced_under_load(running, signal.SIGKILL)


@pytest.mark.slow
def test_the_keeper_survives_a_start_that_fails(running):
    """The work folder (under $RUNTIME_DIRECTORY) is replaced by a file, so the next start cannot even open its
    log: the keeper says so and tries again, and succeeds once the folder is back."""
    service = running.get()
    (work,) = running.runtime.glob("corescale-serve-*")
    aside = work.with_name(work.name + ".aside")
    work.rename(aside)
    work.write_text("not a folder")
    try:
        os.kill(running.worker(), signal.SIGKILL)
        wait_for(lambda: "could not start" in running.log.read_text(), 60, "the failed start was not reported")
        assert running.health() == 503
        began = time.monotonic()  # nothing is running and the next start is a backoff away: refused at once
        refused = httpx.post(f"{service.url}/embed", json={"inputs": TEXTS}, timeout=60)
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, refused.text
        assert time.monotonic() - began < 5 and "last start failed" in refused.json()["error"]
    finally:
        work.unlink()
        aside.rename(work)
    wait_for(lambda: running.health() == 200, 120, "the keeper did not start the instance again")
    assert httpx.post(f"{service.url}/embed", json={"inputs": TEXTS}, timeout=60).status_code == 200


@pytest.mark.slow
def test_sigterm_with_a_hung_worker_ends_in_bounded_time_and_answers_every_request(running):
    """A stopped worker holds a batch when SIGTERM comes: its deadline ends it, the drain answers what is left
    (503: nothing restarts while stopping), and the service exits 0."""
    service = running.get()
    worker = running.worker()
    os.kill(worker, signal.SIGSTOP)
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(
        httpx.post(f"{service.url}/embed", json={"inputs": TEXTS}, timeout=120).status_code)) for _ in range(6)]
    for thread in threads:
        thread.start()
    wait_for(lambda: running.queued() == 12, 30, "the requests were not all accepted")
    began = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    code = service.process.wait(timeout=90)
    took = time.monotonic() - began
    for thread in threads:
        thread.join(timeout=30)
    assert code == 0 and took < 60, (code, took, running.log.read_text()[-2000:])
    assert sorted(answers) == [503] * 6, answers


@pytest.mark.slow
def test_sigterm_to_every_process_of_the_service_drains_every_accepted_request(running):
    """As systemd's default KillMode gets it: SIGTERM to the server and to its worker (held stopped meanwhile so
    every request is queued first). The worker ignores it; the drain answers all of them (200) and exits 0."""
    service = running.get("--batch-timeout", "30", fresh=True)
    worker = running.worker()
    os.kill(worker, signal.SIGSTOP)
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(
        httpx.post(f"{service.url}/embed", json={"inputs": TEXTS * 2}, timeout=120).status_code)) for _ in range(12)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: running.queued() == 48, 30, "the requests were not all accepted")
        everyone = processes_with_env(running.marker)
        assert service.process.pid in everyone and worker in everyone
        for pid in everyone:
            os.kill(pid, signal.SIGTERM)
    finally:
        os.kill(worker, signal.SIGCONT)
    code = service.process.wait(timeout=90)
    for thread in threads:
        thread.join(timeout=30)
    assert code == 0, running.log.read_text()[-2000:]
    assert sorted(answers) == [200] * 12, answers
    wait_for(lambda: not processes_with_env(running.marker), 10, "a process of the service outlived it")


def batch_reducing_onnx(path: Path) -> Path:
    """A text model file whose output has one row whatever the batch (its batch axis averaged away): the answer to
    a batch of several inputs is not one row per input (review 0.4 F2)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    vocab, hidden = 30522, 8
    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32),
                                      "emb")
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
             helper.make_node("ReduceMean", ["e"], ["tokens"], axes=[1], keepdims=0),
             helper.make_node("ReduceMean", ["tokens"], ["sentence_embedding"], axes=[0], keepdims=1)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"]) for n in ("input_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, [1, hidden])]
    graph = helper.make_graph(nodes, "reduces-the-batch", inputs, outputs, [weights])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


@pytest.mark.slow
def test_an_answer_that_is_not_one_row_per_input_fails_its_batch_and_strands_nothing(tmp_path):
    import shutil

    from serving import minilm_folder

    model = batch_reducing_onnx(tmp_path / "reduces.onnx")
    shutil.copy(minilm_folder() / "tokenizer.json", tmp_path / "tokenizer.json")  # beside the file: its tokenizer
    layout = (f"model={model} backend=onnxruntime instances=1 cores_per_instance=1 batch_size=4 "
              "sequence_length=32")
    with Service(layout, tmp_path / "serve.log", "--max-queue", "4") as service:
        one = httpx.post(f"{service.url}/embed", json={"inputs": ["a single text"]}, timeout=60)
        assert one.status_code == 200, one.text  # one input: one row, answered
        for _ in range(6):  # more inputs than the queue holds, over the runs: each slot must come back
            answer = httpx.post(f"{service.url}/embed", json={"inputs": TEXTS}, timeout=60)
            assert answer.status_code == 500 and "first axis must be the batch" in answer.json()["error"], answer.text
        queued = float(re.search(r"^corescale_queue_inputs (\S+)", httpx.get(f"{service.url}/metrics", timeout=10)
                                 .text, re.M).group(1))
        assert queued == 0 and httpx.get(f"{service.url}/health", timeout=5).status_code == 200
        assert httpx.post(f"{service.url}/embed", json={"inputs": ["again"]}, timeout=60).status_code == 200


@pytest.mark.slow
def test_queued_inputs_end_at_the_queue_deadline_whatever_the_instance_does(running):
    """A stopped worker holds its batch (a long batch deadline); what waits behind it gets 503 at the queue
    deadline, not when the worker comes back."""
    service = running.get("--queue-timeout", "1", "--batch-timeout", "60", fresh=True)
    worker = running.worker()
    os.kill(worker, signal.SIGSTOP)
    answers: list = []

    def post() -> None:
        began = time.monotonic()
        answer = httpx.post(f"{service.url}/embed", json={"inputs": TEXTS}, timeout=120)
        answers.append((answer.status_code, answer.text, time.monotonic() - began))
    threads = [threading.Thread(target=post) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        wait_for(lambda: len(answers) >= 2, 30, "the queued requests did not end at their deadline")
    finally:
        os.kill(worker, signal.SIGCONT)
    for thread in threads:
        thread.join(timeout=60)
    late = [a for a in answers if a[0] == 503]
    assert late and all("queue deadline (1 s)" in text and took < 10 for _, text, took in late), answers
    assert all(status in (200, 503) for status, _, _ in answers), answers
    service.stop()


def test_an_answer_is_one_row_per_input_or_refused():
    import base64

    import numpy as np

    from corescale.measure import protocol
    from corescale.serve.pool import answered_rows

    def reply(array):
        return protocol.Answered(1, 0, 1, 8, 8, shape=list(array.shape),
                                 rows=base64.b64encode(array.astype("<f4").tobytes()).decode())
    assert answered_rows(reply(np.ones((3, 4))), 3).shape == (3, 4)
    for wrong in (np.ones((1, 4)), np.ones(3), np.float32(1.0)):
        with pytest.raises(ValueError, match="first axis must be the batch"):
            answered_rows(reply(np.asarray(wrong)), 2 if np.ndim(wrong) else 3)
    broken = protocol.Answered(1, 0, 1, 8, 8, shape=[2, 4], rows=base64.b64encode(b"\0" * 12).decode())
    with pytest.raises(ValueError):  # bytes that do not fill the stated shape
        answered_rows(broken, 2)


def test_the_queue_gives_up_what_waited_past_its_deadline():
    import numpy as np

    from corescale.config import BenchmarkConfig
    from corescale.measure.batching import Batcher, Waiting

    batcher = Batcher(BenchmarkConfig(), np.zeros(0, dtype=np.int64))
    batcher.add([Waiting("old", 100, 4), Waiting("older", 50, 4), Waiting("new", 500, 4)])
    assert [w.sample for w in batcher.expired(200)] == ["old", "older"]
    assert [w.sample for w in batcher.waiting] == ["new"] and batcher.expired(200) == []


def test_a_ray_replica_whose_instance_stays_down_reports_unhealthy(monkeypatch):
    import time as clock
    from types import SimpleNamespace

    from corescale.deploy import ray_serve

    ready = [1]
    replica = ray_serve.Replica.__new__(ray_serve.Replica)  # no Ray: only its health check
    replica.down_since = None
    replica.pool = SimpleNamespace(ready_count=lambda: ready[0],
                                   instances=[SimpleNamespace(id=0, failure="exited with status -9")])
    now = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    replica.check_health()  # ready
    ready[0] = 0
    replica.check_health()  # down, within the grace: a restart takes seconds
    now[0] += ray_serve.UNHEALTHY_S + 1
    with pytest.raises(RuntimeError, match="has not been ready"):
        replica.check_health()
    ready[0] = 1
    replica.check_health()
    assert replica.down_since is None
