"""`corescale deploy BUNDLE --target ray` on real Ray clusters on loopback (docs/ray.md, "Serving on Ray").

One module cluster of two nodes (ray.cluster_utils.Cluster, as tests/test_ray_executor.py builds it), each pinned
to its own CPU: the trained all-MiniLM-L6-v2 measured on one core is deployed on it (one replica per node, the one
on the second node moved onto its CPU) and answers as `corescale serve` of the same bundle answers. A private local
cluster (no --address) serves the session's bert-tiny bundle and stops with SIGTERM. Ray's session files go to a
short /tmp/rayXXXX folder (its unix socket paths must stay under 107 characters).
"""

import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import corescale, left_after, needs_two_cpus, processes_with_env, raw_record
from ray_clusters import CPUS, RAY_ENV, pinned_nodes, ray_tmp
from serving import Service, measure_bundle

DEPLOY = ("deploy", "--target", "ray")
TEXTS = ["The cat sat on the mat.", "Ray Serve routes this through its proxy.", "short", "a b c d e f g h i j"]
pytestmark = [needs_two_cpus, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def cluster():
    """Two nodes on loopback, node i pinned to CPU i, 1 CPU each (ray_clusters.py)."""
    with pinned_nodes(2) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The trained all-MiniLM-L6-v2, measured on one core (one instance, one thread): a block per node."""
    return measure_bundle("all-minilm-l6-v2", tmp_path_factory.mktemp("minilm"), "instances=1", "cores_per_instance=1")


def post(url: str, route: str, body) -> httpx.Response:
    return httpx.post(f"{url}{route}", json=body, timeout=120)


def instances_of(ray_tmp_dir: Path) -> list[int]:
    """The pids of the instance processes Ray Serve replicas of this test's cluster own."""
    found = []
    for pid in processes_with_env(f"RAY_TMPDIR={ray_tmp_dir}"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if b"corescale.measure.worker" in cmdline and parent.startswith(b"ray::ServeReplica"):
            found.append(pid)
    return found


def thread_cpus(pid: int) -> list[list[int]]:
    """Each thread's Cpus_allowed_list (/proc/PID/task/*/status)."""
    from corescale.machine.cpulist import parse_cpulist

    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.append(list(parse_cpulist(line.split(":", 1)[1])))
    return found


def assert_pinned(pid: int, block: list[int]) -> None:
    """Every thread of the instance on its block, the block used whole."""
    cpus = thread_cpus(pid)
    assert cpus and all(set(c) <= set(block) for c in cpus), (pid, block, cpus)
    assert set().union(*map(set, cpus)) == set(block), (pid, block, cpus)


def test_two_nodes_serve_minilm_as_corescale_serve_one_pinned_replica_on_each(cluster, minilm, tmp_path):
    env = {**RAY_ENV, "RAY_TMPDIR": str(cluster.tmp)}
    with Service(minilm, tmp_path / "serve.log") as served, \
            Service(minilm, tmp_path / "deploy.log", "--address", cluster.address, env=env, command=DEPLOY) as ray:
        assert "2 replica(s)" in ray.ready and "(2 node(s) x 1 instance(s)" in ray.ready, ray.ready
        for route, body in (("/embed", {"inputs": TEXTS}), ("/v1/embeddings", {"input": TEXTS[:2]})):
            ours, theirs = post(ray.url, route, body), post(served.url, route, body)
            assert ours.status_code == theirs.status_code == 200, ours.text
            rows = [np.array(r if route == "/embed" else r["embedding"]) for r in
                    (ours.json() if route == "/embed" else ours.json()["data"])]
            expected = [np.array(r if route == "/embed" else r["embedding"]) for r in
                        (theirs.json() if route == "/embed" else theirs.json()["data"])]
            np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-6)
        for route, body in (("/embed", {"inputs": 3}), ("/embed", {"inputs": []}), ("/rerank", {"query": "q"})):
            ours, theirs = post(ray.url, route, body), post(served.url, route, body)
            assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())
        assert httpx.get(f"{ray.url}/nowhere").json() == httpx.get(f"{served.url}/nowhere").json()
        seen = {}
        for _ in range(40):  # Ray's proxy spreads the requests over both replicas
            runs = httpx.get(f"{ray.url}/info", timeout=60).json()["corescale"]
            assert runs["engine"] == "ray serve"
            seen[runs["replica"]["node_rank"]] = runs["replica"]
            if len(seen) == 2:
                break
        assert httpx.get(f"{served.url}/info").json()["corescale"]["engine"] == "corescale serve"
        assert sorted(seen) == [0, 1], seen
        assert sorted(r["cpus"] for r in seen.values()) == [[CPUS[0]], [CPUS[1]]]
        pids = instances_of(cluster.tmp)
        assert sorted(pids) == sorted(r["instance_pid"] for r in seen.values())
        for replica in seen.values():
            assert_pinned(replica["instance_pid"], replica["cpus"])
        # measured through the engine: LoadGen over HTTP against Ray Serve's proxy; the record names the engine
        measured = corescale("run", "--no-progress", "scenario=server", f"endpoint={ray.url}", "api=tei",
                             "model=all-MiniLM-L6-v2", "target_qps=60", "duration=0.5", "server.min_query_count=459",
                             "warmup.max_iterations=8", "timeout=120", f"output_dir={tmp_path / 'out'}")
        assert measured.returncode == 0, measured.stderr
        record = raw_record(next((tmp_path / "out").glob("*/result.json")).parent)
        assert record["status"] == "ok" and record["server"]["steps"][0]["errors"] == 0, record["server"]["steps"]
        assert record["server"]["endpoint"]["engine"] == "ray serve"
        code, out = ray.terminate()
    assert code == 0, out
    deadline = time.monotonic() + 30
    while instances_of(cluster.tmp) and time.monotonic() < deadline:  # the replicas stopped their instances
        time.sleep(0.1)
    assert not instances_of(cluster.tmp)
    assert processes_with_env(f"RAY_TMPDIR={cluster.tmp}")  # a cluster it did not start stays


