"""Inside a container or cgroup, corescale uses only the CPUs and CPU time it is given (machine/cgroup.py): the
planner and `serve` place instances on the CPUs this process may use (never re-pinning outside them), size a
layout from the cgroup's CPU quota, and refuse in one line a layout whose busy threads exceed the quota. The
cgroup is described (a folder shaped like /sys/fs/cgroup and a /proc/self/cgroup text fed to the reader); the
cpuset is real (this process's affinity, as `taskset` sets it, and a real `taskset -c` in the slow test)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from corescale.cli import main
from corescale.errors import UserError
from corescale.machine import cgroup
from corescale.machine.placement import InstancePlacement, InstanceSpec, within_quota
from corescale.machine.topology import Topology

LSCPU = Path(__file__).parent / "data" / "c5_metal.lscpu"


def described(tmp_path: Path, files: dict[str, str], group: str) -> tuple[Path, Path]:
    """A cgroup mount holding `files` and the /proc/self/cgroup text naming `group` (v2's `0::GROUP`, or v1's
    lines when `group` is a dict-like 'controller=path;...' string)."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    if "=" in group:
        proc.write_text("".join(f"{n}:{item.split('=')[0]}:{item.split('=')[1]}\n"
                                for n, item in enumerate(group.split(";"), 1)))
    else:
        proc.write_text(f"0::{group}\n")
    return root, proc


KUBEPODS = "/kubepods.slice/pod1/ctr"


def test_v2_reads_its_own_group_and_the_smallest_quota_on_the_path(tmp_path):
    root, proc = described(tmp_path, {
        "cgroup.controllers": "cpuset cpu memory\n", "cpu.max": "max 100000\n",
        "cpuset.cpus.effective": "0-15\n",
        "kubepods.slice/cpu.max": "max 100000\n",
        "kubepods.slice/pod1/cpu.max": "400000 100000\n",
        "kubepods.slice/pod1/ctr/cpu.max": "150000 100000\n",
        "kubepods.slice/pod1/ctr/cpuset.cpus.effective": "4-5\n"}, KUBEPODS)
    limits = cgroup.read_limits(root, proc)
    assert limits.cpus == (4, 5) and limits.quota == 1.5
    assert limits.where == str(root / "kubepods.slice/pod1/ctr/cpu.max")
    (root / "kubepods.slice/pod1/cpu.max").write_text("50000 100000\n")  # a parent's smaller limit binds
    assert cgroup.read_limits(root, proc).quota == 0.5


def test_v2_in_its_own_namespace_reads_the_mount_root(tmp_path):
    root, proc = described(tmp_path, {"cgroup.controllers": "cpu\n", "cpu.max": "200000 100000\n",
                                      "cpuset.cpus.effective": "2-3\n"}, "/not/under/this/mount")
    assert cgroup.read_limits(root, proc) == cgroup.CgroupLimits((2, 3), 2.0, str(root / "cpu.max"))


