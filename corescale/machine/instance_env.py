"""How one instance process is started: its environment, its pinning, the libraries it preloads.

Everything here is decided before the worker's interpreter starts, so no framework can create a thread
pool before the instance is pinned and its thread count is set. Nothing here writes system files.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corescale.errors import UserError
from corescale.machine.cpulist import format_cpulist
from corescale.machine.placement import InstanceSpec
from corescale.machine.preload_links import check_library, loader_path

if TYPE_CHECKING:
    from corescale.backends.options import BackendOptions

LIB_PATH_ENV = "CORESCALE_LIB_PATH"  # colon-separated directories searched instead of the defaults
NUMACTL_ENV = "CORESCALE_NUMACTL"  # "0" = never use numactl (pin with sched_setaffinity only)


@dataclass(frozen=True)
class Library:
    label: str  # as environment.mapped_libraries() names it
    files: tuple[str, ...]  # file names tried in order
    install: str  # what to install when it is missing


ALLOCATORS = {
    "jemalloc": Library("jemalloc", ("libjemalloc.so.2", "libjemalloc.so"),
                        "Debian's libjemalloc2 (apt-get install libjemalloc2)"),
    "tcmalloc": Library("tcmalloc", ("libtcmalloc.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so.4"),
                        "Debian's libgoogle-perftools4 (apt-get install libgoogle-perftools4)"),
}
INTEL_OPENMP = Library("intel-openmp", ("libiomp5.so",), "the pip package intel-openmp (pip install intel-openmp)")
GNU_OPENMP_LABEL = "gnu-openmp"  # GNU libgomp comes with the framework: never preloaded, only verified

# Set for every instance whatever the user's environment holds (instance_variables; OMP_PROC_BIND and OMP_PLACES are
# set, or dropped for Intel's runtime): an inherited value of these changes nothing that is measured.
SET_PER_INSTANCE = frozenset({"OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                              "TF_NUM_INTEROP_THREADS", "OMP_PROC_BIND", "OMP_PLACES"})

# Tuning defaults (Intel's published practice); a value already in the user's environment wins.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
KMP_BLOCKTIME = "1"


def search_dirs() -> list[Path]:
    custom = os.environ.get(LIB_PATH_ENV)
    if custom is not None:
        return [Path(d) for d in custom.split(":") if d]
    return [Path(d) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/usr/local/lib", f"{sys.prefix}/lib")]


def find_library(library: Library, dirs: list[Path] | None = None) -> Path:
    dirs = search_dirs() if dirs is None else dirs
    for name in library.files:
        for directory in dirs:
            if (directory / name).is_file():
                return check_library(directory / name, f"{library.label}'s")
    where = ", ".join(map(str, dirs)) or "(no directories)"
    raise UserError(f"{library.label}: {library.files[0]} not found in {where}; install {library.install} "
                    f"or point {LIB_PATH_ENV} at its directory")


class LaunchSettings(Protocol):
    """What an instance's launch reads of the config (`config.BenchmarkConfig` is one; machine/ sits below it)."""

    allocator: str
    openmp: str
    interop_threads: int
    backend: BackendOptions


def requested_libraries(cfg: LaunchSettings) -> list[Library]:
    """Libraries to LD_PRELOAD for this config (allocator first)."""
    wanted = [ALLOCATORS[cfg.allocator]] if cfg.allocator in ALLOCATORS else []
    if cfg.openmp == "intel":
        wanted.append(INTEL_OPENMP)
    return wanted


def preload_paths(cfg: LaunchSettings) -> list[Path]:
    """Resolves every requested library; raises UserError naming the package when one is missing. A preloaded
    allocator comes with the libraries the backend needs bound to it. Each is checked to be an ELF library, and one
    whose path LD_PRELOAD cannot name whole (a space or ':') gets its link (preload_links), before anything starts."""
    paths = [find_library(library) for library in requested_libraries(cfg)]
    if cfg.allocator in ALLOCATORS:
        paths[1:1] = [check_library(path, "the backend's allocator companion")
                      for path in cfg.backend.allocator_companions()]
    for path in paths:
        loader_path(path)
    return paths


