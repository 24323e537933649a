"""RayExecutor on a real Ray cluster of 2 simulated nodes on loopback (ray.cluster_utils.Cluster).

Node `a` sees every CPU; node `b` was started pinned to one CPU, so it is a smaller machine kind: a trial
that asks for 2 threads is valid on the driver but a bad config on `b`.

The executor's mechanics (retries, resume, fail-fast, concurrent sweeps, the tune's fan-out) are measured on the
toy backend (LOOP: real trials in real worker processes, without PyTorch's imports); what concerns the frameworks'
threads on a node stays on PyTorch.
"""

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import FAST, LOOP, ROOT, TOY_ENV, corescale, needs_two_cpus, raw_record

from corescale.overrides import expand_sweep
from corescale.record.files import iter_run_dirs
from corescale.trials.local import Listener
from corescale.trials.ray import RayExecutor
from corescale.trials.sweep import plan_sweep

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = [needs_two_cpus, pytest.mark.timeout(240), pytest.mark.usefixtures("toy")]  # toy trials planned here
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK = "127.0.0.1"
ON_NODES = ["warmup.max_iterations=3", "timeout=120"]
QUICK, QUICK_TOY = [*FAST, *ON_NODES], [*LOOP, *ON_NODES]


@contextmanager
def affinity(cpus):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture(scope="module")
def cluster():
    tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's unix socket paths are <= 107 chars
    patch = pytest.MonkeyPatch()
    # the nodes' machine lock is the cluster's own: trials of other test sessions on this machine do not stall it;
    # the nodes' workers (and the CLIs the tests start) import and register the toy backend (TOY_ENV)
    env = {**RAY_ENV, **TOY_ENV, "RAY_TMPDIR": str(tmp), "CORESCALE_LOCK": str(tmp / "machine.lock")}
    for name, value in env.items():
        patch.setenv(name, value)
    patch.delenv("OMP_NUM_THREADS", raising=False)
    from ray.cluster_utils import Cluster

    ray_cluster = Cluster()
    try:
        ray_cluster.add_node(num_cpus=1, include_dashboard=False, node_ip_address=LOOPBACK,
                             resources={"corescale_node": 1, "corescale_type:a": 1})
        with affinity(CPUS[:1]):  # the raylet and every worker it starts inherit this
            ray_cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK,
                                 resources={"corescale_node": 1, "corescale_type:b": 1})
        yield SimpleNamespace(address=ray_cluster.address, tmp=tmp, cluster=ray_cluster)
    finally:
        ray_cluster.shutdown()
        patch.undo()
        shutil.rmtree(tmp, ignore_errors=True)


def trials_for(address, out, sweep, settings=QUICK_TOY):
    return plan_sweep([[*settings, f"output_dir={out}", "executor=ray", f"executor.address={address}", *overrides]
                       for overrides in expand_sweep(sweep)])


def run_trials(planned):
    """(loop state, [(planned, outcome)]) of a run on the cluster."""
    outcomes = []

    class Recorder(Listener):
        def finished(self, item, outcome, state):
            outcomes.append((item, outcome))

    state = RayExecutor(planned[0].trial.cfg.executor).run(planned, Recorder())
    return state, outcomes


def stored(out):
    return [raw_record(d) for d in iter_run_dirs(out)]


def overlap(x, y):
    return x["started"] < y["finished"] and y["started"] < x["finished"]


def dispatched_together(x, y):
    """Each was handed to its node before the other finished: the driver did not wait for one to send the other
    (whether the two also ran at the same instant depends on how fast each node starts a worker)."""
    return x["submitted"] < y["finished"] and y["submitted"] < x["finished"]


