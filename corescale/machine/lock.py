"""The machine lock: one measurement at a time on this machine, across processes and users.

Everything that measures holds it: a trial (measure, stamp, commit), `explain`, `info --peak`, and a calibration
whose peak would be cached (a peak taken while another process's trial runs is not the machine's). A process that
already holds it takes it again at no cost (a trial's calibration), while another thread of the same process
still waits its turn. The kernel releases it if its holder dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from corescale.errors import UserError

# One machine-wide lock in a fixed place (not TMPDIR, which differs per user and process); CORESCALE_LOCK moves it.
LOCK_ENV = "CORESCALE_LOCK"
LOCK_PATH = Path(os.environ.get(LOCK_ENV, "/tmp/corescale-trials.lock"))

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


@contextmanager
def folder_lock(folder: Path, running: str | None = None, then: str = ""):
    """An exclusive flock on `folder` itself for the block (nothing is created in it; every thread and process
    that takes it waits its turn). With `running`, never waits: refuses with one line naming what holds it
    (`running`: "the tune in DIR") and its process, then what to do (`then`)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot open the folder '{folder}': {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if running else 0))
        except BlockingIOError:
            raise UserError(f"{running} is already running ({holder(fd) or 'another process'}); {then}") from None
        except OSError:  # a file system that cannot lock a folder (NFS emulates flock for files only): unlocked
            pass
        yield
    finally:
        os.close(fd)  # closing releases it


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
    """The lock file, shared by every user. Created here (O_EXCL): made 0666, since the umask took write access
    from the others. Found there: opened read-only (flock needs no write access, so another user's file works as
    well) and never changed; a symlink, a FIFO or a directory in its place is refused with one line (anyone may
    plant one in /tmp: following it would hand them this user's file)."""
    for _ in range(10):  # created and removed by another process meanwhile: try again
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            pass
        except OSError as exc:
            raise _lock_error(path, exc) from None
        else:
            os.fchmod(fd, 0o666)  # ours, just made: shared with every user
            return fd
        try:  # O_NONBLOCK: a FIFO would block the open until someone writes to it
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _lock_error(path, exc) from None
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            return fd
        os.close(fd)
        raise _not_a_file(path, info)
    raise UserError(f"the machine lock {path} keeps appearing and disappearing: set {LOCK_ENV} to another path")


def _lock_error(path: Path, exc: OSError) -> UserError:
    """One line saying what is at the lock's path and what to do."""
    try:
        info = os.lstat(path)
    except OSError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        return UserError(f"the machine lock {path} is a symbolic link (owner uid {info.st_uid}), which corescale "
                         f"never follows: remove it or set {LOCK_ENV} to another path")
    if info is not None and not stat.S_ISREG(info.st_mode):  # a socket cannot even be opened
        return _not_a_file(path, info)
    if exc.errno in (errno.EACCES, errno.EPERM) and info is not None:
        return UserError(f"cannot open the machine lock {path} (owner uid {info.st_uid}, mode "
                         f"{stat.S_IMODE(info.st_mode):04o}): ask its owner to `chmod 644 {path}`, or set "
                         f"{LOCK_ENV} to a path every user of this machine can read")
    return UserError(f"cannot open the machine lock {path}: {exc.strerror or exc}; set {LOCK_ENV} to another path")


def _not_a_file(path: Path, info: os.stat_result) -> UserError:
    return UserError(f"the machine lock {path} is {_kind(info.st_mode)}, not a regular file: remove it (owner uid "
                     f"{info.st_uid}) or set {LOCK_ENV} to another path")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "something else"