def loader_preload(preload: list[Path]) -> dict[str, str]:
    """LD_PRELOAD as the child's dynamic loader reads it: `preload` through links where their paths hold a space or
    ':' (preload_links), then what this environment preloads already."""
    if not preload:
        return {}
    inherited = os.environ.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": ":".join([*map(loader_path, preload), *([inherited] if inherited else [])])}


def openmp_env(cfg: LaunchSettings, spec: InstanceSpec) -> dict[str, str]:
    """Thread affinity for the OpenMP runtime in use; the process itself is pinned to spec.cpus."""
    if cfg.openmp == "intel":
        return {"KMP_AFFINITY": "granularity=fine,compact,1,0"}
    # GNU libgomp (what PyTorch ships) and any standard runtime: one place per pinned CPU, threads packed.
    return {"OMP_PROC_BIND": "close", "OMP_PLACES": ",".join(f"{{{cpu}}}" for cpu in spec.cpus)}


def instance_variables(cfg: LaunchSettings, spec: InstanceSpec, preload: list[Path]) -> dict[str, str]:
    """The variables this tool sets for one instance (recorded with the result)."""
    threads = str(spec.threads)
    env = {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TF_NUM_INTRAOP_THREADS": threads,
        "TF_NUM_INTEROP_THREADS": str(cfg.interop_threads),
        "CORESCALE_INSTANCE_CPUS": format_cpulist(spec.cpus),
        **openmp_env(cfg, spec),
    }
    if preload:
        inherited = os.environ.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = ":".join([*map(str, preload), *([inherited] if inherited else [])])
    if cfg.allocator == "jemalloc":
        env["MALLOC_CONF"] = os.environ.get("MALLOC_CONF", JEMALLOC_CONF)
    if cfg.openmp == "intel":
        env["KMP_BLOCKTIME"] = os.environ.get("KMP_BLOCKTIME", KMP_BLOCKTIME)
    return env


def dropped_variables(cfg: LaunchSettings) -> tuple[str, ...]:
    """What an instance never inherits from this environment: under Intel's OpenMP runtime, GNU's binding
    variables (libiomp5 would read them too)."""
    return ("OMP_PROC_BIND", "OMP_PLACES") if cfg.openmp == "intel" else ()


def inherited_with(cfg: LaunchSettings, variables: dict[str, str]) -> dict[str, str]:
    """This process's environment, less what an instance never inherits, with `variables` set over it."""
    dropped = dropped_variables(cfg)
    return {**{k: v for k, v in os.environ.items() if k not in dropped}, **variables, "PYTHONUNBUFFERED": "1"}


