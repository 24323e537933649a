"""`corescale plan`: placement for this machine or for one described by `lscpu -p` output."""

import json
from pathlib import Path

import pytest
from helpers import corescale

from corescale.cli import main

C5 = str(Path(__file__).parent / "data" / "c5_metal.lscpu")  # 2 sockets x 24 cores, node = socket


@pytest.fixture
def plan_json(capsys):
    def run(*args):
        assert main(["plan", *args, "--json"]) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    return run


def test_json_plan_for_c5_metal(plan_json):
    doc = plan_json("instances=8", "cores_per_instance=6", "--lscpu", C5)
    instances = doc["instances"]
    assert [i["id"] for i in instances] == list(range(8))
    assert instances[0]["cpus"] == list(range(0, 6)) and instances[0]["numa_nodes"] == [0]
    assert instances[4]["cpus"] == list(range(24, 30)) and instances[4]["numa_nodes"] == [1]
    assert all(i["threads"] == 6 for i in instances)
    assert {"id", "cpus", "numa_nodes", "threads"} <= set(instances[0])
    assert doc["warnings"] == []
    assert doc["topology"].startswith("2 sockets, 2 NUMA nodes, 48 physical cores")


def test_json_plan_with_allowed_cpus_and_threads_override(plan_json):
    doc = plan_json("layout=latency", "threads=2", "--lscpu", C5, "--allowed-cpus", "0-7,24-27")
    assert [i["cpus"] for i in doc["instances"]] == [[0, 1, 2, 3], [4, 5, 6, 7], [24, 25, 26, 27]]
    assert [i["numa_nodes"] for i in doc["instances"]] == [[0], [0], [1]]
    assert all(i["threads"] == 2 for i in doc["instances"])


@pytest.mark.slow
def test_table_shows_instances_and_warnings():
    proc = corescale("plan", "instances=1", "cores_per_instance=30", "--lscpu", C5)
    assert proc.returncode == 0, proc.stderr
    assert "0-29" in proc.stdout  # CPUs of both nodes, as one list
    assert "spans NUMA nodes 0,1" in proc.stderr


def test_plan_for_this_machine(plan_json):
    doc = plan_json("instances=1", "cores_per_instance=1")
    assert len(doc["instances"]) == 1 and len(doc["instances"][0]["cpus"]) == 1


@pytest.mark.parametrize("args, message", [
    (["instances=3", "cores_per_instance=20", "--lscpu", C5], "cannot place 3 instances x 20 cores"),
    (["instances=2", "--lscpu", "/nonexistent/lscpu.txt"], "cannot read --lscpu file"),
    (["instances=2", "--lscpu", C5, "--allowed-cpus", "0-3,x"], "invalid CPU list"),
    (["instances=2", "--lscpu", C5, "--allowed-cpus", "90-99"], "--allowed-cpus 96-99 not usable"),
    (["instances=0", "--lscpu", C5], "instances must be > 0"),
    (["nonsense=1", "--lscpu", C5], "unknown key 'nonsense'"),
    (["--lscpu", __file__], "lscpu"),
])
def test_errors_are_one_line_exit_2(args, message, capsys):
    assert main(["plan", *args, "--json"]) == 2  # the CLI entry point, in this process
    out, err = capsys.readouterr()
    assert out == ""
    line = err.strip()
    assert line.count("\n") == 0 and line.startswith("corescale: error: ") and message in line, line


@pytest.mark.slow
def test_error_exit_code_of_the_real_command():
    proc = corescale("plan", "instances=99", "--lscpu", C5)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "cannot place 99 instances" in proc.stderr
