"""The machine and software fingerprint that resume matches on: the inherited environment that changes what
runs is part of it (LD_PRELOAD, allocator, OpenMP and framework variables), what every instance sets for itself
or what changes nothing is not, and a record without any such variable keeps the fingerprint it always had."""

import dataclasses
import hashlib
import json

import pytest

from corescale.machine import environment
from corescale.record.sections import HostEnvironment
from corescale.record.trial import machine_fingerprint, measuring_libraries


def _host(**env) -> HostEnvironment:
    captured = environment.capture()
    kept = {k: v for k, v in captured.env.items() if k not in environment.measuring_variables(captured.env)}
    return dataclasses.replace(captured, env=kept | env)


@pytest.mark.parametrize("name, value", [
    ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"), ("MALLOC_CONF", "background_thread:true"),
    ("MALLOC_ARENA_MAX", "2"), ("TCMALLOC_RELEASE_RATE", "10"), ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"),
    ("OMP_SCHEDULE", "static"), ("OMP_WAIT_POLICY", "PASSIVE"), ("KMP_BLOCKTIME", "0"), ("GOMP_SPINCOUNT", "0"),
    ("MKL_ENABLE_INSTRUCTIONS", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"), ("DNNL_VERBOSE", "1"),
    ("CORESCALE_NUMACTL", "0"), ("LD_LIBRARY_PATH", "/opt/lib")])
def test_a_variable_that_changes_what_runs_changes_the_fingerprint(name, value):
    assert machine_fingerprint(_host(**{name: value})) != machine_fingerprint(_host())
    assert machine_fingerprint(_host(**{name: value})) == machine_fingerprint(_host(**{name: value}))


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                  "TF_NUM_INTRAOP_THREADS", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE",
                                  "KMP_DUPLICATE_LIB_OK"])
def test_what_every_instance_sets_itself_or_what_changes_nothing_does_not(name):
    assert machine_fingerprint(_host(**{name: "3"})) == machine_fingerprint(_host())


def test_without_such_variables_the_fingerprint_is_the_one_earlier_results_carry():
    host = _host()
    cpu, topology = host.cpu, host.topology
    before = json.dumps({"cpu": cpu.model, "isa": cpu.isa or None,
                         "cores": [topology.physical_cores, topology.logical_cpus],
                         "libraries": {n: host.libraries.get(n) for n in measuring_libraries()}},
                        sort_keys=True, default=str)
    assert machine_fingerprint(host) == hashlib.sha256(before.encode()).hexdigest()[:16]


def test_the_capture_records_every_family_it_fingerprints(monkeypatch):
    names = {"LD_PRELOAD", "MALLOC_ARENA_MAX", "TCMALLOC_RELEASE_RATE", "GLIBC_TUNABLES", "KMP_BLOCKTIME"}
    for name in names:
        monkeypatch.setenv(name, "x")
    assert names <= set(environment.capture().env)
