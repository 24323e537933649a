"""A real Ray cluster of nodes on loopback, node i pinned to CPU i (its raylet and every worker it starts inherit
the pin), 1 CPU each (tests/test_deploy_ray.py, tests/test_embed_ray.py). Ray's session files go to a short
/tmp/rayXXXX folder (its unix socket paths must stay under 107 characters)."""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

CPUS = sorted(os.sched_getaffinity(0))
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK = "127.0.0.1"


def ray_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's unix socket paths are <= 107 chars


@contextmanager
def pinned_nodes(count: int = 2):
    """SimpleNamespace(address, tmp) of a cluster of `count` nodes, node i on CPUS[i]."""
    from corescale.trials.ray import import_ray

    tmp = ray_tmp()
    patch = pytest.MonkeyPatch()
    for name, value in {**RAY_ENV, "RAY_TMPDIR": str(tmp)}.items():
        patch.setenv(name, value)
    patch.delenv("OMP_NUM_THREADS", raising=False)
    import_ray(loopback=True)
    from ray.cluster_utils import Cluster

    before = os.sched_getaffinity(0)
    ray_cluster = Cluster()
    try:
        for cpu in CPUS[:count]:
            os.sched_setaffinity(0, {cpu})
            try:
                ray_cluster.add_node(num_cpus=1, include_dashboard=False, node_ip_address=LOOPBACK)
            finally:
                os.sched_setaffinity(0, before)
        ray_cluster.wait_for_nodes()
        yield SimpleNamespace(address=ray_cluster.address, tmp=tmp)
    finally:
        ray_cluster.shutdown()
        patch.undo()
        shutil.rmtree(tmp, ignore_errors=True)