@pytest.mark.slow
def test_sweep_over_node_types_runs_one_trial_per_node(cluster, tmp_path):
    out = tmp_path / "out"
    trials = trials_for(cluster.address, out, ["executor.node_type=a,b"], QUICK)  # >1 trial per node: the tune test
    _, outcomes = run_trials(trials)

    assert len(outcomes) == 2
    records = stored(out)
    assert len(records) == 2 and all(r["status"] == "ok" and r["valid"] for r in records), \
        [r.get("reason") for r in records]
    assert sorted(r["trial_key"] for r in records) == sorted(t.key for t in trials)
    for r in records:
        node = r["node"]
        assert node["node_type"] == r["config"]["executor"]["node_type"]
        assert node["hostname"] and node["cpu_model"] and node["ray_node_id"] and node["ip"] == LOOPBACK
    assert len({r["node"]["ray_node_id"] for r in records}) == 2
    spans = [dict(r["executor"], node=r["node"]["ray_node_id"]) for r in records]
    for i, x in enumerate(spans):  # never two trials on one node at once; both nodes given work at once
        for y in spans[i + 1:]:
            assert not (x["node"] == y["node"] and overlap(x, y))
    assert any(dispatched_together(x, y) for i, x in enumerate(spans) for y in spans[i + 1:])
    # Ray's OMP_NUM_THREADS=1 must not reach the instances: threads come from the node's plan
    for r in records:
        plan_threads = r["plan"]["instances"][0]["threads"]
        framework = r["instance_reports"][0]["framework"]
        assert framework["num_threads"] == plan_threads
        assert f"OMP_NUM_THREADS : {plan_threads}" in framework["parallel_info"]
        assert "OMP_NUM_THREADS" not in r["environment"]["env"]
    by_type = {r["node"]["node_type"]: r["plan"]["instances"][0]["threads"] for r in records}
    assert by_type == {"a": len(CPUS), "b": 1}


def corescale_workers_of(ray_tmp: Path):
    """(pid, parent pid) of instance processes that a live Ray task of this test's cluster started."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        # the parent must be the Ray worker running our task (not whoever adopted a dead task's orphans)
        if (b"corescale.measure.worker" in cmdline and f"RAY_TMPDIR={ray_tmp}".encode() in environ
                and parent.startswith(b"ray::run_on_node")):
            found.append((int(proc.name), ppid))
    return found


def kill_first_ray_worker(ray_tmp: Path, killed: list, deadline_s: float = 90):
    """Kills (SIGKILL) the Ray worker that runs the first trial to start its instances."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for _, ray_worker in corescale_workers_of(ray_tmp):
            os.kill(ray_worker, signal.SIGKILL)
            killed.append(ray_worker)
            return
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_worker_is_retried_elsewhere_and_bad_config_is_recorded(cluster, tmp_path):
    import threading

    out = tmp_path / "out"
    good = trials_for(cluster.address, out, ["batch_size=3"])
    bad = trials_for(cluster.address, out, ["threads=2", "executor.node_type=b"])  # fits the driver, not b
    killed = []
    killer = threading.Thread(target=kill_first_ray_worker, args=(cluster.tmp, killed), daemon=True)
    killer.start()
    _, outcomes = run_trials(good + bad)
    killer.join(timeout=1)

    assert len(killed) == 1
    records = {r["config"]["batch_size"]: r for r in stored(out)}
    assert len(records) == 2
    retried = records[3]
    assert retried["status"] == "ok", retried.get("reason")
    assert retried["executor"]["attempt"] == 2
    failure = retried["executor"]["failed_attempts"][0]
    assert "WorkerCrashedError" in failure["error"] or "died" in failure["error"]
    assert failure["ray_node_id"] != retried["node"]["ray_node_id"]  # retried on the other node
    failed = records[1]
    assert failed["status"] == "failed" and not failed["valid"]
    assert failed["reason"].startswith("bad input: threads=2 exceeds the 1 CPUs")
    assert failed["executor"]["attempt"] == 1 and failed["node"]["node_type"] == "b"
    assert [o.ok for _, o in outcomes].count(True) == 1


@pytest.mark.slow
def test_worker_that_keeps_dying_is_recorded_failed(cluster, tmp_path):
    import threading

    out = tmp_path / "out"
    trials = trials_for(cluster.address, out, ["batch_size=5", "executor.max_retries=0"])
    killed = []
    killer = threading.Thread(target=kill_first_ray_worker, args=(cluster.tmp, killed), daemon=True)
    killer.start()
    _, outcomes = run_trials(trials)
    killer.join(timeout=1)

    assert len(killed) == 1 and len(outcomes) == 1 and not outcomes[0][1].ok
    (record,) = stored(out)
    assert record["status"] == "failed" and not record["valid"]
    assert record["reason"].startswith("Ray worker or node died 1 time(s), last on ")
    assert len(record["executor"]["failed_attempts"]) == 1 and record["node"]["ray_node_id"]


