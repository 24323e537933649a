"""Files and places the user names: a JSON file to read, a place to write; either refused, before any work, as
one UserError line that names what it is for. And `fsync_path`, the bottom of every durable write."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from corescale.errors import UserError

MAX_TEXT_BYTES = 64 * 2**20  # a document corescale reads whole: configs, results, catalogs, histograms
MAX_CORPUS_BYTES = 1 << 30  # a workload's texts
CACHE_ENV = "CORESCALE_CACHE_DIR"  # cache_dir's default when set (the test suite's own cache)


def default_cache_dir() -> str:
    """Where exports, references, peaks and packaged models are cached unless cache_dir= says."""
    return os.environ.get(CACHE_ENV) or "~/.cache/corescale"


def sentinel_default() -> bool:
    """sentinel=: on unless CORESCALE_SENTINEL=0 (the test suite's default: tens of ms a trial, hundreds of trials)."""
    return os.environ.get("CORESCALE_SENTINEL", "1") != "0"


def read_text(path: Path | str, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """A text file a user named, read whole and bounded: a regular file (not a directory, FIFO or device such as
    /dev/zero), at most `limit` bytes, UTF-8 without NUL bytes. Anything else is one UserError naming `what` and
    the file; nothing blocks (a FIFO is opened without waiting for a writer) and nothing reads without end."""
    if not str(path).strip():
        raise UserError(f"{what} is an empty path; give a file")
    path = Path(os.path.expanduser(str(path)))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise UserError(f"{what} '{path}' is {kind}; give a text file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise UserError(f"{what} '{path}' is {_size(info.st_size)}, more than the {_size(limit)} corescale "
                            "reads; give a smaller file")
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UserError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UserError(f"{what} '{path}' grew beyond {_size(limit)} while it was read; give a smaller file")
    if b"\0" in data:
        raise UserError(f"{what} '{path}' is a binary file (it holds NUL bytes at byte {data.index(0)}); give a "
                        "UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} '{path}' is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
                        "give a UTF-8 text file") from None


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count} bytes"


def read_json(path: Path, what: str, limit: int = MAX_TEXT_BYTES) -> Any:
    """A JSON file a user handed us (through read_text); invalid JSON is a UserError naming `what` and the file."""
    return parse_json(read_text(path, what, limit), path, what)


def parse_json(text: str, path: Path, what: str) -> Any:
    """A JSON document read from `path` (read_text's): invalid or too deeply nested, a UserError naming it."""
    try:
        return json.loads(text)
    except ValueError as exc:  # also a number too large to convert (Python's int digit limit)
        raise UserError(f"corrupted {what} '{path}': not valid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"corrupted {what} '{path}': nested too deeply to be a corescale document") from None


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex."""
    import hashlib

    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    """A file's data, or a folder's entries (a rename in it), on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def require_path(value: str | None, what: str) -> None:
    """A path a user gave is not empty (an empty one would silently mean the working directory)."""
    if value is not None and not str(value).strip():
        raise UserError(f"{what} is empty; give a path (or leave it out for its default)")


def check_writable(path: Path | str, what: str, directory: bool = False, parents: bool = True) -> Path:
    """Refuses, before any work, a place corescale could not write: `path` is a file to write (or, with
    directory=True, a directory to create or write into); parents=True: missing parent directories will be
    created, so the nearest existing one must take a new entry. Probed with a temporary directory that is
    removed at once: nothing stays behind. Returns the path, `~` expanded."""
    import os
    import tempfile

    path = Path(os.path.expanduser(str(path)))
    if directory and path.exists() and not path.is_dir():
        raise UserError(f"{what} '{path}' is a file, not a directory; give a directory to write into")
    if not directory and path.is_dir():
        raise UserError(f"{what} '{path}' is a directory; give a file name")
    place = path if directory else path.parent
    if not parents and not place.is_dir():
        raise UserError(f"cannot write {what} '{path}': directory '{place}' does not exist; create it first")
    existing = next(p for p in (place, *place.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise UserError(f"cannot write {what} '{path}': '{existing}' is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".corescale-probe-", dir=existing))
    except OSError as exc:
        raise UserError(f"cannot write {what} '{path}': '{existing}' takes no new files ({exc.strerror or exc}); "
                        "choose a writable place") from None
    return path
