"""CPU topology of the usable (online AND allowed) CPUs: sockets, NUMA nodes, physical cores.

Pure standard library. Sources: a sysfs tree (the running machine, or a fake one in tests)
or `lscpu -p` text (any machine, including one you are thinking of buying).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from corescale.errors import UserError
from corescale.machine.cgroup import CGROUP_ROOT, read_limits
from corescale.machine.cpulist import format_cpulist, parse_cpulist

SYSFS_CPU_ROOT = "/sys/devices/system/cpu"
SYSFS_NODE_ROOT = "/sys/devices/system/node"
# First readable, non-empty file wins: cgroup v2, then v1 (effective, then configured).
CGROUP_CPUSET_PATHS = (
    "/sys/fs/cgroup/cpuset.cpus.effective",
    "/sys/fs/cgroup/cpuset/cpuset.effective_cpus",
    "/sys/fs/cgroup/cpuset/cpuset.cpus",
)
LSCPU_HINT = "run `lscpu -p=CPU,CORE,SOCKET,NODE`"


@dataclass(frozen=True)
class Cpu:
    """One logical CPU. `core` is a machine-unique physical-core key (not sysfs core_id)."""

    id: int
    core: int
    socket: int
    node: int


@dataclass(frozen=True)
class Topology:
    """The usable CPUs of a machine, sorted by id."""

    cpus: tuple[Cpu, ...]

    def __post_init__(self) -> None:
        cpus = tuple(sorted(self.cpus, key=lambda c: c.id))
        object.__setattr__(self, "cpus", cpus)
        ids = [c.id for c in cpus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate CPU ids in topology: {ids}")
        where: dict[int, tuple[int, int]] = {}
        for c in cpus:  # siblings of a core must share socket and node
            if where.setdefault(c.core, (c.socket, c.node)) != (c.socket, c.node):
                raise ValueError(f"core {c.core} spans sockets/NUMA nodes (CPU {c.id})")

    @property
    def cpu_ids(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.cpus)

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({c.socket for c in self.cpus}))

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({c.node for c in self.cpus}))

    @property
    def physical_cores(self) -> tuple[tuple[int, ...], ...]:
        """Usable CPU ids of each physical core; cores ordered by their lowest CPU id."""
        by_core: dict[int, list[int]] = {}
        for c in self.cpus:  # cpus are sorted, so each list is sorted and dict order is by lowest id
            by_core.setdefault(c.core, []).append(c.id)
        return tuple(tuple(ids) for ids in by_core.values())

    def cores_in_node(self, node: int) -> tuple[tuple[int, ...], ...]:
        """The physical cores (as in `physical_cores`) of one NUMA node."""
        node_of = {c.id: c.node for c in self.cpus}
        return tuple(core for core in self.physical_cores if node_of[core[0]] == node)

    def summary(self) -> str:
        """E.g. "2 sockets, 4 NUMA nodes, 48 physical cores, 96 logical CPUs usable"."""
        parts = [
            plural(len(self.sockets), "socket"),
            plural(len(self.numa_nodes), "NUMA node"),
            plural(len(self.physical_cores), "physical core"),
            plural(len(self.cpus), "logical CPU"),
        ]
        return ", ".join(parts) + " usable"

    # ---- sources -------------------------------------------------------------------------

    @classmethod
    def from_sysfs(
        cls,
        root: str | os.PathLike[str] = SYSFS_CPU_ROOT,
        node_root: str | os.PathLike[str] = SYSFS_NODE_ROOT,
        allowed: Iterable[int] | None = None,
        cgroup_cpuset_paths: Sequence[str | os.PathLike[str]] | None = None,
    ) -> Topology:
        """Read the topology from sysfs; `allowed` defaults to `default_allowed(cgroup_cpuset_paths)`."""
        root = Path(root)
        online = _sysfs_online(root)
        # Node of each CPU; no NUMA information means one node 0.
        node_of: dict[int, int] = {}
        for d in Path(node_root).glob("node*"):
            m = re.fullmatch(r"node([0-9]+)", d.name)
            if m:
                for cpu in parse_cpulist(read_text(d / "cpulist") or ""):
                    node_of[cpu] = int(m[1])
        # Core identity: (package, lowest thread sibling), which is machine-unique; the sibling
        # list is the kernel's definition of "same core". Without it, (package, core_id).
        keys: dict[tuple[str, int, int], int] = {}
        cpus = []
        for cpu in online:
            topo = root / f"cpu{cpu}" / "topology"
            package = _read_int(topo / "physical_package_id")
            package = 0 if package is None else package
            siblings = parse_cpulist(read_text(topo / "thread_siblings_list") or "")
            if siblings:
                ident = ("siblings", package, min(siblings + (cpu,)))
            else:
                core_id = _read_int(topo / "core_id")
                ident = ("core_id", package, core_id) if core_id is not None else ("alone", package, cpu)
            core = keys.setdefault(ident, len(keys))
            cpus.append(Cpu(id=cpu, core=core, socket=max(package, 0), node=node_of.get(cpu, 0)))
        if allowed is None:
            allowed = default_allowed(cgroup_cpuset_paths)
        return _usable(cpus, allowed, f"sysfs {root}")

    @classmethod
    def from_lscpu(cls, text: str, allowed: Iterable[int] | None = None) -> Topology:
        """Parse `lscpu -p=CPU,CORE,SOCKET,NODE[,ONLINE]` or plain `lscpu -p` output.

        `allowed` defaults to every listed online CPU (the text may describe another machine).
        """
        header: list[str] | None = None
        rows: list[tuple[int, list[str]]] = []
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line.startswith("#"):
                names = [n.strip().lower() for n in line[1:].split(",")]
                if "cpu" in names and all(re.fullmatch(r"[a-z0-9]*", n) for n in names):
                    header = names  # the column header, e.g. "# CPU,Core,Socket,Node,,L1d,L1i,L2,L3"
            elif line:
                rows.append((lineno, [f.strip() for f in line.split(",")]))
        if header is None:  # comments stripped: assume the documented column order
            header = ["cpu", "core", "socket", "node", "online"]
        missing = [n for n in ("cpu", "core", "socket", "node") if n not in header]
        if missing:
            raise UserError(f"lscpu output lacks column(s) {', '.join(missing).upper()}: {LSCPU_HINT}")
        col: dict[str, int] = {n: header.index(n) for n in ("cpu", "core", "socket", "node", "online") if n in header}

        def field(lineno: int, fields: list[str], name: str, default: int | None = None) -> int:
            value = fields[col[name]]
            if value == "" and default is not None:
                return default
            if not re.fullmatch(r"[0-9]{1,6}", value):  # a whole number of at most 6 digits (Linux: < 8192 CPUs)
                raise UserError(f"lscpu line {lineno}: bad {name.upper()} value '{value[:20]}': {LSCPU_HINT}")
            return int(value)

        width = max(col["cpu"], col["core"], col["socket"], col["node"]) + 1
        cpus = []
        for lineno, fields in rows:
            if len(fields) < width:
                raise UserError(f"lscpu line {lineno}: expected {width} columns, got {len(fields)}: {LSCPU_HINT}")
            if "online" in col and col["online"] < len(fields) and fields[col["online"]].upper() == "N":
                continue  # offline CPU listed by `lscpu -a`
            cpus.append(
                Cpu(
                    id=field(lineno, fields, "cpu"),
                    core=field(lineno, fields, "core"),
                    socket=field(lineno, fields, "socket", 0),
                    node=field(lineno, fields, "node", 0),
                )
            )
        if not cpus:
            raise UserError(f"lscpu output lists no online CPUs: {LSCPU_HINT}")
        if allowed is None:
            allowed = [c.id for c in cpus]
        try:
            return _usable(cpus, allowed, "lscpu output")
        except ValueError as e:  # inconsistent text (duplicate CPU, core split across nodes)
            raise UserError(f"inconsistent lscpu output: {e}") from None


def default_allowed(cgroup_cpuset_paths: Sequence[str | os.PathLike[str]] | None = None) -> frozenset[int]:
    """CPUs this process may run on: its affinity, narrowed by the cgroup cpuset if readable (its own cgroup's,
    machine/cgroup.py; or the first readable of `cgroup_cpuset_paths`)."""
    try:
        affinity = frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = frozenset(range(os.cpu_count() or 1))
    cpuset = cgroup_cpuset(cgroup_cpuset_paths) if cgroup_cpuset_paths is not None else \
        (read_limits().cpus or cgroup_cpuset())
    narrowed = affinity & frozenset(cpuset) if cpuset else affinity
    return narrowed or affinity  # a cpuset file from another cgroup level must not empty it


def cgroup_cpuset(paths: Sequence[str | os.PathLike[str]] = CGROUP_CPUSET_PATHS) -> tuple[int, ...] | None:
    """CPUs of the first readable, non-empty cgroup cpuset file, or None."""
    for path in paths:
        text = read_text(Path(path))
        if text:
            return parse_cpulist(text)
    return None


def cgroup_cpu_quota(root: str | os.PathLike[str] = CGROUP_ROOT) -> float | None:
    """CPU bandwidth limit in CPUs (cgroup v2 cpu.max or v1 cfs quota/period) of this process's cgroup and its
    parents (machine/cgroup.py); None if unlimited."""
    return read_limits(root).quota


# ---- helpers ---------------------------------------------------------------------------------


def _usable(cpus: list[Cpu], allowed: Iterable[int], source: str) -> Topology:
    allowed = frozenset(allowed)
    usable = [c for c in cpus if c.id in allowed]
    if not usable:
        existing = format_cpulist(c.id for c in cpus) or "none"
        raise UserError(
            f"none of the allowed CPUs ({format_cpulist(allowed) or 'none'}) exist on this machine "
            f"(CPUs: {existing}; from {source})"
        )
    return Topology(tuple(usable))


def _sysfs_online(root: Path) -> tuple[int, ...]:
    text = read_text(root / "online")
    if text is not None:
        return parse_cpulist(text)
    # No `online` file: every cpuN directory whose own `online` flag is not 0.
    cpus = [int(d.name[3:]) for d in root.glob("cpu[0-9]*") if d.name[3:].isdigit()]
    online = tuple(sorted(c for c in cpus if read_text(root / f"cpu{c}" / "online") != "0"))
    if not online:
        raise UserError(f"cannot read the CPU list from {root}: no `online` file and no cpuN directories")
    return online


def read_text(path) -> str | None:
    """A sysfs/procfs file's stripped text, or None when it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
