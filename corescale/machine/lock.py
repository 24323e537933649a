"""The machine lock: one measurement at a time on this machine, across processes and users.

Everything that measures holds it: a trial (measure, stamp, commit), `explain`, `info --peak`, and a calibration
whose peak would be cached (a peak taken while another process's trial runs is not the machine's). A process that
already holds it takes it again at no cost (a trial's calibration), while another thread of the same process
still waits its turn. The kernel releases it if its holder dies.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

# One machine-wide lock in a fixed place (not TMPDIR, which differs per user and process); CORESCALE_LOCK moves it.
LOCK_PATH = Path(os.environ.get("CORESCALE_LOCK", "/tmp/corescale-trials.lock"))

_held = threading.local()  # per thread: the lock paths this thread holds and how deeply


@contextmanager
def machine_lock(path: Path | None = None, on_wait=None):
    """Holds the machine lock for the block; yields the seconds spent waiting for another process.

    on_wait(path, holder) is called once before waiting (holder: the other process, as holder() names it)."""
    path = path or LOCK_PATH
    depth = getattr(_held, "paths", None) or {}
    _held.paths = depth
    if depth.get(path):  # this thread holds it already (a trial's calibration, explain's peak)
        depth[path] += 1
        try:
            yield 0.0
        finally:
            depth[path] -= 1
        return
    fd = _open_lock(path)
    started = time.monotonic()
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait(path, holder(fd))
            fcntl.flock(fd, fcntl.LOCK_EX)
        depth[path] = 1
        try:
            yield time.monotonic() - started
        finally:
            depth[path] = 0
    finally:
        os.close(fd)  # closing releases the lock


def holder(fd: int) -> str:
    """'pid N: its command line' of the process holding the lock on `fd`'s file ('' when the kernel hides it)."""
    info = os.fstat(fd)
    file_id = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for line in locks:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == file_id and fields[4].isdigit():
            pid = int(fields[4])
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                command = ""
            return f"pid {pid}: {' '.join(command.split())[:200]}".rstrip(": ")  # one line, however it was called
    return ""


def _open_lock(path: Path) -> int:
    """The lock file, shared by every user: made 0666 by whoever creates it; flock needs no write access, so
    another user's read-only file works as well."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o666)  # the umask took write access from the others
    except PermissionError:
        pass  # someone else's file: it is theirs to change
    return fd
