"""Bad input: `UserError` is reported as one line on stderr with exit code 2 (cli.py is the one place that
catches it). A malformed registry entry: `RegistrationError`, a programming error."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2."""


class RegistrationError(ValueError):
    """A registry entry (a backend's, a precision's, a task's) that lacks a fact or declares one wrongly: a
    programming error, raised at registration."""
