import os
import sys
from pathlib import Path

import pytest

from corescale.errors import UserError
from corescale.machine.topology import Cpu, Topology, cgroup_cpu_quota, cgroup_cpuset, default_allowed

DATA = Path(__file__).parent / "data"


def lscpu(name: str, allowed=None) -> Topology:
    return Topology.from_lscpu((DATA / name).read_text(), allowed=allowed)


def fake_sysfs(tmp_path, cpus, online="default", nodes=None, siblings=True):
    """Build a sysfs tree. cpus: {cpu: (package, core_id)}; siblings share (package, core_id)."""
    root, node_root = tmp_path / "cpu", tmp_path / "node"
    root.mkdir()
    node_root.mkdir()
    if online is not None:
        (root / "online").write_text((",".join(map(str, sorted(cpus))) if online == "default" else online) + "\n")
    for cpu, (package, core_id) in cpus.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core_id}\n")
        if siblings:
            sib = [c for c, key in cpus.items() if key == (package, core_id)]
            (topo / "thread_siblings_list").write_text(",".join(map(str, sib)) + "\n")
    for node, cpulist in (nodes or {}).items():
        (node_root / f"node{node}").mkdir()
        (node_root / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    return root, node_root


# ---- lscpu machines ------------------------------------------------------------------------------


def test_c5_metal_siblings_plus_48():
    t = lscpu("c5_metal.lscpu")
    assert t.cpu_ids == tuple(range(96))
    assert t.sockets == (0, 1)
    assert t.numa_nodes == (0, 1)
    assert len(t.physical_cores) == 48
    assert t.physical_cores[0] == (0, 48)
    assert t.physical_cores[47] == (47, 95)
    assert t.cores_in_node(0) == tuple((i, i + 48) for i in range(24))
    assert t.cores_in_node(1)[0] == (24, 72)
    assert t.cores_in_node(5) == ()
    assert t.summary() == "2 sockets, 2 NUMA nodes, 48 physical cores, 96 logical CPUs usable"


def test_c5_metal_siblings_adjacent():
    t = lscpu("c5_metal_adjacent.lscpu")
    assert len(t.physical_cores) == 48
    assert t.physical_cores[:2] == ((0, 1), (2, 3))
    assert t.cores_in_node(1)[0] == (48, 49)
    assert {c.node for c in t.cpus if c.id < 48} == {0}
    assert t.summary() == "2 sockets, 2 NUMA nodes, 48 physical cores, 96 logical CPUs usable"


def test_eight_nodes_default_lscpu_format():
    t = lscpu("eight_nodes.lscpu")  # plain `lscpu -p`: "# CPU,Core,Socket,Node,,L1d,L1i,L2,L3"
    assert t.sockets == (0, 1)
    assert t.numa_nodes == tuple(range(8))
    assert all(len(t.cores_in_node(n)) == 6 for n in range(8))
    assert t.cores_in_node(3) == tuple((i, i + 48) for i in range(18, 24))
    assert t.summary() == "2 sockets, 8 NUMA nodes, 48 physical cores, 96 logical CPUs usable"


def test_cpuset_allowed_computes_cores_from_allowed_cpus_only():
    allowed = {3, 5, 7, 8, 9}  # cgroup cpuset "3,5,7-9"
    t = lscpu("c5_metal.lscpu", allowed=allowed)
    assert t.cpu_ids == (3, 5, 7, 8, 9)
    assert t.physical_cores == ((3,), (5,), (7,), (8,), (9,))  # siblings 51.. are not usable
    assert t.summary() == "1 socket, 1 NUMA node, 5 physical cores, 5 logical CPUs usable"
    t = lscpu("c5_metal_adjacent.lscpu", allowed=allowed)
    assert t.physical_cores == ((3,), (5,), (7,), (8, 9))
    assert t.summary() == "1 socket, 1 NUMA node, 4 physical cores, 5 logical CPUs usable"
    t = lscpu("c5_metal.lscpu", allowed={3, 51, 30})
    assert t.physical_cores == ((3, 51), (30,))
    assert t.numa_nodes == (0, 1)


def test_allowed_outside_machine_is_ignored_but_none_is_an_error():
    assert lscpu("c5_metal.lscpu", allowed={0, 500}).cpu_ids == (0,)
    with pytest.raises(UserError) as e:
        lscpu("c5_metal.lscpu", allowed={200, 201})
    assert "none of the allowed CPUs (200-201) exist on this machine (CPUs: 0-95" in str(e.value)


def test_single_cpu_machine():
    t = Topology.from_lscpu("# CPU,Core,Socket,Node\n0,0,0,0\n")
    assert t.cpus == (Cpu(id=0, core=0, socket=0, node=0),)
    assert t.physical_cores == ((0,),)
    assert t.summary() == "1 socket, 1 NUMA node, 1 physical core, 1 logical CPU usable"


def test_lscpu_empty_node_online_column_and_stripped_comments():
    t = Topology.from_lscpu("# CPU,Core,Socket,Node\n0,0,0,\n1,1,0,\n")
    assert t.numa_nodes == (0,)
    text = "# CPU,Core,Socket,Node,Online\n0,0,0,0,Y\n1,1,0,0,N\n2,-,-,-,N\n3,3,0,0,Y\n"
    assert Topology.from_lscpu(text).cpu_ids == (0, 3)
    assert Topology.from_lscpu("0,0,0,0\n1,0,0,0\n2,1,0,0,N\n").physical_cores == ((0, 1),)
    reordered = "# Node,Socket,CPU,Core\n1,0,5,9\n1,0,6,9\n"
    assert Topology.from_lscpu(reordered).cpus == (Cpu(5, 9, 0, 1), Cpu(6, 9, 0, 1))


@pytest.mark.parametrize(
    "text, message",
    [
        ("# CPU,Node\n0,0\n", "lscpu output lacks column(s) CORE, SOCKET: run `lscpu -p=CPU,CORE,SOCKET,NODE`"),
        ("# CPU,Core,Socket,Node\n0,x,0,0\n", "lscpu line 2: bad CORE value 'x'"),
        ("# CPU,Core,Socket,Node\n0,0\n", "lscpu line 2: expected 4 columns, got 2"),
        ("# CPU,Core,Socket,Node\n0,0,-,0\n", "lscpu line 2: bad SOCKET value '-'"),
        ("# CPU,Core,Socket,Node\n", "lscpu output lists no online CPUs"),
        ("", "lscpu output lists no online CPUs"),
        ("# CPU,Core,Socket,Node\n0,0,0,0\n0,1,0,0\n", "inconsistent lscpu output: duplicate CPU ids"),
        ("# CPU,Core,Socket,Node\n0,0,0,0\n1,0,0,1\n", "inconsistent lscpu output: core 0 spans"),
    ],
)
def test_lscpu_errors(text, message):
    with pytest.raises(UserError) as e:
        Topology.from_lscpu(text)
    assert message in str(e.value)


def test_topology_sorts_and_validates():
    t = Topology((Cpu(2, 1, 0, 0), Cpu(0, 0, 0, 0), Cpu(1, 1, 0, 0)))
    assert t.cpu_ids == (0, 1, 2)
    assert t.physical_cores == ((0,), (1, 2))
    with pytest.raises(ValueError):
        Topology((Cpu(0, 0, 0, 0), Cpu(0, 1, 0, 0)))


# ---- sysfs -----------------------------------------------------------------------------------------


def two_socket_smt(tmp_path, **kw):
    # 2 packages x 2 cores x SMT2; core_id repeats across packages (0,1 in each).
    cpus = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)}
    return fake_sysfs(tmp_path, cpus, nodes={0: "0-1,4-5", 1: "2-3,6-7"}, **kw)


