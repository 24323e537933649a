import json
from pathlib import Path

import pytest

from corescale.errors import UserError
from corescale.machine.placement import InstancePlacement, Plan, plan
from corescale.machine.topology import Topology

DATA = Path(__file__).parent / "data"


def machine(name: str, allowed=None) -> Topology:
    return Topology.from_lscpu((DATA / name).read_text(), allowed=allowed)


C5 = machine("c5_metal.lscpu")  # 2 sockets x 24 cores, sibling of i is i+48, node = socket
ADJ = machine("c5_metal_adjacent.lscpu")  # same, siblings 2k/2k+1
EIGHT = machine("eight_nodes.lscpu")  # 8 NUMA nodes of 6 cores, siblings +48
ONE = Topology.from_lscpu("# CPU,Core,Socket,Node\n0,0,0,0\n")
CPUSET = machine("c5_metal_adjacent.lscpu", allowed={3, 5, 7, 8, 9})  # cores (3) (5) (7) (8,9)


def cpus(p: Plan) -> list[tuple[int, ...]]:
    return [i.cpus for i in p.instances]


def rng(a: int, b: int, step: int = 1) -> tuple[int, ...]:
    return tuple(range(a, b + 1, step))


# ---- explicit instances x cores ------------------------------------------------------------------


def test_default_is_one_instance_on_every_core():
    p = plan(C5)
    assert cpus(p) == [rng(0, 47)]  # first sibling of each core
    assert p.instances[0].numa_nodes == (0, 1)
    assert p.instances[0].threads == 48
    assert p.warnings == ("instance 0 spans NUMA nodes 0,1 (needs 48 cores; largest free node has 24)",)


def test_two_instances_one_per_node():
    p = plan(C5, instances=2)
    assert cpus(p) == [rng(0, 23), rng(24, 47)]
    assert [i.numa_nodes for i in p.instances] == [(0,), (1,)]
    assert p.warnings == ()
    assert cpus(plan(ADJ, instances=2)) == [rng(0, 46, 2), rng(48, 94, 2)]


def test_logical_cores_take_all_siblings():
    p = plan(C5, instances=2, use_logical_cores=True)
    assert cpus(p) == [rng(0, 23) + rng(48, 71), rng(24, 47) + rng(72, 95)]
    assert [i.threads for i in p.instances] == [48, 48]
    assert cpus(plan(ADJ, instances=2, cores_per_instance=2, use_logical_cores=True)) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_cores_per_instance_and_first_fit_over_nodes():
    p = plan(EIGHT, instances=3, cores_per_instance=4)
    assert cpus(p) == [rng(0, 3), rng(6, 9), rng(12, 15)]  # node 0 has 2 left: next node
    p = plan(EIGHT, instances=16, cores_per_instance=3)
    assert [i.numa_nodes for i in p.instances] == [(n,) for n in range(8) for _ in range(2)]
    assert p.warnings == ()
    p = plan(C5, instances=2, cores_per_instance=20)
    assert [i.numa_nodes for i in p.instances] == [(0,), (1,)]


