"""Bad input: `UserError` is reported as one line on stderr with exit code 2 (cli.py is the one place that
catches it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2."""


def read_json(path: Path, what: str) -> Any:
    """A JSON file a user handed us; unreadable or invalid JSON is a UserError naming `what` and the file."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read {what} '{path}': {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(f"corrupted {what} '{path}': not valid JSON ({exc})") from None
