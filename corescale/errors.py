"""Bad input: `UserError` is reported as one line on stderr with exit code 2 (cli.py is the one place that
catches it)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2."""