def test_numa_spanning_warning():
    p = plan(C5, instances=3, cores_per_instance=16)
    assert cpus(p) == [rng(0, 15), rng(24, 39), rng(16, 23) + rng(40, 47)]
    assert p.instances[2].numa_nodes == (0, 1)
    assert p.warnings == ("instance 2 spans NUMA nodes 0,1 (needs 16 cores; largest free node has 8)",)
    p = plan(EIGHT, instances=5, cores_per_instance=6)  # fits node by node: no warning
    assert p.warnings == ()
    p = plan(EIGHT, instances=4, cores_per_instance=9)  # each spans the fewest nodes, largest free first
    assert [i.numa_nodes for i in p.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert p.instances[0].cpus == rng(0, 8)
    assert p.warnings[1] == "instance 1 spans NUMA nodes 2,3 (needs 9 cores; largest free node has 6)"
    p = plan(EIGHT, instances=5, cores_per_instance=9)  # the 5th gathers 3-core leftovers of 3 nodes
    assert p.instances[4].cpus == rng(9, 11) + rng(21, 23) + rng(33, 35)
    assert p.warnings[4] == "instance 4 spans NUMA nodes 1,3,5 (needs 9 cores; largest free node has 3)"


def test_cpuset_machine():
    assert cpus(plan(CPUSET)) == [(3, 5, 7, 8)]
    assert cpus(plan(CPUSET, use_logical_cores=True)) == [(3, 5, 7, 8, 9)]
    assert cpus(plan(CPUSET, layout="max", use_logical_cores=True)) == [(3,), (5,), (7,), (8, 9)]
    assert cpus(plan(CPUSET, instances=2)) == [(3, 5), (7, 8)]


def test_single_cpu_machine():
    for layout in (None, "latency", "throughput", "max"):
        p = plan(ONE, layout=layout)
        assert cpus(p) == [(0,)]
        assert p.instances[0].numa_nodes == (0,)
    assert plan(ONE, layout="latency").warnings == (
        "layout 'latency' wants 4 cores per instance; only 1 usable, using 1",
    )


# ---- layouts ----------------------------------------------------------------------------------------


def test_latency_layout():
    p = plan(C5, layout="latency")
    assert len(p.instances) == 12
    assert p.instances[0].cpus == rng(0, 3)
    assert p.instances[6].cpus == rng(24, 27)
    assert p.warnings == ()
    p = plan(C5, layout="latency", use_logical_cores=True)
    assert p.instances[0].cpus == rng(0, 3) + rng(48, 51)
    assert p.instances[0].threads == 8
    assert cpus(plan(C5, layout="latency", instances=2)) == [rng(0, 3), rng(4, 7)]


def test_latency_layout_does_not_span_nodes_by_default():
    p = plan(EIGHT, layout="latency")  # 6-core nodes: one 4-core instance each
    assert [i.cpus[0] for i in p.instances] == [0, 6, 12, 18, 24, 30, 36, 42]
    assert p.warnings == ()
    p = plan(EIGHT, layout="latency", instances=9)  # asked for more: the 9th spans
    assert p.instances[8].cpus == (4, 5, 10, 11)
    assert p.warnings == ("instance 8 spans NUMA nodes 0,1 (needs 4 cores; largest free node has 2)",)
    small_nodes = machine("eight_nodes.lscpu", allowed={0, 1, 2, 6, 7, 8})  # 2 nodes of 3 cores
    p = plan(small_nodes, layout="latency")
    assert cpus(p) == [(0, 1, 2, 6)]
    assert p.warnings == ("instance 0 spans NUMA nodes 0,1 (needs 4 cores; largest free node has 3)",)


def test_throughput_layout():
    assert cpus(plan(C5, layout="throughput")) == [rng(0, 23), rng(24, 47)]
    p = plan(EIGHT, layout="throughput", use_logical_cores=True)
    assert len(p.instances) == 8
    assert p.instances[3].cpus == rng(18, 23) + rng(66, 71)
    assert p.instances[3].numa_nodes == (3,)
    uneven = machine("c5_metal.lscpu", allowed=set(rng(0, 3)) | {24, 25, 72})
    p = plan(uneven, layout="throughput", use_logical_cores=True)
    assert cpus(p) == [(0, 1, 2, 3), (24, 25, 72)]
    assert [i.threads for i in p.instances] == [4, 3]


def test_max_layout():
    p = plan(C5, layout="max")
    assert cpus(p) == [(i,) for i in range(48)]
    assert [i.numa_nodes for i in p.instances] == [(0,)] * 24 + [(1,)] * 24
    assert cpus(plan(C5, layout="max", use_logical_cores=True))[47] == (47, 95)
    assert cpus(plan(C5, layout="max", instances=3)) == [(0,), (1,), (2,)]


# ---- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topology, kwargs, message",
    [
        (C5, dict(instances=8, cores_per_instance=7),
         "cannot place 8 instances x 7 cores: 48 physical cores usable (2 sockets, 2 NUMA nodes of 24); "
         "at most 6 instances of 7 cores fit"),
        (C5, dict(instances=49),
         "cannot place 49 instances: 48 physical cores usable (2 sockets, 2 NUMA nodes of 24); "
         "at most 48 instances of 1 core fit"),
        (C5, dict(cores_per_instance=49), "cannot place 1 instance x 49 cores: 48 physical cores usable"),
        (C5, dict(cores_per_instance=49), "no instance of 49 cores fits"),
        (C5, dict(instances=2, cores_per_instance=25), "at most 1 instance of 25 cores fits"),
        (C5, dict(layout="latency", instances=13), "cannot place 13 instances x 4 cores"),
        (C5, dict(layout="max", instances=49), "cannot place 49 instances x 1 core"),
        (EIGHT, dict(instances=9, cores_per_instance=6), "(2 sockets, 8 NUMA nodes of 6)"),
        (ONE, dict(instances=2), "1 physical core usable (1 socket, 1 NUMA node of 1)"),
        (machine("c5_metal.lscpu", allowed={0, 1, 2, 24}), dict(instances=5), "2 NUMA nodes of 3+1"),
        (C5, dict(layout="fast"), "unknown layout 'fast': expected one of latency, throughput, max"),
        (C5, dict(instances=0), "instances must be a whole number >= 1 (got 0)"),
        (C5, dict(instances=-2), "instances must be a whole number >= 1 (got -2)"),
        (C5, dict(instances="4"), "instances must be a whole number >= 1 (got '4')"),
        (C5, dict(instances=True), "instances must be a whole number >= 1 (got True)"),
        (C5, dict(cores_per_instance=0), "cores_per_instance must be a whole number >= 1 (got 0)"),
        (C5, dict(layout="throughput", instances=2), "layout 'throughput' runs one instance per NUMA node"),
        (C5, dict(layout="throughput", cores_per_instance=2), "do not also set instances or cores_per_instance"),
        (C5, dict(layout="latency", cores_per_instance=2),
         "layout 'latency' uses 4 cores per instance: do not also set cores_per_instance"),
        (C5, dict(layout="max", cores_per_instance=1), "layout 'max' uses 1 core per instance"),
    ],
)
def test_errors(topology, kwargs, message):
    with pytest.raises(UserError) as e:
        plan(topology, **kwargs)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