def test_v1_reads_the_cpu_and_cpuset_hierarchies(tmp_path):
    root, proc = described(tmp_path, {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpuset/cpuset.effective_cpus": "0-63\n", "cpuset/docker/abc/cpuset.effective_cpus": "8-11\n"},
        "cpu,cpuacct=/docker/abc;cpuset=/docker/abc")
    assert cgroup.read_limits(root, proc) == cgroup.CgroupLimits(
        (8, 9, 10, 11), 2.5, str(root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us"))


@pytest.mark.parametrize("text", ["max 100000", "lots 100000", "0 100000", "-1", ""])
def test_no_quota_or_an_unreadable_one_is_none(tmp_path, text):
    root, proc = described(tmp_path, {"cgroup.controllers": "cpu\n", "cpu.max": text}, "/")
    assert cgroup.read_limits(root, proc).quota is None


def test_a_quota_smaller_than_the_layout_is_one_line():
    limits = cgroup.CgroupLimits(None, 1.5, "/sys/fs/cgroup/cpu.max")
    cgroup.check_quota(1, "the layout", limits)
    with pytest.raises(UserError) as info:
        cgroup.check_quota(2, "the layout", limits)
    message = str(info.value)
    assert "\n" not in message and "2 busy thread(s), more than the 1.5 CPU(s)" in message
    assert "/sys/fs/cgroup/cpu.max" in message and "at most 1 thread(s)" in message


def test_a_layout_sized_from_the_machine_stays_within_the_quota():
    topology = Topology.from_lscpu(LSCPU.read_text())  # 2 sockets x 24 cores, 2 threads each
    assert within_quota(topology, None) is topology
    cores = within_quota(topology, 2.5).physical_cores
    assert len(cores) == 2 and all(len(core) == 2 for core in cores)  # one busy thread per core: 2 cores
    assert len(within_quota(topology, 2.5, use_logical_cores=True).physical_cores) == 1  # 2 siblings busy
    assert len(within_quota(topology, 0.5).physical_cores) == 1  # at least one (check_quota refuses it)


@pytest.fixture
def fake_cgroup(tmp_path, monkeypatch):
    """This process's cgroup, as every reader sees it, is a described one with the given cpu.max."""

    def make(quota: str) -> None:
        root, proc = described(tmp_path, {"cgroup.controllers": "cpu\n", "cpu.max": quota}, "/")
        monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(root))
        monkeypatch.setattr(cgroup, "PROC_CGROUP", str(proc))
    return make


def plan_json(capsys, *words: str) -> dict:
    assert main(["plan", "--json", *words]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_planner_sizes_from_the_quota_and_refuses_a_layout_over_it(fake_cgroup, capsys):
    usable = len(Topology.from_sysfs().physical_cores)
    fake_cgroup("100000 100000\n")  # one CPU of CPU time
    (only,) = plan_json(capsys)["instances"]  # sized from the machine: one core, not every core
    assert only["threads"] == 1
    if usable < 2:
        pytest.skip("this process may use one core: a 2-instance layout cannot be placed anyway")
    assert main(["plan", "instances=2", "cores_per_instance=1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "runs 2 busy thread(s), more than the 1 CPU(s) of CPU time" in err[0]
    fake_cgroup("max 100000\n")
    assert len(plan_json(capsys, "instances=2", "cores_per_instance=1")["instances"]) == 2


@pytest.fixture
def one_cpu():
    """This process may use one CPU (as under `taskset -c N`), for the test."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    yield cpu
    os.sched_setaffinity(0, before)


def test_the_planner_uses_only_the_cpus_this_process_may_use(one_cpu, capsys):
    (only,) = plan_json(capsys)["instances"]
    assert only["cpus"] == [one_cpu]
    assert main(["plan", "instances=2"]) == 2
    assert "cannot place 2 instances" in capsys.readouterr().err


def spec(cpus: list[int], id_: int = 0) -> InstanceSpec:
    return InstanceSpec(InstancePlacement(id_, tuple(cpus), (0,), len(cpus)), len(cpus), 1)


def test_serve_places_a_bundle_on_the_cpus_it_was_given(one_cpu, tmp_path):
    from corescale.serve.opened import placed_here

    recorded = [spec([4095])]  # measured on a CPU this process may not use (a container's cpuset, taskset)
    placed, said = placed_here(tmp_path, recorded, logical=False)
    assert [list(s.cpus) for s in placed] == [[one_cpu]] and placed[0].threads == 1
    assert len(said) == 1 and "placed on" in said[0] and str(one_cpu) in said[0]
    unchanged, nothing = placed_here(tmp_path, [spec([one_cpu])], logical=False)
    assert [list(s.cpus) for s in unchanged] == [[one_cpu]] and nothing == []
    with pytest.raises(UserError, match="do not fit the CPUs this process may use"):  # never outside them
        placed_here(tmp_path, [spec([4094], 0), spec([4095], 1)], logical=False)


def test_serve_refuses_a_bundle_over_the_quota(fake_cgroup, tmp_path):
    from corescale.serve.opened import placed_here

    fake_cgroup("50000 100000\n")
    cpu = min(os.sched_getaffinity(0))
    with pytest.raises(UserError, match=r"runs 1 busy thread\(s\), more than the 0.5 CPU\(s\)"):
        placed_here(tmp_path, [spec([cpu])], logical=False)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs util-linux's taskset")
def test_a_real_taskset():
    """`taskset -c N corescale plan`: the real command, pinned from outside, plans on that CPU only and refuses
    in one line a layout that does not fit."""
    cpu = str(min(os.sched_getaffinity(0)))

    def pinned(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["taskset", "-c", cpu, sys.executable, "-m", "corescale.cli", *args],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    proc = pinned("plan", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [i["cpus"] for i in json.loads(proc.stdout)["instances"]] == [[int(cpu)]]
    proc = pinned("plan", "instances=2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot place 2 instances" in proc.stderr


def one_block_on(source: Path, where: Path, cpu: int) -> Path:
    """A copy of a measured bundle whose layout is one instance of one thread on `cpu` (manifest and record
    alike, re-hashed): a bundle measured on that CPU."""
    from corescale.serve import bundle

    root = where / "bundle"
    shutil.copytree(source, root)
    record = json.loads((root / bundle.RECORD).read_text())
    record["specs"] = [{**record["specs"][0], "cpus": [cpu], "cpulist": str(cpu), "threads": 1}]
    (root / bundle.RECORD).write_text(json.dumps(record))
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    first = manifest["layout"]["instances"][0]
    manifest["layout"]["instances"] = [{**first, "cpus": [cpu], "threads": 1, "command_prefix": []}]
    manifest["files"][bundle.RECORD] = bundle.sha256(root / bundle.RECORD)
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))
    return root


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one measured on, another given")
def test_serve_runs_a_bundle_on_the_cpu_its_container_was_given(tiny_bundle, tmp_path):
    """A bundle measured on one CPU, served where this process may use only another (as in a pod of the static
    CPU manager, or under taskset): the instance runs on the CPU given, says so, and answers."""
    import httpx
    from serving import Service

    measured, given = sorted(os.sched_getaffinity(0))[0], sorted(os.sched_getaffinity(0))[-1]
    bundle = one_block_on(tiny_bundle("embed"), tmp_path, measured)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {given})  # the service inherits it, as from `taskset -c GIVEN`
    try:
        service = Service(bundle, tmp_path / "serve.log")
    finally:
        os.sched_setaffinity(0, before)
    with service:
        info = httpx.get(f"{service.url}/info", timeout=30).json()
        assert [i["cpus"] for i in info["corescale"]["layout"]["instances"]] == [[given]]
        answer = httpx.post(f"{service.url}/embed", json={"inputs": "a pinned block"}, timeout=60)
        assert answer.status_code == 200, answer.text
    assert f"placed on {given}" in (tmp_path / "serve.log").read_text()


V1_CPU = Path("/sys/fs/cgroup/cpu")


def writable_v1_cpu() -> bool:
    return V1_CPU.is_dir() and (V1_CPU / "cpu.cfs_quota_us").is_file() and os.access(V1_CPU, os.W_OK)


@pytest.mark.slow
@pytest.mark.skipif(not writable_v1_cpu(), reason="needs a writable cgroup v1 cpu hierarchy (a described one: above)")
def test_a_real_cgroup_quota():
    """`corescale plan` in a real cgroup of one CPU of CPU time (cfs quota 100 ms per 100 ms): a layout sized from
    the machine gets one thread, one of two busy threads is refused in one line."""
    group = V1_CPU / f"corescale-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000\n")
        (group / "cpu.cfs_quota_us").write_text("100000\n")

        def inside(*args: str) -> subprocess.CompletedProcess:
            def join() -> None:
                (group / "cgroup.procs").write_text(f"{os.getpid()}\n")

            return subprocess.run([sys.executable, "-m", "corescale.cli", *args], capture_output=True, text=True,
                                  timeout=300, cwd=ROOT, preexec_fn=join)

        proc = inside("plan", "--json")
        assert proc.returncode == 0, proc.stderr
        assert [i["threads"] for i in json.loads(proc.stdout)["instances"]] == [1]
        if len(Topology.from_sysfs().physical_cores) >= 2:
            proc = inside("plan", "instances=2", "cores_per_instance=1")
            assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
            assert "more than the 1 CPU(s) of CPU time" in proc.stderr and str(group) in proc.stderr
    finally:
        group.rmdir()