DRIVER = """
import sys
from corescale.overrides import expand_sweep
from corescale.trials.local import Listener
from corescale.trials.ray import RayExecutor
from corescale.trials.sweep import plan_sweep
planned = plan_sweep(expand_sweep(sys.argv[1:]))
class Printer(Listener):
    def finished(self, item, outcome, state):
        print("committed", outcome.path, flush=True)
RayExecutor(planned[0].trial.cfg.executor).run(planned, Printer())
"""


@pytest.mark.slow
def test_killed_driver_resumes_without_duplicates(cluster, tmp_path):
    out = tmp_path / "out"
    sweep = [*QUICK_TOY, f"output_dir={out}", "executor=ray", f"executor.address={cluster.address}",
             "batch_size=1,2,3"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), TOY_ENV["PYTHONPATH"]))}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, *sweep], stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = driver.stdout.readline()  # the first committed result, then the driver dies
    finally:
        driver.kill()
        driver.wait()
    assert first.startswith("committed ")
    kept = Path(first.split(" ", 1)[1].strip())
    before = {d.name: (d / "result.json").stat().st_mtime_ns for d in iter_run_dirs(out)}
    assert kept.name in before

    trials = trials_for(cluster.address, out, ["batch_size=1,2,3"])
    state, outcomes = run_trials(trials)

    assert state.count("skipped") == len(before)
    assert len(outcomes) == 3 - len(before)
    records = stored(out)
    assert sorted(r["trial_key"] for r in records) == sorted(t.key for t in trials)  # each once
    assert all(r["status"] == "ok" for r in records)
    assert {d.name: (d / "result.json").stat().st_mtime_ns for d in iter_run_dirs(out) if d.name in before} == before
    again, nothing = run_trials(trials)  # all done: nothing runs
    assert nothing == [] and again.count("skipped") == 3


LOCAL = """
import json, sys
import ray
from corescale.trials.local import Listener
from corescale.trials.sweep import plan_sweep, run_sweep
planned = plan_sweep([sys.argv[1:]])
seen = {}
class Check(Listener):
    def finished(self, item, outcome, state):
        seen.update(nodes=[n["NodeManagerAddress"] for n in ray.nodes()], record=outcome.record.node,
                    status=outcome.record.status)
        print("running", flush=True)
        sys.stdin.readline()  # the test looks at the Ray processes meanwhile
run_sweep(planned, Check())
seen["still_connected"] = ray.is_initialized()
print(json.dumps(seen), flush=True)
"""


def processes_with_env(entry: str):
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                yield proc
        except OSError:
            continue


def decode_address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """An address of /proc/net/tcp{,6} (host byte order, 32-bit words)."""
    host, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address, int(port, 16)


def listening_sockets(entry: str):
    """(address, port) of every TCP socket listened on by the processes whose environment holds `entry`."""
    inodes = set()
    for proc in processes_with_env(entry):
        try:
            links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        inodes.update(link[8:-1] for link in links if link.startswith("socket:["))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                found.append(decode_address(fields[1]))
    return found


