"""OpenVINO's compiled models kept for later loads (`compiled_cache=DIR`; `corescale serve` keeps them in the
user's cache): OpenVINO's own model cache (CACHE_DIR: the graph as the CPU plugin compiled it, named by a hash of
the model, its settings and the library's version, imported by mapping the file: ~0.1 s against ~0.4 s of
compiling an int8 MiniLM on one core), one folder per CPU kind.

OpenVINO writes a blob in place (no temporary file, no rename) and maps blobs when it reads them, so two loads
sharing its folder could read half a blob. Each load here gets a private folder holding hard links to the blobs
kept; a blob OpenVINO writes there is fsynced and renamed into the shared folder once whole. A load sees a whole
blob or none; loads that start together each compile, and the last rename wins (the same bytes). OpenVINO
removes a blob that does not import (the private link) and compiles again; the new blob replaces the damaged one."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import openvino as ov

from corescale.machine.environment import cpu_kind
from corescale.userfiles import fsync_path

SUFFIX = ".blob"  # OpenVINO's name for a cached compiled model: <hash>.blob
PRIVATE = ".load-"  # each load's private folder
STALE_S = 3600.0  # a private folder this old was left by a load that was killed


def compile_cached(core: ov.Core, network: ov.Model, config: dict,
                   root: Path | None) -> tuple[ov.CompiledModel, bool | None]:
    """The compiled model and whether it was imported from `root` (None: no cache, or one that cannot be written)."""
    try:
        private = private_folder(root / cpu_kind()) if root is not None else None
    except OSError:
        private = None
    if private is None:
        return core.compile_model(network, "CPU", config), None
    try:
        compiled = core.compile_model(network, "CPU", {**config, "CACHE_DIR": str(private)})
        hit = bool(compiled.get_property("LOADED_FROM_CACHE"))
        if not hit:
            publish(private)
        return compiled, hit
    finally:
        shutil.rmtree(private, ignore_errors=True)


def private_folder(shared: Path) -> Path:
    """A new folder in `shared` with a hard link to each blob kept there (and the stale private folders gone)."""
    shared.mkdir(parents=True, exist_ok=True)
    for stale in shared.glob(f"{PRIVATE}*"):
        try:
            if time.time() - stale.stat().st_mtime > STALE_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # removed by another load meanwhile
    private = Path(tempfile.mkdtemp(prefix=PRIVATE, dir=shared))
    try:
        for blob in shared.glob(f"*{SUFFIX}"):
            os.link(blob, private / blob.name)
    except OSError:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return private


def publish(private: Path) -> None:
    """The blobs OpenVINO wrote in `private`, on disk and renamed into the shared folder."""
    try:
        for blob in private.glob(f"*{SUFFIX}"):
            if blob.stat().st_nlink == 1:  # written by this load, not one of the links
                fsync_path(blob)
                os.replace(blob, private.parent / blob.name)
        fsync_path(private.parent)
    except OSError:
        pass  # a full or read-only disk: this load compiled, the next will too
