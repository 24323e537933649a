"""Files and places the user names: a JSON file to read, a place to write; either refused, before any work, as
one UserError line that names what it is for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corescale.errors import UserError


def read_json(path: Path, what: str) -> Any:
    """A JSON file a user handed us; unreadable or invalid JSON is a UserError naming `what` and the file."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read {what} '{path}': {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(f"corrupted {what} '{path}': not valid JSON ({exc})") from None


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
