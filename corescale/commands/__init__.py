"""Subcommands: each module here has ORDER, register(subparsers) and sets a `handler` default."""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def command_modules():
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    return sorted(modules, key=lambda module: getattr(module, "ORDER", 100))
