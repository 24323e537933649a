"""Per-instance environment, library search, pinning before exec and the mapped-library check."""

import dataclasses
import os
import subprocess
import sys

import pytest

from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.machine.placement import InstancePlacement, InstanceSpec

PLACEMENT = InstanceSpec(InstancePlacement(1, (2, 3), (0,), 2), threads=2, batch_size=1)


def cfg(**kw) -> BenchmarkConfig:
    return BenchmarkConfig(**kw)


def fake_lib(directory, name):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"\x7fELF and nothing a loader could use")  # passes the ELF check only
    return directory / name


@pytest.mark.parametrize("allocator, package", [("jemalloc", "libjemalloc2"), ("tcmalloc", "libgoogle-perftools4")])
def test_missing_allocator_names_the_debian_package(tmp_path, monkeypatch, allocator, package):
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, str(tmp_path))
    with pytest.raises(UserError) as err:
        instance_env.preload_paths(cfg(allocator=allocator))
    message = str(err.value)
    assert package in message and str(tmp_path) in message and "\n" not in message


def test_missing_intel_openmp_names_the_pip_package(tmp_path, monkeypatch):
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, str(tmp_path))
    with pytest.raises(UserError, match="pip install intel-openmp"):
        instance_env.preload_paths(cfg(openmp="intel"))


def test_lib_path_replaces_the_default_search(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    wanted = fake_lib(second, "libjemalloc.so.2")
    fake_lib(first, "libtcmalloc.so.4")
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, f"{first}:{second}")
    assert instance_env.search_dirs() == [first, second]
    assert instance_env.preload_paths(cfg(allocator="jemalloc", openmp="gnu")) == [wanted]
    assert instance_env.preload_paths(cfg()) == []  # default allocator, default OpenMP: nothing preloaded


def test_default_search_covers_system_and_venv_dirs(monkeypatch):
    monkeypatch.delenv(instance_env.LIB_PATH_ENV, raising=False)
    dirs = [str(d) for d in instance_env.search_dirs()]
    assert dirs == ["/usr/lib/x86_64-linux-gnu", "/usr/lib", "/usr/local/lib", f"{sys.prefix}/lib"]


def test_thread_counts_and_gnu_binding():
    env = instance_env.instance_variables(cfg(openmp="gnu"), PLACEMENT, [])
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert env["OMP_PROC_BIND"] == "close" and env["OMP_PLACES"] == "{2},{3}"
    assert env["CORESCALE_INSTANCE_CPUS"] == "2-3"
    assert "LD_PRELOAD" not in env and "KMP_AFFINITY" not in env


def test_intel_binding_and_preload_order(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/inherited.so")
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    monkeypatch.setenv("OMP_PROC_BIND", "spread")  # would be read by libiomp5 too: dropped
    libs = [tmp_path / "libjemalloc.so.2", tmp_path / "libiomp5.so"]
    config = cfg(allocator="jemalloc", openmp="intel")
    env = instance_env.Launch.of(config, PLACEMENT, libs).env
    assert env["LD_PRELOAD"] == f"{libs[0]}:{libs[1]}:/inherited.so"
    assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and env["KMP_BLOCKTIME"] == "1"
    assert "OMP_PROC_BIND" not in env and "OMP_PLACES" not in env
    assert env["MALLOC_CONF"] == instance_env.JEMALLOC_CONF


def test_a_recorded_launch_is_derived_again_here(tmp_path, monkeypatch):
    """A bundle's recorded launch is checked, then derived here: the same on the measuring machine, each preloaded
    library found here by name (a measuring machine's path never runs), one line when it is missing here."""
    monkeypatch.setenv("OMP_PLACES", "cores")  # the user's; dropped under Intel's runtime, here as when measured
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, str(tmp_path))
    lib = fake_lib(tmp_path, "libiomp5.so")
    config = cfg(openmp="intel")
    measured = instance_env.Launch.of(config, PLACEMENT)
    replayed = instance_env.Launch.from_recorded(config, PLACEMENT, measured.recorded())
    assert replayed.env == measured.env and replayed.cpus == measured.cpus and "OMP_PLACES" not in replayed.env
    assert replayed.recorded() == measured.recorded()
    elsewhere = {**measured.recorded(), "env": {**measured.variables, "LD_PRELOAD": "/measuring/venv/libiomp5.so"}}
    assert instance_env.Launch.from_recorded(config, PLACEMENT, elsewhere).env["LD_PRELOAD"] == str(lib)
    lib.unlink()
    with pytest.raises(UserError, match="libiomp5.so not found in"):
        instance_env.Launch.from_recorded(config, PLACEMENT, measured.recorded())


def test_user_tuning_values_win(monkeypatch):
    monkeypatch.setenv("MALLOC_CONF", "background_thread:false")
    monkeypatch.setenv("KMP_BLOCKTIME", "200")
    env = instance_env.instance_variables(cfg(allocator="jemalloc", openmp="intel"), PLACEMENT, [])
    assert env["MALLOC_CONF"] == "background_thread:false" and env["KMP_BLOCKTIME"] == "200"


