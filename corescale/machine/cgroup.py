"""The CPUs and CPU time a container or cgroup gives this process, and the rules corescale keeps inside them.

Read from this process's own cgroup (/proc/self/cgroup names it under the cgroup mount), not the mount's root:
under systemd (`CPUQuota=`, `AllowedCPUs=`) or a container without its own cgroup namespace the limits are set on
a group below the root. cgroup v2: `cpuset.cpus.effective` of the deepest group that has one, and the smallest
`cpu.max` quota on the path from the root down (a parent's limit binds its children); v1: the `cpuset` and `cpu`
(or `cpu,cpuacct`) hierarchies, `cpuset.effective_cpus` and `cpu.cfs_quota_us` / `cpu.cfs_period_us` the same way.
Tests feed a described cgroup: a folder shaped like the mount and a /proc/self/cgroup text.

The rules (docs/deploy.md#cpus-and-quota-in-a-container-or-cgroup): the planner and `serve` place instances only
on CPUs this process may use (its affinity, which the kernel keeps inside the cpuset); a layout sized from the
machine is sized from the quota too (`within_quota`: no more busy threads than the quota's CPUs); a layout whose
busy threads exceed the quota is one line (`check_quota`) before any worker starts: its instances would be
throttled in every period, and what was measured would not be what runs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from corescale.errors import UserError
from corescale.machine.cpulist import parse_cpulist

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
V1_CPU = ("cpu", "cpu,cpuacct", "cpuacct,cpu")  # the folders the v1 cpu controller is mounted at
V1_CPUSET = ("cpuset",)


@dataclass(frozen=True)
class CgroupLimits:
    """What this process's cgroup allows: None where it sets no limit or cannot be read."""

    cpus: tuple[int, ...] | None  # the effective cpuset
    quota: float | None  # CPUs of CPU time per period (cpu.max 150000 100000 -> 1.5)
    where: str = ""  # the file the quota came from (said in the refusal)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def own_paths(proc_cgroup: str | os.PathLike[str]) -> dict[str, str]:
    """controller -> this process's group under it ("" for cgroup v2's unified line `0::/path`)."""
    found: dict[str, str] = {}
    for line in (_read(Path(proc_cgroup)) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                found[controller] = parts[2]
    return found


def levels(mount: Path, group: str | None) -> list[Path]:
    """The existing folders from this process's group up to the mount (deepest first); the mount alone when the
    group is not under it (another cgroup namespace)."""
    found = [mount]
    if group:
        relative = PurePosixPath(group).relative_to("/") if group.startswith("/") else PurePosixPath(group)
        for depth in range(1, len(relative.parts) + 1):
            folder = mount.joinpath(*relative.parts[:depth])
            if folder.is_dir():
                found.append(folder)
    return found[::-1]


def _quota_v2(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    if not text:
        return None
    fields = text.split()
    return _ratio(fields[0], fields[1] if len(fields) > 1 else "100000")


def _quota_v1(folder: Path) -> float | None:
    quota = _read(folder / "cpu.cfs_quota_us")
    return None if quota is None else _ratio(quota, _read(folder / "cpu.cfs_period_us") or "100000")


def _ratio(quota: str, period: str) -> float | None:
    if quota == "max" or quota.startswith("-"):
        return None
    try:
        value = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None  # an unreadable limit: treated as none
    return value if value > 0 else None


def read_limits(root: str | os.PathLike[str] | None = None,
                proc_cgroup: str | os.PathLike[str] | None = None) -> CgroupLimits:
    """This process's cgroup limits (see the module's docstring); by default under CGROUP_ROOT as PROC_CGROUP
    names the group (read when called: a test points them at a described cgroup)."""
    root = Path(root or CGROUP_ROOT)
    paths = own_paths(proc_cgroup or PROC_CGROUP)
    quotas: list[tuple[float, Path]] = []
    cpus: tuple[int, ...] | None = None
    if (root / "cgroup.controllers").is_file() or (root / "cpu.max").is_file():  # v2 (unified)
        chain = levels(root, paths.get(""))
        quotas = [(q, level / "cpu.max") for level in chain if (q := _quota_v2(level)) is not None]
        cpus = _first_cpus(chain, ("cpuset.cpus.effective",))
    else:
        for name in V1_CPU:
            chain = levels(root / name, paths.get("cpu")) if (root / name).is_dir() else []
            quotas += [(q, level / "cpu.cfs_quota_us") for level in chain if (q := _quota_v1(level)) is not None]
        if not quotas and (q := _quota_v1(root)) is not None:  # a v1 controller mounted at the root itself
            quotas.append((q, root / "cpu.cfs_quota_us"))
        for name in V1_CPUSET:
            if cpus is None and (root / name).is_dir():
                cpus = _first_cpus(levels(root / name, paths.get("cpuset")),
                                   ("cpuset.effective_cpus", "cpuset.cpus"))
    quota, where = min(quotas, key=lambda found: found[0]) if quotas else (None, None)
    return CgroupLimits(cpus, quota, str(where or ""))


def _first_cpus(chain: list[Path], names: tuple[str, ...]) -> tuple[int, ...] | None:
    for level in chain:
        for name in names:
            text = _read(level / name)
            if text:
                try:
                    return parse_cpulist(text)
                except UserError:
                    return None  # a malformed file: no cpuset read, the affinity still holds
    return None


def quota_cpus(quota: float | None) -> int | None:
    """The whole CPUs a quota keeps busy (1.5 -> 1; at least 1); None without one."""
    return None if quota is None else max(1, math.floor(quota + 1e-9))


def check_quota(threads: int, what: str, limits: CgroupLimits | None = None) -> None:
    """One line when `threads` busy threads (a layout's instances together) exceed the cgroup's CPU quota."""
    limits = read_limits() if limits is None else limits
    if limits.quota is not None and threads > limits.quota + 1e-9:
        most = quota_cpus(limits.quota)
        raise UserError(f"{what} runs {threads} busy thread(s), more than the {limits.quota:g} CPU(s) of CPU time "
                        f"this cgroup's quota allows ({limits.where}: docker --cpus, a Kubernetes CPU limit, "
                        f"systemd's CPUQuota=): its instances would be throttled; give it at least {threads} CPUs, "
                        f"or a layout of at most {most} thread(s)")
