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