def test_numactl_prefix_binds_cpus_and_nodes(monkeypatch):
    monkeypatch.delenv(instance_env.NUMACTL_ENV, raising=False)
    prefix = instance_env.command_prefix(PLACEMENT)
    if instance_env.numactl_works("0") is None:
        assert prefix == []
    else:
        assert prefix[1:] == ["--physcpubind=2-3", "--membind=0"]
    monkeypatch.setenv(instance_env.NUMACTL_ENV, "0")
    assert instance_env.command_prefix(PLACEMENT) == []


@pytest.mark.slow
def test_pinned_before_the_interpreter_starts():
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         capture_output=True, text=True, preexec_fn=instance_env.pin_before_exec([cpu]), check=True)
    assert out.stdout.strip() == f"[{cpu}]"


@pytest.mark.slow
def test_spawn_pins_sets_the_environment_and_starts_a_session(tmp_path):
    """The one way a pinned child starts: its CPUs and variables hold from its first instruction, in its own
    session; the module runs with the arguments given."""
    cpu = max(os.sched_getaffinity(0))
    script = tmp_path / "probe.py"
    script.write_text("import os, sys; print(sorted(os.sched_getaffinity(0)), os.environ['PROBE'], "
                      "os.getsid(0) == os.getpid(), sys.argv[1:])")
    launch = instance_env.Launch([], {**os.environ, "PROBE": "set", "PYTHONPATH": str(tmp_path)}, (cpu,))
    with instance_env.spawn(launch, "probe", "a", "b", stdout=subprocess.PIPE, text=True) as child:
        out, _ = child.communicate(timeout=60)
    assert out.strip() == f"[{cpu}] set True ['a', 'b']"


def test_no_module_starts_a_pinned_child_by_hand():
    """Every pinned child, the benchmarks' peers included, goes through instance_env.spawn/start (pin before exec,
    own session, die with the parent)."""
    from pathlib import Path

    checkout = Path(instance_env.__file__).parents[2]
    sources = [*(checkout / "corescale").rglob("*.py"), *(checkout / "benchmarks").rglob("*.py")]
    by_hand = [str(p.relative_to(checkout)) for p in sources
               if "preexec_fn=" in p.read_text() and p != Path(instance_env.__file__)]
    assert len(sources) > 100 and by_hand == []


GOMP = {"gnu-openmp": "/x/libgomp.so.1"}


@pytest.mark.parametrize("config, mapped, error", [
    (cfg(), {}, None),
    (cfg(allocator="jemalloc"), {**GOMP, "jemalloc": "/x/libjemalloc.so.2"}, None),
    (cfg(allocator="jemalloc"), GOMP, "jemalloc was requested but is not mapped in instance 3"),
    (cfg(allocator="tcmalloc"), {"jemalloc": "/x"}, "tcmalloc was requested"),
    (cfg(openmp="intel"), {**GOMP, "intel-openmp": "/x/libiomp5.so"}, None),
    (cfg(openmp="intel"), GOMP, "intel-openmp was requested"),
    (cfg(openmp="gnu"), GOMP, None),
    (cfg(openmp="gnu"), {}, "no GNU OpenMP"),
    (cfg(openmp="gnu"), {**GOMP, "intel-openmp": "/x/libiomp5.so"}, "takes over"),
])
def test_verify_mapped(config, mapped, error):
    if error is None:
        instance_env.verify_mapped(config, mapped, 3)
    else:
        with pytest.raises(UserError, match=error):
            instance_env.verify_mapped(config, mapped, 3)


@pytest.mark.parametrize("openmp", ["intel", "gnu"])
def test_the_recipe_drops_what_a_replayed_launch_drops(openmp):
    from helpers import ROOT

    from corescale.record.files import read_result
    from corescale.tune.recipe import instance_lines

    record = read_result(next((ROOT / "tests/data/tune1").glob("*pytorch-fp32*")) / "result.json")
    record = dataclasses.replace(record, config=dataclasses.replace(record.config, openmp=openmp))
    started = [line for line in instance_lines(record) if line.startswith("env")]
    dropped = "".join(f" -u {name}" for name in instance_env.dropped_variables(record.config))
    assert started and all(line.startswith(f"env{dropped} OMP_NUM_THREADS=") for line in started)
    assert (dropped == " -u OMP_PROC_BIND -u OMP_PLACES") == (openmp == "intel")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_front_moves_every_thread_of_the_process_off_the_instances_cpus():
    """Not only the calling thread: the ones started before (corescale serve's readers, dispatchers, keeper)."""
    import threading

    from corescale.measure.trial import housekeeping_cpus

    mine = os.sched_getaffinity(0)
    spec = InstanceSpec(InstancePlacement(0, (min(mine),), (), 1), threads=1, batch_size=1)
    stop = threading.Event()
    earlier = threading.Thread(target=stop.wait)
    earlier.start()
    try:
        with housekeeping_cpus([spec]) as free:
            assert free == mine - {min(mine)}
            assert {tuple(cpus) for cpus in instance_env.thread_affinities().values()} == {tuple(sorted(free))}
    finally:
        stop.set()
        earlier.join()
    assert os.sched_getaffinity(0) == mine