@pytest.mark.slow
def test_private_local_ray_binds_loopback_only_without_dashboard(tmp_path):
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(TOY_ENV, RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(ray_tmp),
               PYTHONPATH=os.pathsep.join((str(ROOT), TOY_ENV["PYTHONPATH"])))
    driver = subprocess.Popen([sys.executable, "-c", LOCAL, *QUICK_TOY, f"output_dir={tmp_path / 'out'}",
                               "executor=ray"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert driver.stdout.readline() == "running\n"
        sockets = listening_sockets(f"RAY_TMPDIR={ray_tmp}")
        out, _ = driver.communicate("go\n", timeout=60)
    finally:
        driver.kill()
        driver.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["status"] == "ok"
    assert seen["nodes"] == [LOOPBACK] and seen["record"]["ip"] == LOOPBACK
    assert sockets and all(address.is_loopback for address, _ in sockets), sockets
    assert 8265 not in {port for _, port in sockets}  # no dashboard web server
    assert not seen["still_connected"]  # the executor stops the Ray it started


def sweep_on_cluster(planned, **options):
    """[(planned, outcome)] and the loop state of a sweep dispatched as `corescale run -m` does (run_sweep)."""
    from corescale.trials.sweep import run_sweep

    outcomes = []

    class Recorder(Listener):
        def finished(self, item, outcome, state):
            outcomes.append((item, outcome))

    return run_sweep(planned, Recorder(), **options), outcomes


@pytest.mark.slow
def test_resume_rerun_and_foreign_results_as_in_the_local_loop(cluster, tmp_path):
    """Resume counts a valid result only when measured on a machine and software of the trial's node type (or with
    accept_foreign); resume=False (--rerun) measures again."""
    out = tmp_path / "out"
    trials = trials_for(cluster.address, out, ["batch_size=4", "executor.node_type=a"])
    _, first = sweep_on_cluster(trials)
    assert len(first) == 1 and first[0][1].ok
    state, again = sweep_on_cluster(trials)
    assert again == [] and state.count("skipped") == 1
    _, rerun = sweep_on_cluster(trials, resume=False)
    assert len(rerun) == 1 and len(stored(out)) == 2
    for run in iter_run_dirs(out):  # as if both were measured on another machine
        data = raw_record(run)
        data["environment"]["cpu"]["model"] = "another CPU"
        (run / "result.json").write_text(json.dumps(data))
    _, foreign = sweep_on_cluster(trials)
    assert len(foreign) == 1 and len(stored(out)) == 3
    accepted, nothing = sweep_on_cluster(trials, accept_foreign=True, resume=True)
    assert nothing == [] and accepted.count("skipped") == 1


@pytest.mark.slow
def test_two_sweeps_on_one_folder_commit_each_key_once(cluster, tmp_path):
    """Two Ray sweeps started together both plan every trial; whichever measures a (trial, repeat) second finds
    the first's result under the commit lock (or before it submits) and commits nothing. (A local sweep beside
    them: test_sweep.py; this cluster's nodes are two machine kinds, whose results resume only on their kind.)"""
    import logging
    import threading

    from corescale.trials.ray import import_ray

    out = tmp_path / "out"
    ray = import_ray(loopback=True)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)  # shared by both
    states, errors = [], []

    def sweep():
        try:
            states.append(sweep_on_cluster(trials_for(cluster.address, out, ["batch_size=1,2"]))[0])
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=sweep) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(200)
    finally:
        ray.shutdown()
    assert not errors, errors
    keys = [(r["trial_key"], r["repeat"]) for r in stored(out)]
    assert len(keys) == 2 and len(set(keys)) == 2, keys  # each key committed once
    assert sum(state.count("skipped") for state in states) == 2  # the other sweep found each one


@pytest.mark.slow
def test_fail_fast_submits_nothing_after_the_first_failure(cluster, tmp_path):
    out = tmp_path / "out"
    bad = trials_for(cluster.address, out, ["threads=2", "executor.node_type=b"])  # fits the driver, not b
    good = trials_for(cluster.address, out, ["batch_size=1,2,3", "executor.node_type=a"])
    state, outcomes = sweep_on_cluster(bad + good, fail_fast=True)
    assert state.stopped and [o.ok for item, o in outcomes if item is bad[0]] == [False]
    assert len(outcomes) < 4 and len(stored(out)) == len(outcomes)  # the rest never ran


@pytest.mark.slow
def test_unknown_node_type_is_one_clear_error(cluster, tmp_path):
    from corescale.errors import UserError

    trials = trials_for(cluster.address, tmp_path / "out", ["executor.node_type=c5.metal"])
    with pytest.raises(UserError, match=r"no alive Ray node with resources corescale_node and "
                                        r"corescale_type:c5.metal \(2 corescale node\(s\) alive, types: a, b\)"):
        run_trials(trials)
    assert not (tmp_path / "out").exists()


def test_unreachable_cluster_fails_fast(tmp_path):
    from corescale.errors import UserError

    trials = trials_for("127.0.0.1:1", tmp_path / "out", ["batch_size=1"])
    started = time.monotonic()
    with pytest.raises(UserError, match=r"cannot reach the Ray cluster at '127.0.0.1:1' \(Connection refused\)"):
        run_trials(trials)
    assert time.monotonic() - started < 10


TUNE = [*QUICK_TOY, "duration=0.6", "tune.screen=0.3", "tune.top_k=1", "tune.repeats=2", "space.backend=[toy]",
        "space.precision=[fp32]", "space.batch_size=[1,2]", "--no-progress", "--no-report"]