@functools.lru_cache(maxsize=8)
def numactl_works(nodes: str) -> str | None:
    """Path of a numactl that may bind memory to `nodes` here (containers often forbid set_mempolicy)."""
    path = shutil.which("numactl")
    if path is None:
        return None
    try:
        probe = subprocess.run([path, f"--membind={nodes}", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if probe.returncode == 0 else None


def command_prefix(spec: InstanceSpec) -> list[str]:
    """`numactl --physcpubind=CPUS --membind=NODES` when numactl works here, else nothing."""
    nodes = format_cpulist(spec.numa_nodes)
    numactl = numactl_works(nodes) if nodes and os.environ.get(NUMACTL_ENV) != "0" else None
    if numactl is None:
        return []
    return [numactl, f"--physcpubind={format_cpulist(spec.cpus)}", f"--membind={nodes}"]


# The variables corescale sets for an instance (instance_variables): the only ones a recorded launch may hold.
RECORDED_VARIABLES = SET_PER_INSTANCE | {"CORESCALE_INSTANCE_CPUS", "LD_PRELOAD", "MALLOC_CONF", "KMP_AFFINITY",
                                         "KMP_BLOCKTIME"}


def check_recorded(cfg: LaunchSettings, spec: InstanceSpec, recorded: dict[str, Any]) -> None:
    """A recorded launch (a bundle's, which anyone may have edited) is one corescale writes: see from_recorded."""
    where = f"instance {spec.id}'s recorded launch"
    prefix = recorded.get("command_prefix") or []
    binding = [f"--physcpubind={format_cpulist(spec.cpus)}", f"--membind={format_cpulist(spec.numa_nodes)}"]
    if prefix and (not isinstance(prefix, list) or len(prefix) != 3 or not isinstance(prefix[0], str)
                   or Path(prefix[0]).name != "numactl" or prefix[1:] != binding):
        shown = " ".join(map(str, prefix)) if isinstance(prefix, list) else repr(prefix)
        raise UserError(f"{where} runs '{shown[:120]}' before the worker: corescale only ever records numactl "
                        f"{' '.join(binding)} there; refused (a bundle cannot choose what runs)")
    env = recorded.get("env") or {}
    if not isinstance(env, dict):
        raise UserError(f"{where}: its environment is not a mapping; refused")
    for name, value in env.items():
        if name not in RECORDED_VARIABLES:
            raise UserError(f"{where} sets {str(name)[:60]}, which corescale never sets; refused (a bundle may set "
                            f"only {', '.join(sorted(RECORDED_VARIABLES))}, and serve derives their values here)")
        if not isinstance(value, str):
            raise UserError(f"{where} sets {name} to {str(value)[:40]!r}, not a string; refused")
    known = {name for library in [*ALLOCATORS.values(), INTEL_OPENMP] for name in library.files}
    companions = cfg.backend.allocator_companions() if cfg.allocator in ALLOCATORS else []
    known |= {path.name for path in companions}
    for library in filter(None, env.get("LD_PRELOAD", "").split(":")):
        if Path(library).name not in known:
            raise UserError(f"{where} preloads {library[:120]} (LD_PRELOAD), which is not an allocator or OpenMP "
                            "runtime corescale preloads; refused (to preload a library of your own, set LD_PRELOAD "
                            "in the environment `corescale serve` runs in)")


@dataclass(frozen=True)
class Launch:
    """How one pinned child starts: the command prefix (numactl, or nothing), its whole environment, its CPUs, and
    the variables this tool set in that environment (what a result records)."""

    prefix: list[str]
    env: dict[str, str]
    cpus: tuple[int, ...]
    variables: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: LaunchSettings, spec: InstanceSpec, preload: list[Path] | None = None) -> Launch:
        """The launch of one instance of `cfg` (preload: the resolved libraries, when the caller has them)."""
        preload = preload_paths(cfg) if preload is None else preload
        variables = instance_variables(cfg, spec, preload)  # recorded: the libraries' real paths
        return cls(command_prefix(spec), inherited_with(cfg, {**variables, **loader_preload(preload)}),
                   tuple(spec.cpus), variables)

    @classmethod
    def from_recorded(cls, cfg: LaunchSettings, spec: InstanceSpec, recorded: dict[str, Any],
                      placed: InstanceSpec | None = None) -> Launch:
        """The launch of an instance a measurement recorded (`recorded()`: a bundle's layout), derived here: its
        prefix, variables and preloaded libraries are what `of` gives for its config and CPUs on this machine
        (numactl and each library found here by name: a measuring machine's paths never run). The recorded launch
        is only checked, so that one corescale did not write is refused (one line naming what): a prefix other
        than numactl binding the instance's own CPUs and memory nodes, a variable corescale never sets, or a
        preloaded file that is not an allocator or OpenMP runtime it preloads. `placed`: the same instance placed
        on other CPUs here (a container's cpuset), which the launch then binds."""
        check_recorded(cfg, spec, recorded)
        return cls.of(cfg, placed or spec)

    def recorded(self) -> dict[str, Any]:
        """What a result records of it: the command prefix and the variables set."""
        return {"command_prefix": self.prefix, "env": self.variables}


def spawn(launch: Launch, module: str, *args: str, **popen) -> subprocess.Popen:
    """`python -m MODULE ARGS` (this interpreter) as a pinned child: see start()."""
    return start(launch, [sys.executable, "-m", module, *args], **popen)


def start(launch: Launch, argv: list[str], **popen) -> subprocess.Popen:
    """ARGV as a pinned child: pinned to launch.cpus before exec (so before the interpreter and any framework),
    with launch.env from its first instruction, behind the numactl prefix, in its own session (a process group to
    stop whole), killed when this process dies. `popen`: the streams and pass_fds."""
    return subprocess.Popen([*launch.prefix, *argv], env=launch.env, start_new_session=True,
                            preexec_fn=pin_before_exec(launch.cpus), **popen)


def kill(process: subprocess.Popen) -> None:
    """Kills a spawned child's whole process group (its own session: whatever it started goes too) and waits."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    process.wait()


def pin_before_exec(cpus):
    """preexec_fn for Popen: the child is pinned before the interpreter (and any framework) starts."""
    cpus = list(cpus)

    def pin() -> None:
        os.sched_setaffinity(0, cpus)
        die_with_parent()

    return pin


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends `sig` to this process when its parent dies (however it dies), so no instance
    outlives the corescale process that started it. Kept across exec (numactl, then python)."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig)
    except (OSError, AttributeError):
        pass


def verify_mapped(cfg: LaunchSettings, mapped: dict[str, str], instance: int) -> None:
    """Raises UserError when a requested allocator/OpenMP runtime is not really in the process."""
    for library in requested_libraries(cfg):
        if library.label not in mapped:
            raise UserError(f"{library.label} was requested but is not mapped in instance {instance}: the "
                            f"dynamic loader did not load LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}")
    if cfg.openmp == "gnu":
        if GNU_OPENMP_LABEL not in mapped:
            raise UserError(f"openmp=gnu was requested but instance {instance} has no GNU OpenMP (libgomp) "
                            f"mapped: backend '{cfg.backend.name}' does not use it")
        if INTEL_OPENMP.label in mapped:
            raise UserError(f"openmp=gnu was requested but instance {instance} also maps "
                            f"{mapped[INTEL_OPENMP.label]}, which takes over the GNU OpenMP calls")


def thread_affinities() -> dict[int, list[int]]:
    """CPUs each thread of this process may run on (OpenMP runtimes bind each thread to its own CPUs)."""
    from corescale.machine.cpulist import parse_cpulist

    found: dict[int, list[int]] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            status = Path(f"/proc/self/task/{task}/status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        for line in status.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found[int(task)] = list(parse_cpulist(line.split(":", 1)[1]))
    return found


def unbind_calling_thread(every_thread: bool = False) -> None:
    """Gives the calling thread (with every_thread, each thread of this process) all of the instance's CPUs again
    before a framework creates its own threads.

    GNU OpenMP (loaded with torch) honours OMP_PROC_BIND/OMP_PLACES by binding the thread that loads it to the
    first place: a framework that starts its pool afterwards (ONNX Runtime, OpenVINO, TensorFlow, OpenBLAS)
    would otherwise put every thread on that one CPU, and OpenVINO would cap its thread count at 1. A library
    that loads torch midway (NNCF, in an int8 build) binds it then, and the threads started since inherit it.
    """
    from corescale.machine.cpulist import parse_cpulist

    cpus = parse_cpulist(os.environ.get("CORESCALE_INSTANCE_CPUS", ""))
    if not cpus:
        return
    for thread in (thread_affinities() if every_thread else [0]):
        try:
            os.sched_setaffinity(thread, cpus)
        except OSError:
            continue  # the thread ended meanwhile