@pytest.mark.parametrize("siblings", [True, False])
def test_sysfs_core_keys_unique_across_packages(tmp_path, siblings):
    root, node_root = two_socket_smt(tmp_path, siblings=siblings)
    t = Topology.from_sysfs(root, node_root, allowed=range(8))
    assert t.physical_cores == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert t.sockets == (0, 1)
    assert t.cores_in_node(1) == ((2, 6), (3, 7))
    assert t.summary() == "2 sockets, 2 NUMA nodes, 4 physical cores, 8 logical CPUs usable"


def test_sysfs_offline_cpus_are_excluded(tmp_path):
    root, node_root = two_socket_smt(tmp_path, online="0-2,4-5,7")
    t = Topology.from_sysfs(root, node_root, allowed=range(8))
    assert t.cpu_ids == (0, 1, 2, 4, 5, 7)
    assert t.physical_cores == ((0, 4), (1, 5), (2,), (7,))


def test_sysfs_without_online_file_uses_per_cpu_flags(tmp_path):
    root, node_root = two_socket_smt(tmp_path, online=None)
    (root / "cpu6" / "online").write_text("0\n")
    (root / "cpu1" / "online").write_text("1\n")
    assert Topology.from_sysfs(root, node_root, allowed=range(8)).cpu_ids == (0, 1, 2, 3, 4, 5, 7)


