"""Subcommands: each module here has ORDER, register(subparsers) and sets a `handler` default; modules named
`_*` hold shared helpers."""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def command_modules(only: str | None = None):
    """Every subcommand's module, in their ORDER; `only`: just that command's when it names one (each module is
    named as its command), so that one command's start does not import what the others register with."""
    names = [info.name for info in pkgutil.iter_modules(__path__)
             if not info.name.startswith("_")]  # _common.py: shared helpers, not a subcommand
    if only in names:
        names = [only]
    modules = [importlib.import_module(f"{__name__}.{name}") for name in names]
    return sorted(modules, key=lambda module: getattr(module, "ORDER", 100))
