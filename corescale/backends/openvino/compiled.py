"""OpenVINO's compiled models kept for later loads (`compiled_cache=DIR`; `corescale serve` keeps them in the
user's cache): OpenVINO's own model cache (CACHE_DIR: the graph as the CPU plugin compiled it, named by a hash of
the model, its settings and the library's version, imported by mapping the file: ~0.1 s against ~0.4 s of
compiling an int8 MiniLM on one core), one folder per CPU kind.

OpenVINO writes a blob in place (no temporary file, no rename) and maps blobs when it reads them, so two loads
sharing its folder could read half a blob. Each load here gets a private folder holding hard links to the blobs
kept; a blob OpenVINO writes there is fsynced and renamed into the shared folder once whole. A load sees a whole
blob or none; loads that start together each compile, and the last rename wins (the same bytes). OpenVINO
removes a blob that does not import (the private link) and compiles again; the new blob replaces the damaged one.
OpenVINO's name for a blob is a 64-bit hash, not one a bundle cannot collide with on purpose: each model's blobs
live in a folder named by the sha256 of its files, so a load imports only what was compiled from the same bytes.
A CPU kind's folder is bounded: blobs no load imported for 30 days go, then the least recently imported past
2 GiB."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import openvino as ov

from corescale.machine.environment import cpu_kind
from corescale.userfiles import file_sha256, fsync_path

SUFFIX = ".blob"  # OpenVINO's name for a cached compiled model: <hash>.blob
PRIVATE = ".load-"  # each load's private folder
STALE_S = 3600.0  # a private folder this old was left by a load that was killed
# what a CPU kind's folder may hold: blobs unused this long are removed, then the least recently used past the
# size (an int8 MiniLM's blob is 59 MB; each OpenVINO version or model variant adds its own)
UNUSED_S = 30 * 86400.0
KEPT_BYTES = 2 << 30


def model_digest(model: Path) -> str:
    """sha256 over the files a model is read from: the named one and its same-stem siblings (an IR's .bin, an
    ONNX file's external data as corescale and optimum name it)."""
    digest = hashlib.sha256()
    for path in [model, *sorted(p for p in model.parent.glob(f"{model.stem}.*") if p != model and p.is_file())]:
        digest.update(f"{path.name}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()[:32]


def compile_cached(core: ov.Core, network: ov.Model, model: Path, config: dict,
                   root: Path | None) -> tuple[ov.CompiledModel, bool | None]:
    """The compiled model and whether it was imported from `root` (None: no cache, or one that cannot be written);
    `model`: the file `network` was read from."""
    try:
        private = private_folder(root / cpu_kind() / model_digest(model)) if root is not None else None
    except OSError:
        private = None
    if private is None:
        return core.compile_model(network, "CPU", config), None
    try:
        compiled = core.compile_model(network, "CPU", {**config, "CACHE_DIR": str(private)})
        hit = bool(compiled.get_property("LOADED_FROM_CACHE"))
        if hit:
            used(private)
        else:
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
    """The blobs OpenVINO wrote in `private`, on disk and renamed into the shared folder; then the folder pruned."""
    try:
        for blob in private.glob(f"*{SUFFIX}"):
            if blob.stat().st_nlink == 1:  # written by this load, not one of the links
                fsync_path(blob)
                os.replace(blob, private.parent / blob.name)
        fsync_path(private.parent)
        prune(private.parent.parent)
    except OSError:
        pass  # a full or read-only disk: this load compiled, the next will too


def used(private: Path) -> None:
    """The imported blob's modification time is when a load last used it (what `prune` reads). Which blob OpenVINO
    imported it does not say: the one it mapped (/proc/self/maps names the private link; it shares the inode)."""
    prefix = f"{private}/"
    try:
        with open("/proc/self/maps") as maps:
            mapped = {line.split(maxsplit=5)[-1].strip() for line in maps if prefix in line}
    except OSError:
        return
    for name in mapped:
        try:
            os.utime(name)
        except OSError:
            pass  # another user's blob: it ages as its owner's loads use it


def prune(kind: Path, unused_s: float = UNUSED_S, kept_bytes: int = KEPT_BYTES) -> list[Path]:
    """Removes the blobs (of every model, in a CPU kind's folder) no load used for `unused_s`, then the least
    recently used until the rest fit in `kept_bytes` (the newest always stays); returns what was removed."""
    found = []
    for blob in kind.glob(f"*/*{SUFFIX}"):
        try:
            info = blob.stat()
        except OSError:
            continue  # removed meanwhile
        found.append((info.st_mtime, info.st_size, blob))
    found.sort(reverse=True)  # most recently used first
    now, total, removed = time.time(), 0, []
    for rank, (mtime, size, blob) in enumerate(found):
        total += size
        if rank > 0 and (now - mtime > unused_s or total > kept_bytes):
            blob.unlink(missing_ok=True)
            removed.append(blob)
            total -= size
    return removed
