"""Fixtures and hooks only (what tests share as functions is in helpers.py)."""

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import FAST, TOY_ENV, corescale, library_installed, run_record
from serving import Service, measure_bundle

pytest_plugins = ("pytester",)
SUITE = pytest.StashKey[tuple[Path, dict]]()
SHARED = "corescale_suite"  # pytest-xdist's workerinput key: the controller's suite folder


def pytest_configure(config):
    """The suite's own cache_dir default and machine lock (and the speed sentinel off), set before any test imports
    corescale and inherited by every process the suite starts: no test reads or writes ~/.cache/corescale (the
    first test that needs an export builds it, as on a fresh clone; later ones reuse it), and no other run's trial
    on this machine holds the lock inside a test's timing bound. A session started inside a test (pytester)
    restores them when done."""
    suite = Path(tempfile.mkdtemp(prefix="corescale-suite-"))
    # pytest-xdist's workers share their controller's cache (one export of a model, not one per worker) but each
    # keeps its own machine lock: two workers' tests run side by side unless one is marked `alone`
    shared = Path(config.workerinput[SHARED]) if hasattr(config, "workerinput") else suite
    own = {"CORESCALE_CACHE_DIR": str(shared / "cache"), "CORESCALE_LOCK": str(suite / "machine.lock"),
           "CORESCALE_SENTINEL": "0"}  # the speed sentinel off (its own tests turn it on): ~0.1 s a trial here
    config.stash[SUITE] = suite, {name: os.environ.get(name) for name in own}
    os.environ.update(own)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist's controller: its workers share its suite folder (the cache, the `alone` turn's locks)."""
    node.workerinput[SHARED] = str(node.config.stash[SUITE][0])


# the files that start Ray clusters: one scope of `--dist loadfile` (one worker runs them, one Ray at a time)
RAY_FILES = {"tests/test_ray_executor.py", "tests/test_ray_cli.py", "tests/test_deploy_ray.py",
             "tests/test_embed_ray.py"}


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, but RAY_FILES are one scope (xdist_group marks do not group under pytest 9: xdist sets
    the node id pytest no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return "ray" if file in RAY_FILES else file
    return Scheduling(config, log)


def pytest_unconfigure(config):
    suite, before = config.stash[SUITE]
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(suite, ignore_errors=True)


def is_probe(args) -> bool:
    """What the code under test runs to describe the machine: platform.processor()'s `uname -p`, the version's
    `git rev-parse`, the memory-binding check `numactl --membind=N true` (milliseconds each, no Python, no
    model). A numactl that starts anything but `true` is a pinned launch, not a probe."""
    if isinstance(args, (str, bytes, os.PathLike)):
        return False
    program = Path(os.fsdecode(args[0])).name
    return program in ("uname", "git") or (program == "numactl" and list(args[-1:]) == ["true"])


@contextlib.contextmanager
def refusing_processes(item):
    """While an unmarked test runs (its fixtures included), starting a process other than a probe fails it: the
    `slow` marker is what keeps `make test-fast` (-m "not slow") free of processes, and this keeps it honest."""
    started = []
    popen_init = subprocess.Popen.__init__

    def refused(what, command=""):
        started.append(f"{what} {command}".strip())
        pytest.fail(f"{item.nodeid} starts a process ({started[-1]}) but is not marked slow "
                    "(pytestmark = pytest.mark.slow, or @pytest.mark.slow)", pytrace=False)

    def popen(self, args, *rest, **kwargs):
        if kwargs.get("shell") or not is_probe(args):
            refused("subprocess.Popen", args)
        popen_init(self, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", popen)
        patch.setattr(os, "fork", lambda: refused("os.fork"))
        patch.setattr(os, "posix_spawn", lambda *args, **kwargs: refused("os.posix_spawn", args[:2]))
        yield started


STARTED = pytest.StashKey[list]()


@contextlib.contextmanager
def turn(item):
    """Under pytest-xdist (`make test` runs the slow tier in two workers), a slow test marked `alone` (it judges
    timings, contamination or the machine lock's waits) runs with no other test beside it: it holds the turn
    exclusively, every other test shares it. A waiting `alone` test holds the gate, so the other worker starts no
    new test meanwhile (it is not starved). Without xdist, or for a test that starts no process: nothing."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None or not item.get_closest_marker("slow"):
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    folder = Path(workerinput[SHARED])
    with open(folder / "turn-gate.lock", "a") as gate, open(folder / "turn.lock", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the file releases the turn


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Outermost (before pytest-timeout starts a test's clock, so the wait for its turn is not the test's time):
    the test's turn, then for an unmarked test the refusal of processes."""
    with turn(item):
        if item.get_closest_marker("slow"):
            yield
            return
        with refusing_processes(item) as started:
            item.stash[STARTED] = started
            yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fails a test whose code caught the refusal and passed anyway."""
    report = (yield).get_result()
    started = item.stash.get(STARTED, None)
    if report.when == "call" and report.passed and started:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} starts a process ({started[0]}) but is not marked slow"


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory) -> Path:
    """One plain bert-tiny run through the real CLI (FAST, batch 2, one thread), for the tests that only read a
    run: its folder, which no test changes (one that needs it beside other runs copies it into its own folder)."""
    out = tmp_path_factory.mktemp("plain-run") / "outputs"
    proc = corescale("run", *FAST, "batch_size=2", "threads=1", f"output_dir={out}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "latency p50" in proc.stdout and "throughput (samples/s)" in proc.stdout
    (run,) = list(out.iterdir())
    return run


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory):
    """Where the browser tests' screenshots go: pytest's temporary folder (it keeps the last three sessions'),
    never the checkout."""
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
def out_dir(tmp_path):
    return tmp_path / "outputs"


@pytest.fixture
def fp16():
    """The toy precision (tests/toy_precision) registered in this process for one test, then removed."""
    from toy_precision import FP16

    from corescale.machine.precisions import PRECISIONS, register_precision

    register_precision("fp16", FP16)
    yield FP16
    PRECISIONS.pop("fp16")


@pytest.fixture
def toy(fp16):
    """The toy backend (tests/toy_backend) registered in this process for one test, with the toy precision it
    computes in, then removed (the other tests' spaces stay as they are)."""
    from toy_backend.options import TOY

    from corescale.backends import BACKENDS, OPTIONS, register

    register("toy", TOY)
    yield TOY
    BACKENDS.pop("toy")
    OPTIONS.pop("toy")


@pytest.fixture
def toy_task():
    """The toy task (tests/toy_task) registered in this process for one test, then removed."""
    from toy_task import TOYSCORE

    from corescale.workload.tasks import TASKS, register

    register(TOYSCORE)
    yield TOYSCORE
    TASKS.pop(TOYSCORE.name)


@pytest.fixture
def toy_everywhere(toy, monkeypatch):
    """The toy registered in this process and in every process the test starts (the workers: TOY_ENV)."""
    for name, value in TOY_ENV.items():
        monkeypatch.setenv(name, value)
    return toy


# ---- real runs that test files share (test_backends_common.py checks what both backends below have in common) ----


@pytest.fixture(scope="session")
def onnxruntime_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnxruntime-cache")


@pytest.fixture(scope="session")
def onnxruntime_runs(tmp_path_factory, onnxruntime_cache):
    """Order matters: the first run (2 instances, empty cache) exports concurrently, the others reuse it."""

    def run(name, *overrides):
        return run_record(tmp_path_factory.mktemp(name), "backend=onnxruntime", f"cache_dir={onnxruntime_cache}",
                          "batch_size=4", "reference=pytorch", *overrides)
    return {
        "two_instances": run("two", "instances=2"),  # 1 thread each
        "fused_2t": run("fused", "threads=2", "backend.fusion=true"),
        "fused_int8": run("int8", "backend.fusion=true", "precision=int8"),
    }


@pytest.fixture(scope="session")
def openvino_runs(tmp_path_factory):
    from corescale.machine import instance_env

    cache = tmp_path_factory.mktemp("openvino-cache")
    jemalloc = library_installed(instance_env.ALLOCATORS["jemalloc"])

    def run(name, *overrides):
        return run_record(tmp_path_factory.mktemp(name), "backend=openvino", f"cache_dir={cache}", "batch_size=4",
                          *overrides)
    return {
        "two_instances": run("two", "instances=2", "reference=pytorch",  # 1 thread each
                             f"compiled_cache={tmp_path_factory.mktemp('openvino-compiled')}"),
        "2t": run("two_threads", "threads=2", "backend.performance_hint=THROUGHPUT",
                  *(["allocator=jemalloc"] if jemalloc else [])),
    }


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    """tiny_bundle(task) -> the folder of a measured bert-tiny bundle (serving.measure_bundle: ONNX Runtime,
    sequence 64, batch 4) computing `task`, measured on first use and shared by every test of the session (one
    measurement per task instead of one per test file). Never changed: a test that tampers with a bundle or
    changes it in place copies it into its own folder first. Slow tests only (it starts processes)."""
    measured: dict[str, Path] = {}

    def get(task: str = "embed") -> Path:
        if task not in measured:
            measured[task] = measure_bundle("bert-tiny", tmp_path_factory.mktemp(f"tiny-bundle-{task}"),
                                            f"task={task}")
        return measured[task]
    return get


@pytest.fixture(scope="session")
def tiny_service(tmp_path_factory, tiny_bundle):
    """tiny_service(task) -> a real `corescale serve` (serving.Service: .url, .bundle, .log) of tiny_bundle(task),
    started on first use and shared by every test of the session (its queue unbounded: nothing is refused for
    being many). Only for tests that call its routes: one that stops, signals or overloads it, or needs counters
    that start at zero, starts its own Service (from tiny_bundle(task)). Slow tests only (it starts processes)."""
    started: dict[str, Service] = {}

    def get(task: str = "embed") -> Service:
        if task not in started:
            started[task] = Service(tiny_bundle(task), tmp_path_factory.mktemp(f"tiny-{task}") / "serve.log",
                                    "--max-queue", "1000000")
        return started[task]
    yield get
    for service in started.values():
        service.stop()


@pytest.fixture(scope="module")
def forkservers():
    """Fork servers kept for one test module, as a tune keeps them for its loop (measure/forkserver.py): given to
    helpers.execute, every worker after a launch's first is a fork of a server that imported its framework once
    (milliseconds instead of a PyTorch worker's seconds of imports). For tests whose subject is not how a worker
    starts (its imports, its mapped libraries, its threads); this process is a child subreaper while the module
    runs. Slow tests only."""
    from corescale.measure.forkserver import ForkServers

    with ForkServers.temporary() as servers:
        yield servers