# ---- invariants and output -------------------------------------------------------------------------

CASES = [
    (t, kw, logical)
    for t in (C5, ADJ, EIGHT, ONE, CPUSET)
    for kw in (
        {},
        {"instances": 2},
        {"instances": 3},
        {"instances": 5, "cores_per_instance": 1},
        {"layout": "latency"},
        {"layout": "throughput"},
        {"layout": "max"},
    )
    for logical in (False, True)
    if len(t.physical_cores) >= kw.get("instances", 1) * kw.get("cores_per_instance", 1)
]


@pytest.mark.parametrize("topology, kwargs, logical", CASES)
def test_invariants(topology, kwargs, logical):
    p = plan(topology, use_logical_cores=logical, **kwargs)
    assert p == plan(topology, use_logical_cores=logical, **kwargs)  # deterministic
    node_of = {c.id: c.node for c in topology.cpus}
    used = [cpu for inst in p.instances for cpu in inst.cpus]
    assert len(used) == len(set(used))  # no overlap
    assert set(used) <= set(topology.cpu_ids)
    for n, inst in enumerate(p.instances):
        assert inst.id == n
        assert inst.cpus == tuple(sorted(inst.cpus))
        assert inst.threads == len(inst.cpus)
        assert inst.numa_nodes == tuple(sorted({node_of[c] for c in inst.cpus}))
        assert (len(inst.numa_nodes) > 1) == any(w.startswith(f"instance {n} spans") for w in p.warnings)
    cores = {cpu: core for core in topology.physical_cores for cpu in core}
    used_cores = {cores[c] for c in used}
    if logical:  # all usable siblings of each used core
        assert set(used) == {cpu for core in used_cores for cpu in core}
    else:  # exactly the first sibling of each used core
        assert set(used) == {core[0] for core in used_cores}


def test_plan_rejects_overlap_and_bad_threads():
    a = InstancePlacement(id=0, cpus=(0, 1), numa_nodes=(0,), threads=2)
    b = InstancePlacement(id=1, cpus=(1, 2), numa_nodes=(0,), threads=2)
    with pytest.raises(ValueError, match="overlaps CPUs 1"):
        Plan(instances=(a, b))
    with pytest.raises(ValueError):
        InstancePlacement(id=0, cpus=(0, 1), numa_nodes=(0,), threads=3)


def test_to_dict_shape():
    p = plan(C5, instances=3, cores_per_instance=16)
    d = p.to_dict()
    assert set(d) == {"instances", "warnings"}
    assert d["instances"][0] == {
        "id": 0,
        "cpus": list(range(16)),
        "cpulist": "0-15",
        "numa_nodes": [0],
        "threads": 16,
    }
    assert d["instances"][2]["cpulist"] == "16-23,40-47"
    assert d["warnings"] == list(p.warnings)
    assert json.loads(json.dumps(d)) == d
