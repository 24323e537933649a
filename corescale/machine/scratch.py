"""Temporary directories that name their owner, so that those of a killed process are collected.

Every temporary directory corescale makes (a trial's work dir, fork servers' logs, explain's and `info --peak`'s
work dirs, a result directory being written) holds a small marker: the host, its boot, the PID namespace, the
owner's pid and that process's start time. A normal end or a handled signal removes the directory at once; one
left by SIGKILL, an OOM kill or a crash is removed the next time corescale makes one in the same place, once its
owner is known to be dead. A directory without a marker, of another user, or of another host or PID namespace
(a shared /tmp or NFS folder) is never touched.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from corescale.machine.topology import read_text

OWNER_FILE = ".corescale-owner"
PREFIX = "corescale-"  # every scratch directory's in the temp dir


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None when it is gone."""
    stat = read_text(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def owner(pid: int | None = None) -> dict:
    pid = os.getpid() if pid is None else pid
    return {"host": platform.node(), "boot": (read_text("/proc/sys/kernel/random/boot_id") or "").strip(),
            "pidns": _pid_namespace(), "pid": pid, "started": start_time(pid)}


def mark(folder: Path) -> None:
    """Names this process as the owner of `folder` (which it just made)."""
    (folder / OWNER_FILE).write_text(json.dumps(owner()))


def unmark(folder: Path) -> None:
    (folder / OWNER_FILE).unlink(missing_ok=True)


def dead(recorded: dict) -> bool:
    """True when the recorded owner is known to be gone; False when it lives or cannot be told (another host or
    PID namespace, a malformed marker)."""
    here = owner()
    if not isinstance(recorded, dict) or recorded.get("host") != here["host"] or not isinstance(recorded.get("pid"),
                                                                                                int):
        return False
    if recorded.get("boot") != here["boot"]:
        return bool(here["boot"])  # this host rebooted since: every process of that boot is gone
    if recorded.get("pidns") != here["pidns"]:
        return False
    return start_time(recorded["pid"]) != recorded.get("started")  # gone, or the pid reused by another process


def collect(folder: Path, prefix: str) -> list[Path]:
    """Removes the directories `prefix*` in `folder` that this user's dead processes left; returns them."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if (not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False)
                    or entry.stat(follow_symlinks=False).st_uid != os.geteuid()):
                continue
            recorded = json.loads(Path(entry.path, OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # no marker (yet, or an older version's): not ours to judge
        if dead(recorded):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


@contextmanager
def scratch(kind: str = "", under: str | None = None):
    """A marked temporary directory (`corescale-KIND-*` in the temp dir, or in `under`) for the block, removed at
    its end; the ones killed processes left are collected first."""
    root = Path(under or tempfile.gettempdir())
    collect(root, PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{kind + '-' if kind else ''}", dir=root) as work:
        mark(Path(work))
        yield Path(work)


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