def test_sysfs_single_cpu_without_numa_or_topology(tmp_path):
    root = tmp_path / "cpu"
    (root / "cpu0").mkdir(parents=True)
    (root / "online").write_text("0\n")
    t = Topology.from_sysfs(root, tmp_path / "no-node-dir", allowed={0})
    assert t.cpus == (Cpu(id=0, core=0, socket=0, node=0),)


def test_sysfs_allowed_and_errors(tmp_path):
    root, node_root = two_socket_smt(tmp_path)
    t = Topology.from_sysfs(root, node_root, allowed={0, 3, 4})
    assert t.physical_cores == ((0, 4), (3,))
    with pytest.raises(UserError, match=r"none of the allowed CPUs \(8-9\) exist on this machine \(CPUs: 0-7"):
        Topology.from_sysfs(root, node_root, allowed={8, 9})
    with pytest.raises(UserError, match="cannot read the CPU list"):
        Topology.from_sysfs(tmp_path / "missing", node_root, allowed={0})


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_sysfs_default_allowed_uses_cgroup_cpuset_file(tmp_path):
    root, node_root = two_socket_smt(tmp_path)
    affinity = os.sched_getaffinity(0)
    if min(affinity) > 7:
        pytest.skip("this process may not run on any CPU of the fake 8-CPU tree")
    cpuset = tmp_path / "cpuset.cpus.effective"
    cpuset.write_text(f"{min(affinity)}\n")
    t = Topology.from_sysfs(root, node_root, cgroup_cpuset_paths=[tmp_path / "absent", cpuset])
    assert t.cpu_ids == (min(affinity),)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_default_allowed(tmp_path):
    affinity = frozenset(os.sched_getaffinity(0))
    assert default_allowed([tmp_path / "absent"]) == affinity
    (tmp_path / "one").write_text(f"{min(affinity)}\n")
    assert default_allowed([tmp_path / "one"]) == {min(affinity)}
    (tmp_path / "foreign").write_text("65000\n")  # disjoint from affinity: ignored
    assert default_allowed([tmp_path / "foreign"]) == affinity
    (tmp_path / "empty").write_text("\n")
    assert cgroup_cpuset([tmp_path / "empty", tmp_path / "one"]) == (min(affinity),)
    assert cgroup_cpuset([tmp_path / "absent"]) is None


@pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/sys/devices/system/cpu/online").exists(),
                    reason="needs Linux sysfs")
def test_real_machine():
    t = Topology.from_sysfs()
    assert t.cpu_ids == tuple(sorted(os.sched_getaffinity(0)))
    assert sum(len(core) for core in t.physical_cores) == len(t.cpus)
    assert sorted(cpu for core in t.physical_cores for cpu in core) == list(t.cpu_ids)
    assert t.summary().endswith("logical CPUs usable") or len(t.cpus) == 1


# ---- cgroup CPU quota ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "files, quota",
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "50000 100000\n"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "25000\n", "cpu,cpuacct/cpu.cfs_period_us": "50000\n"}, 0.5),
        ({"cpu.max": "lots 100000\n"}, None),  # unreadable: no limit rather than a crash
        ({}, None),
    ],
)
def test_cgroup_cpu_quota(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota
