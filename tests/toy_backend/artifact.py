"""The toy's artifact hooks (TOY_FILE): a bundle copies its weights file, `corescale serve` links the bundle's copy
into its runtime cache where the toy's load finds it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FILE = "weights.npz"


def cache_root(cfg) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir)) / "toy"


def collect(model_path: Path, into: Path) -> list[str]:
    """The file that ran, copied into `into`; its key (the folder it is cached in) is what install needs."""
    into.mkdir()
    shutil.copy2(model_path, into / model_path.name)
    return [model_path.parent.name]


def install(folder: Path, steps: list[str], cfg) -> None:
    cache_root(cfg).mkdir(parents=True, exist_ok=True)
    os.symlink(folder.resolve(), cache_root(cfg) / steps[0])
