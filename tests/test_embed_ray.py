"""`corescale embed --ray ADDRESS` on a real Ray cluster of two nodes on loopback, each pinned to its own CPU
(ray_clusters.py): a bert-tiny bundle measured as one instance on one core runs as one Ray Data actor per node, its
instance on that node's CPU; the shards equal the one-machine job's row for row; a driver stopped and started again
resumes from the complete shards; a bad address is one line before Ray is reached."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from corpora import corpus, shards
from helpers import ROOT, corescale, needs_two_cpus
from ray_clusters import CPUS, RAY_ENV, pinned_nodes
from serving import measure_bundle

pytestmark = [needs_two_cpus, pytest.mark.slow, pytest.mark.timeout(600)]
OPTIONS = ["--id-column", "id", "--shard-rows", "50", "--no-progress"]


@pytest.fixture(scope="module")
def cluster():
    with pinned_nodes(2) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def one_core(tmp_path_factory):
    """bert-tiny measured as one instance on one core: one block per node."""
    return measure_bundle("bert-tiny", tmp_path_factory.mktemp("one core"), "task=embed", "instances=1",
                          "cores_per_instance=1")


@pytest.fixture
def place(tmp_path):
    folder = tmp_path / "a corpus folder ünï"
    folder.mkdir()
    return folder


def on_ray(cluster, *words, **popen):
    env = {**os.environ, **RAY_ENV, "RAY_TMPDIR": str(cluster.tmp)}
    command = [sys.executable, "-m", "corescale.cli", "embed", *words, "--ray", cluster.address]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    return subprocess.run(command, cwd=ROOT, env=env, text=True, capture_output=True, timeout=400)


def test_two_nodes_one_pinned_actor_each_write_what_one_machine_writes(cluster, one_core, place):
    source = corpus(place / "texts.jsonl", 600, {7: ""}, seed=3)
    here, there = place / "one machine", place / "on ray"
    assert corescale("embed", str(one_core), str(source), str(here), *OPTIONS).returncode == 0
    proc = on_ray(cluster, str(one_core), str(source), str(there), *OPTIONS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "texts/s" in proc.stderr
    ours, theirs = shards(there), shards(here)
    assert ours[0] == theirs[0] and len(ours[0]) == 599  # every row once, in input order, the same ids
    np.testing.assert_allclose(ours[1], theirs[1], rtol=0, atol=1e-5)
    rejects = pq.read_table(there / "rejects-00000.parquet").to_pylist()
    assert [r["row"] for r in rejects] == [7] and "empty" in rejects[0]["reason"]
    manifest = json.loads((there / "manifest.json").read_text())
    executor = manifest["executor"]
    assert manifest["complete"] and executor["name"] == "ray" and executor["nodes"] == 2 and executor["actors"] == 2
    assert sorted(ran["cpus"] for ran in executor["ran"].values()) == [str(CPUS[0]), str(CPUS[1])]
    assert sum(ran["shards"] for ran in executor["ran"].values()) == 12
    assert len({where.split("/")[0] for where in executor["ran"]}) == 2  # both nodes computed
    assert not list(there.glob(".*"))


def test_a_stopped_driver_resumes_from_the_complete_shards(cluster, one_core, place):
    source = corpus(place / "texts.jsonl", 1500, seed=4)
    out = place / "cut"
    job = on_ray(cluster, str(one_core), str(source), str(out), *OPTIONS, popen=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and job.poll() is None and len(list(out.glob("shard-*.parquet"))) < 3:
        time.sleep(0.1)
    assert job.poll() is None, job.communicate()[1][-3000:]
    os.killpg(job.pid, signal.SIGINT)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 130, err[-3000:]
    left = len(list(out.glob("shard-*.parquet")))
    assert 0 < left < 30 and "the same command again resumes" in err
    again = on_ray(cluster, str(one_core), str(source), str(out), *OPTIONS)
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["this_run"]["shards_before"] >= left
    keys, _ = shards(out)
    assert keys == [(i, f"doc-{i}") for i in range(1500)]  # nothing lost, nothing twice


@pytest.mark.parametrize("address, expected", [("no-port", "give host:port"),
                                               ("127.0.0.1:1", "cannot reach the Ray cluster")])
def test_a_bad_address_is_one_line_and_nothing_written(one_core, place, address, expected):
    source = corpus(place / "texts.jsonl", 10)
    proc = corescale("embed", str(one_core), str(source), str(place / "never"), "--ray", address, "--no-progress")
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not (place / "never").exists()
