"""Subcommands: each module here has ORDER, register(subparsers) and sets a `handler` default; modules named
`_*` hold shared helpers."""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def command_modules():
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
               if not info.name.startswith("_")]  # _common.py: shared helpers, not a subcommand
    return sorted(modules, key=lambda module: getattr(module, "ORDER", 100))
