"""What the machine is, as the tool sees it: captured once per run and stored with every result (the typed
HostEnvironment, the record's `environment`)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import corescale
from corescale.machine.precisions import PRECISIONS
from corescale.machine.topology import read_text
from corescale.typed import Section

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "sve", "sve2", "i8mm", "bf16")  # the last five: aarch64's `Features`
# The inherited variables recorded with every result: threading, allocators, the frameworks' switches, the loader.
ENV_PREFIXES = ("OMP_", "KMP_", "MKL_", "GOMP_", "OPENBLAS_", "TF_NUM_", "TF_ENABLE_", "TF_XLA", "ORT_", "OV_",
                "DNNL_", "ONEDNN_", "MALLOC_", "JE_MALLOC_", "TCMALLOC_")
ENV_NAMES = ("LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES",
             "CORESCALE_NUMACTL", "CORESCALE_LIB_PATH")
# Recorded, but no part of what is measured: a CPU run ignores the GPU list; the hub is never needed;
# KMP_DUPLICATE_LIB_OK only lets two OpenMP runtimes load without aborting, and threadpoolctl (the speed sentinel
# imports it) sets it in the process that imports it: a tune's first trial (its out-of-box baseline) was captured
# without it and every later one with it, so the final stage never found the baseline and measured it again.
ENV_NOT_MEASURED = ("HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES", "KMP_DUPLICATE_LIB_OK")


def measuring_variables(env: dict[str, str]) -> dict[str, str]:
    """The recorded variables that change what an instance runs (the fingerprint's): all but those every instance
    sets for itself whatever was inherited (instance_env.SET_PER_INSTANCE) and those that change nothing."""
    from corescale.machine.instance_env import SET_PER_INSTANCE

    return {k: v for k, v in sorted(env.items()) if k not in SET_PER_INSTANCE and k not in ENV_NOT_MEASURED}
TOOL_LIBRARIES = ("numpy", "hydra-core", "ray", "pandas", "pyarrow")  # corescale's own; each backend names its own
WATCHED_LIBS = {"jemalloc": "libjemalloc", "tcmalloc": "libtcmalloc", "intel-openmp": "libiomp5",
                "gnu-openmp": "libgomp", "llvm-openmp": "libomp."}


@dataclass(frozen=True)
class CpuInfo(Section):
    model: str | None = None
    vendor: str | None = None
    mhz: float | None = None
    max_mhz: float | None = None  # cpufreq's highest clock (absent in many VMs)
    isa: dict[str, bool] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostTopology(Section):
    sockets: int | None = None
    numa_nodes: int | None = None
    physical_cores: int | None = None
    logical_cpus: int | None = None
    allowed_cpus: str | None = None
    summary: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostEnvironment(Section):
    """capture(): the host a trial ran on (an empty one for records that lack it)."""

    hostname: str | None = None
    cpu: CpuInfo = field(default_factory=CpuInfo)
    topology: HostTopology = field(default_factory=HostTopology)
    cgroup_cpu_quota: float | None = None
    os_cpu_count: int | None = None
    memory_bytes: int | None = None
    kernel: str | None = None
    governor: str | None = None
    transparent_hugepages: str | None = None
    python: str | None = None
    libraries: dict[str, str | None] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)
    corescale: dict[str, str | None] = field(default_factory=dict)  # version, commit
    captured_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _cpuinfo_fields() -> dict[str, str]:
    """/proc/cpuinfo's fields, the first CPU's."""
    fields: dict[str, str] = {}
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_kind() -> str:
    """What code compiled for this CPU depends on: its architecture, vendor, family, model, stepping and every
    flag (a model name such as "AMD EPYC" spans several generations), hashed."""
    fields = _cpuinfo_fields()
    named = ("vendor_id", "cpu family", "model", "stepping", "flags", "CPU implementer", "CPU part", "Features")
    identity = [platform.machine(), *(fields.get(name, "") for name in named)]
    return hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]


def cpuinfo() -> CpuInfo:
    fields = _cpuinfo_fields()
    flags = set((fields.get("flags") or fields.get("Features", "")).split())
    return CpuInfo(model=fields.get("model name", platform.processor()), vendor=fields.get("vendor_id", ""),
                   mhz=float(fields["cpu MHz"]) if "cpu MHz" in fields else None, max_mhz=_max_mhz(),
                   isa={flag: flag in flags for flag in isa_flags()})


def isa_flags() -> tuple[str, ...]:
    """ISA_FLAGS and every flag a registered precision names (a plug-in's too: its CPU facts are then known)."""
    named = [flag for p in PRECISIONS.values() for arch in (p.computes, p.requires) for flags in arch.values()
             for flag in flags]
    return tuple(dict.fromkeys([*ISA_FLAGS, *named]))


def _max_mhz() -> float | None:
    """The highest clock cpufreq reports (absent in many VMs)."""
    text = read_text("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    return int(text) / 1e3 if text and text.isdigit() else None


def memory_bytes() -> int | None:
    match = re.search(r"MemTotal:\s+(\d+) kB", read_text("/proc/meminfo") or "")
    return int(match.group(1)) * 1024 if match else None


def git_commit() -> str | None:
    root = Path(corescale.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def libraries() -> tuple[str, ...]:
    """Whose versions are recorded: corescale's own libraries and every registered backend's."""
    from corescale.backends import BACKENDS

    names = [*TOOL_LIBRARIES, *(n for e in BACKENDS.values() for n in (*e.libraries, *e.recorded))]
    return tuple(dict.fromkeys(names))


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in libraries():
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def thp_setting() -> str | None:
    text = read_text("/sys/kernel/mm/transparent_hugepage/enabled")
    match = re.search(r"\[(\w+)\]", text or "")
    return match.group(1) if match else text


def capture() -> HostEnvironment:
    """Host facts (no framework imported). Topology details come from corescale.machine.topology."""
    from corescale.machine.cpulist import format_cpulist
    from corescale.machine.topology import Topology, cgroup_cpu_quota

    topo = Topology.from_sysfs()
    topology = HostTopology(sockets=len(topo.sockets), numa_nodes=len(topo.numa_nodes),
                            physical_cores=len(topo.physical_cores), logical_cpus=len(topo.cpu_ids),
                            allowed_cpus=format_cpulist(topo.cpu_ids), summary=topo.summary())
    return HostEnvironment(
        hostname=platform.node(), cpu=cpuinfo(), topology=topology, cgroup_cpu_quota=cgroup_cpu_quota(),
        os_cpu_count=os.cpu_count(), memory_bytes=memory_bytes(), kernel=platform.release(),
        governor=read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        transparent_hugepages=thp_setting(), python=platform.python_version(), libraries=library_versions(),
        env={k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES},
        load_average=list(os.getloadavg()), corescale={"version": corescale.__version__, "commit": git_commit()},
        captured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def mapped_libraries(maps: str | None = None) -> dict[str, str]:
    """Allocator and OpenMP libraries really mapped into this process (from /proc/self/maps, or `maps`: its text)."""
    found: dict[str, str] = {}
    for line in ((read_text("/proc/self/maps") if maps is None else maps) or "").splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode path: a path may hold spaces
        path = fields[5].strip() if len(fields) == 6 else ""
        name = os.path.basename(path)
        for label, stem in WATCHED_LIBS.items():
            if name.startswith(stem):
                found.setdefault(label, path)
    return found


def os_thread_count() -> int:
    return len(os.listdir("/proc/self/task"))
