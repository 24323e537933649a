"""`corescale serve --fronts 2`: two front processes on one port, each before one of the two instances; one
ready line, /metrics over both fronts, a drain that answers everything accepted, a front that dies started again
while the other serves, and fronts that end with the service's process."""

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from serving import Service

from corescale.config_server import check_fronts
from corescale.errors import UserError
from corescale.measure.http.managed import front_cpu_in
from corescale.serve.fronts import shares
from corescale.serve.metrics import OTHERS_EVERY_S, Metrics

LAYOUT = ("model=bert-tiny task=embed backend=onnxruntime sequence_length=32 batch_size=2 instances=2 "
          "cores_per_instance=1")


def counted(service, name: str, **labels: str) -> dict[str, float]:
    """`name`'s samples with `labels` in /metrics, summed by front."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{service.url}/metrics", timeout=30).text
    by_front: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                by_front[sample.labels["front"]] = by_front.get(sample.labels["front"], 0.0) + sample.value
    return by_front


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (the fronts and their instances), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running (a zombie that its new parent has not reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def embed(service, text: str) -> httpx.Response:
    with httpx.Client() as client:  # a new connection: any front may accept it
        return client.post(f"{service.url}/embed", json={"inputs": text}, timeout=60)


def test_the_fronts_divide_the_instances_contiguously():
    assert shares(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]] and shares(3, 1) == [[0, 1, 2]]
    check_fronts(4, 8, "--fronts 4")
    for fronts, instances, allowed in ((3, 8, "1, 2, 4, 8"), (3, 2, "1, 2"), (2, 1, "1")):
        with pytest.raises(UserError, match=f"^--fronts {fronts} does not divide .* give one of {allowed}$"):
            check_fronts(fronts, instances, f"--fronts {fronts}")


def test_a_front_ending_again_soon_after_its_start_waits_longer_each_time():
    from corescale.serve.fronts import STABLE_S, Forked, restart_wait

    failures = {0: 0}
    soon = Forked(0, 1, -1)  # started just now
    assert [restart_wait(soon, failures) for _ in range(4)] == [0.0, 0.5, 1.0, 2.0]
    assert max(restart_wait(soon, failures) for _ in range(20)) == 30.0  # at most
    served = Forked(0, 1, -1, started=time.monotonic() - STABLE_S)
    assert restart_wait(served, failures) == 0.0  # it had served a while: at once, the count starts over


def test_every_fronts_metrics_in_one_exposition(tmp_path):
    """Each family once, every sample labelled with its front; this front's as of now, the others' as written."""
    from prometheus_client.parser import text_string_to_metric_families

    mine, other = Metrics(), Metrics()
    mine.batch(2, 0.004, 16, 20)
    other.batch(4, 0.006, 32, 100)
    other.answered("/embed", 200)
    (tmp_path / "front-1.prom").write_bytes(other.text())
    mine.shared = (tmp_path, 0)
    families = {f.name: f for f in text_string_to_metric_families(mine.text().decode())}
    rows = families["corescale_batch_size"].samples
    assert {s.labels["front"] for s in rows} == {"0", "1"}
    assert sum(s.value for s in rows if s.name == "corescale_batch_size_sum") == 6
    tokens = {(s.labels["front"], s.labels["kind"]): s.value for s in families["corescale_tokens"].samples
              if s.name == "corescale_tokens_total"}
    assert tokens == {("0", "real"): 20, ("0", "padded"): 32, ("1", "real"): 100, ("1", "padded"): 128}
    assert len(families["corescale_front_cpu_seconds"].samples) == 2
    two = 'corescale_front_cpu_seconds{front="0"} 1.25\ncorescale_front_cpu_seconds{front="1"} 0.5\n'
    assert front_cpu_in(two) == 1.75  # the service's front CPU: every front's
    assert front_cpu_in("corescale_front_cpu_seconds 1.5\n") == 1.5 and front_cpu_in("other 1\n") is None


@pytest.mark.slow
def test_two_fronts_share_the_port_and_drain_on_sigterm(tmp_path):
    service = Service(f"{LAYOUT} cache_dir={tmp_path}", tmp_path / "serve.log", "--fronts", "2")
    try:
        assert "2 instance(s) of bert-tiny on onnxruntime (fp32) behind 2 fronts ready" in service.ready
        answers = [embed(service, "the same words from every front") for _ in range(24)]
        infos = [httpx.get(f"{service.url}/info", timeout=30).json()["corescale"] for _ in range(6)]
        time.sleep(OTHERS_EVERY_S * 2.5)  # every front has written its metrics since
        requests = counted(service, "corescale_requests_total", route="/embed", status="200")
        fronts = {info["front"]["index"]: info["front"] for info in infos}
        pids = descendants(service.process.pid)
        late = []

        def send():
            try:
                late.append(embed(service, "a text sent as the service stops " * 3).status_code)
            except httpx.TransportError:  # after the stop: the port refuses
                late.append(None)
        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        code, out = service.terminate()
        for thread in threads:
            thread.join()
    finally:
        service.stop()
    log = (tmp_path / "serve.log").read_text()
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    vectors = np.array([a.json()[0] for a in answers])
    assert np.allclose(vectors, vectors[0], atol=1e-6)  # both fronts' instances compute the same model
    assert set(requests) == {"0", "1"} and sum(requests.values()) == 24
    for index, front in fronts.items():  # each front names itself and feeds its own instance
        assert front["fronts"] == 2 and front["instances"] == [index]
    assert code == 0, out + log[-2000:]
    assert len(late) == 8 and set(late) <= {200, None}, late  # what a front accepted, it answered
    assert {front["pid"] for front in fronts.values()} <= pids and len(pids) >= 4  # two fronts, two instances
    assert "front 0: stopped after" in out and "front 1: stopped after" in out
    assert out.count("inputs served") == 2
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{service.url}/health")


@pytest.mark.slow
def test_a_front_that_dies_is_started_again_while_the_other_serves(tmp_path):
    service = Service(f"{LAYOUT} cache_dir={tmp_path}", tmp_path / "serve.log", "--fronts", "2")
    try:
        front = httpx.get(f"{service.url}/info", timeout=30).json()["corescale"]["front"]
        os.kill(front["pid"], signal.SIGKILL)
        meanwhile = [embed(service, "served by the front that lives").status_code for _ in range(10)]
        deadline, again = time.monotonic() + 120, None
        while again is None and time.monotonic() < deadline:  # the same share, a new process
            found = httpx.get(f"{service.url}/info", timeout=30).json()["corescale"]["front"]
            again = found if found["index"] == front["index"] and found["pid"] != front["pid"] else None
        assert again is not None, "the front was not started again"
        answer = embed(service, "served again")
        code, out = service.terminate()
    finally:
        service.stop()
    assert meanwhile == [200] * 10  # the kernel hands new connections to the front that accepts
    assert again["instances"] == front["instances"] and answer.status_code == 200
    assert f"front {front['index']} ended with code -9 while serving; starting it again" in out
    assert code == 0 and out.count("front 0: stopped after") == 1 and out.count("front 1: stopped after") == 1


@pytest.mark.slow
def test_the_fronts_end_when_the_services_process_is_killed(tmp_path):
    service = Service(f"{LAYOUT} cache_dir={tmp_path}", tmp_path / "serve.log", "--fronts", "2")
    try:
        left = descendants(service.process.pid)
        assert len(left) >= 4  # two fronts, two instances
        service.process.kill()
        service.process.communicate(timeout=30)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        service.stop()
    assert not any(alive(pid) for pid in left)  # each front drained on the kernel's SIGTERM and took its instance
