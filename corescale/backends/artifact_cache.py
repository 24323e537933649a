"""Artifacts cached on disk (directories built once, verified before each use).

Each artifact is built once: under an inter-process lock (`<parent>/.locks/<artifact>.lock`, fcntl, released by
the kernel if its holder dies), in a private temporary directory renamed into place when complete, with a manifest
(`manifest.json`: every file's size, modification time and sha256, read back from the disk at build). The files,
the manifest and the directory are fsynced before the rename, the parent after it. Before use the sizes are
checked always, the hashes when a file's modification time differs from the manifest's; a damaged artifact (torn
by a crash, truncated, edited, built before manifests) is removed and built again under the lock, or refused in
one line naming it when it cannot be removed. None ever sees a half-written file.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from corescale.errors import UserError
from corescale.userfiles import file_sha256, fsync_path

LOCK_DIR = ".locks"  # beside the artifacts: one lock file per artifact
MANIFEST = "manifest.json"  # in each artifact: its files' sizes, modification times and hashes


@contextmanager
def build_lock(target: Path):
    """Exclusive, across processes, while `target` is built (opened read-only: flock needs no write access, so
    a lock file another user created works too)."""
    locks = target.parent / LOCK_DIR
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{target.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def cached(target: Path, build: Callable[[Path], None]) -> bool:
    """Makes `target` (a directory) with build(tmp_dir) unless it exists intact; True when it was already there
    (also when another process built it while this one waited for the lock). A damaged one is built again."""
    if target.is_dir() and damage(target) is None:
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target):
        if target.is_dir():
            problem = damage(target)
            if problem is None:
                return True
            discard(target, problem)
        for stale in target.parent.glob(f".{target.name}.*"):  # left by a builder that was killed: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            write_manifest(tmp)  # every file fsynced, then the manifest and the directory
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users
            os.rename(tmp, target)
            fsync_path(target.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return False


def write_manifest(directory: Path) -> None:
    """Fsyncs every file of a built artifact and records its size, modification time and hash (read back from
    the disk, as a later reader will see it) in MANIFEST."""
    files = {}
    for item in sorted(directory.iterdir()):
        if not item.is_file() or item.name == MANIFEST:
            continue
        with open(item, "rb") as handle:
            os.fsync(handle.fileno())
        info = item.stat()
        files[item.name] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": file_sha256(item)}
    with open(directory / MANIFEST, "w") as handle:
        json.dump({"files": files}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(directory)


def damage(artifact: Path) -> str | None:
    """What is wrong with a cached artifact (None: intact). Sizes are checked always; a file's hash when its
    modification time is not the manifest's (copied, touched or rewritten since it was built)."""
    try:
        with open(artifact / MANIFEST, "rb") as handle:
            manifest = json.loads(handle.read(1 << 20))
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            return f"its {MANIFEST} lists no file"
        for name, entry in files.items():
            path = artifact / Path(str(name)).name
            info = path.stat()
            if info.st_size != entry["size"]:
                return f"{path.name} holds {info.st_size} bytes, its manifest says {entry['size']}"
            if info.st_mtime_ns != entry["mtime_ns"] and file_sha256(path) != entry["sha256"]:
                return f"{path.name} does not match the sha256 in its manifest"
    except FileNotFoundError as exc:
        return f"{Path(exc.filename or MANIFEST).name} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"its {MANIFEST} is unreadable ({type(exc).__name__})"
    return None


def discard(artifact: Path, problem: str) -> None:
    """Removes a damaged artifact (the caller holds its build lock), or refuses in one line naming it."""
    aside = artifact.parent / f".{artifact.name}.damaged-{os.getpid()}"
    try:
        os.rename(artifact, aside)
    except OSError as exc:
        raise UserError(f"the cached ONNX artifact '{artifact}' is damaged ({problem}) and cannot be removed "
                        f"({exc.strerror or exc}): delete it, or give cache_dir= a cache of your own") from None
    shutil.rmtree(aside, ignore_errors=True)