def test_sigterm_drains_and_stops_the_private_cluster(tiny_bundle, tmp_path):
    """No --address: a private cluster on loopback; SIGTERM answers what was accepted, deletes the application,
    stops the cluster: nothing of it is left."""
    tmp = ray_tmp()
    env = {**RAY_ENV, "RAY_TMPDIR": str(tmp)}
    answers, signalled = [], threading.Event()

    def load(url):
        with httpx.Client(timeout=120) as client:
            while True:
                sent_after = signalled.is_set()
                try:
                    answers.append(client.post(f"{url}/embed", json={"inputs": TEXTS * 8}).status_code)
                except httpx.TransportError as exc:  # refused or closed once the proxy stops: only then
                    answers.append("closed" if sent_after else repr(exc))
                    return

    try:
        with Service(tiny_bundle("embed"), tmp_path / "deploy.log", env=env, command=DEPLOY) as ray:
            assert "1 replica(s)" in ray.ready
            (pid,) = instances_of(tmp)
            block = httpx.get(f"{ray.url}/info").json()["corescale"]["replica"]["cpus"]
            assert_pinned(pid, block)
            clients = [threading.Thread(target=load, args=(ray.url,)) for _ in range(3)]
            for client in clients:
                client.start()
            while len(answers) < 6:
                time.sleep(0.05)
            signalled.set()
            code, out = ray.terminate()
            for client in clients:
                client.join(60)
        assert code == 0, out + ray.log.read_text()[-2000:]
        assert "draining the application" in out and "stopping the Ray cluster it started" in out
        # what arrived while the application was being deleted: Ray's proxy's 404 (no route any more) or 503
        assert set(answers) <= {200, 404, 503, "closed"} and answers.count(200) >= 6, answers
        assert left_after(f"RAY_TMPDIR={tmp}", 30) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_bad_bundle_is_one_line_before_ray_starts(tiny_bundle, tmp_path):
    tampered = tmp_path / "tampered"
    shutil.copytree(tiny_bundle("embed"), tampered)
    (tampered / "record.json").write_text((tampered / "record.json").read_text() + " ")
    tmp = ray_tmp()
    try:
        for bundle, message in ((tmp_path / "nothing", "is not a folder"), (tampered, "does not match its sha256")):
            proc = corescale(*DEPLOY[:1], str(bundle), *DEPLOY[1:], env={**RAY_ENV, "RAY_TMPDIR": str(tmp)})
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
            assert not any(tmp.iterdir())  # Ray never started
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