@pytest.mark.slow
def test_tune_fans_out_over_each_node_type_and_ranks_them_by_cost(cluster, tmp_path):
    """Type b: the module's node on CPU 0. Type c: two nodes on CPU 1, so its trials fan out over them. The
    types' CPUs are apart, so they are tuned side by side."""
    added = []
    try:
        for _ in range(2):
            with affinity(CPUS[1:2]):
                added.append(cluster.cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK, resources={
                    "corescale_node": 1, "corescale_type:c": 1}))
        cluster.cluster.wait_for_nodes()
        out = tmp_path / "out"
        proc = corescale("tune", *TUNE, "trials=1", f"output_dir={out}", "executor=ray",
                         f"executor.address={cluster.address}", "executor.node_type=b,c",
                         "price_per_hour={b:0.2,c:0.3}", timeout=900)
    finally:
        for node in added:
            cluster.cluster.remove_node(node)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fleet_dir, = out.glob("tune-*")
    ranking = json.loads((fleet_dir / "node-types.json").read_text())
    by_type = {e["node_type"]: e for e in ranking["node_types"]}
    assert set(by_type) == {"b", "c"}
    assert (by_type["b"]["physical_cores"], by_type["c"]["physical_cores"]) == (1, 1)  # probed on the nodes
    assert (by_type["b"]["nodes"], by_type["c"]["nodes"]) == (1, 2)
    costs = [e["cost_per_1m"] for e in ranking["node_types"]]
    assert costs == sorted(costs) and [e["rank"] for e in ranking["node_types"]] == [1, 2]
    for e in ranking["node_types"]:  # the mean over the winner's repeats of price / rate
        doc = json.loads((fleet_dir / e["node_type"] / "tune.json").read_text())
        winner = next(f for f in [*doc["finalists"], doc["baseline"]] if f["role"] == "winner")
        rates = [json.loads((Path(p) / "result.json").read_text())["metrics"]["throughput_samples_per_s"]
                 for p in winner["paths"]]
        assert e["winner"] == winner["label"] and e["throughput"] == pytest.approx(sum(rates) / len(rates))
        costs = [e["price_per_hour"] / (rate * 3600) * 1e6 for rate in rates]
        assert e["cost_per_1m"] == pytest.approx(sum(costs) / len(costs), rel=1e-9)
    assert f"cheapest per 1M inferences: node type {ranking['node_types'][0]['node_type']}" in proc.stdout
    records = {}
    for node_type in ("b", "c"):
        doc = json.loads((fleet_dir / node_type / "tune.json").read_text())
        assert doc["node_type"] == node_type and doc["headline"][0].startswith(f"recommended on node type {node_type}")
        records[node_type] = iter_records(fleet_dir / node_type)
        assert records[node_type] and all(r["node"]["node_type"] == node_type and r["executor"]["name"] == "ray"
                                          for r in records[node_type])
        for r in records[node_type]:  # each type measured on its own nodes' CPUs
            assert r["environment"]["topology"]["physical_cores"] == 1
            assert r["plan"]["instances"][0]["cpus"] == ([CPUS[0]] if node_type == "b" else [CPUS[1]])
        for finalist in [*doc["finalists"], doc["baseline"]]:  # the final stage's repeats ran on the cluster too
            assert len(finalist["paths"]) == 2 and finalist["throughput"]["n"] == 2
    assert "tuned one after the other" not in proc.stderr
    assert any(dispatched_together(x["executor"], y["executor"]) for x in records["b"] for y in records["c"])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert {line[:4] for line in lines} == {"[b] ", "[c] "}  # each measurement's line says its node type
    spans = [dict(r["executor"], node=r["node"]["ray_node_id"]) for r in records["c"]]
    assert len({s["node"] for s in spans}) == 2
    for i, x in enumerate(spans):  # one trial per node at a time, the two nodes side by side
        for y in spans[i + 1:]:
            assert not (x["node"] == y["node"] and overlap(x, y))
    assert any(dispatched_together(x, y) for i, x in enumerate(spans) for y in spans[i + 1:])


def iter_records(folder):
    return [raw_record(d) for d in iter_run_dirs(folder)]


@pytest.mark.slow
def test_tune_refuses_nodes_of_one_type_that_differ(cluster, tmp_path):
    proc = corescale("tune", *TUNE, "trials=1", f"output_dir={tmp_path / 'out'}", "executor=ray",
                     f"executor.address={cluster.address}", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the nodes of type (any) differ" in proc.stderr and "a node type must be one machine kind" in proc.stderr
    assert not (tmp_path / "out").exists()
