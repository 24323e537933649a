"""LD_PRELOAD as the dynamic loader reads it. ld.so splits the variable on spaces as well as colons (ld.so(8)), so a
library under a path holding either (a checkout or virtualenv in "a folder as users have it") breaks every process
it is preloaded into: the loader tries each fragment as a library and the process may abort. Such a library is
reached through a symbolic link of its own name in a private, space-free folder this process owns and removes when
it exits; the record keeps the library's real path (what ran), the child's environment the link (what ld.so reads).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

from corescale.errors import UserError

SPLITS = re.compile(r"[\s:]")  # what ld.so takes as a separator in LD_PRELOAD
PREFIX = "corescale-preload-"  # PREFIX + owner pid + "-" + mkdtemp's letters
ELF_MAGIC = b"\x7fELF"


def loader_safe(path: str) -> bool:
    """Whether ld.so reads `path` whole in LD_PRELOAD."""
    return bool(path) and not SPLITS.search(path)


def shown(path: Path | str, most: int = 160) -> str:
    """A path for a one-line message: its end (the file's name) where it is long."""
    text = str(path)
    return text if len(text) <= most else f"…{text[-most:]}"


def check_library(path: Path, what: str) -> Path:
    """`path` is a shared library the loader can preload (an ELF file), else one line naming it."""
    try:
        with open(path, "rb") as file:
            magic = file.read(len(ELF_MAGIC))
    except OSError as err:
        raise UserError(f"{what} {shown(path)} cannot be read ({err.strerror}); nothing was started") from None
    if magic != ELF_MAGIC:
        raise UserError(f"{what} {shown(path)} is not an ELF shared library, so the dynamic loader cannot preload "
                        "it; point it at the library itself (a .so file); nothing was started")
    return path


def candidate_bases() -> list[Path]:
    """Where the private folder may go: the temporary folder, else the usual system ones (each must be space-free)."""
    found = []
    for base in (tempfile.gettempdir(), "/tmp", "/dev/shm", "/var/tmp"):
        path = Path(base)
        if path not in found:
            found.append(path)
    return found


def remove_stale(base: Path) -> None:
    """Folders left by a corescale process that died without removing its own (SIGKILL): removed when their owner
    is gone and they are this user's."""
    for folder in base.glob(f"{PREFIX}*-*"):
        owner = folder.name[len(PREFIX):].split("-", 1)[0]
        try:
            if not owner.isdigit() or folder.stat().st_uid != os.getuid() or pid_alive(int(owner)):
                continue
        except OSError:
            continue
        shutil.rmtree(folder, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.lru_cache(maxsize=1)
def link_folder() -> Path:
    """This process's private folder of links, made on first use and removed at exit."""
    for base in candidate_bases():
        if not loader_safe(str(base)) or not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
            continue
        remove_stale(base)
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        atexit.register(shutil.rmtree, folder, True)
        return folder
    raise UserError("a library to preload lies under a path with a space or ':', which LD_PRELOAD cannot name, and no "
                    f"temporary folder free of them is writable here ({', '.join(map(str, candidate_bases()))}); set "
                    "TMPDIR to such a folder; nothing was started")


def loader_path(library: Path) -> str:
    """What LD_PRELOAD names for `library`: itself where ld.so reads it whole, else a link to it in link_folder()."""
    text = str(library)
    if loader_safe(text):
        return text
    if not loader_safe(library.name):
        raise UserError(f"the library {shown(text)} has a space or ':' in its file name, which LD_PRELOAD cannot name "
                        "even through a link of that name; rename it; nothing was started")
    folder = link_folder()
    resolved = library.resolve()
    for slot in sorted(folder.iterdir(), key=lambda p: int(p.name)) if folder.exists() else []:
        link = slot / library.name
        if link.is_symlink() and Path(os.readlink(link)) == resolved:
            return str(link)
    slot = folder / str(sum(1 for _ in folder.iterdir()))
    slot.mkdir()
    (slot / library.name).symlink_to(resolved)
    return str(slot / library.name)


def loader_form(value: str) -> str:
    """An LD_PRELOAD value of colon-separated library paths (what corescale records) as ld.so must read it."""
    return ":".join(loader_path(Path(entry)) for entry in value.split(":") if entry)
