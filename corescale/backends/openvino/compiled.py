"""OpenVINO's compiled models kept for later loads (`compiled_cache=DIR`; `corescale serve` keeps them in the
user's cache): the graph as the CPU plugin compiled it, exported once and imported by every later load of the same
model files with the same settings, library version and CPU kind (import: ~0.1 s against ~0.4 s of compiling an
int8 MiniLM on one core).

Not OpenVINO's own CACHE_DIR: it writes each blob in place, with no temporary file and no rename, and maps blobs
when it reads them, so two services starting together on one cache could read a half-written blob. Here a blob
is written to a private temporary file, fsynced and renamed into place: a load sees a whole blob or none, and
instances that start together each compile and the last rename wins. A blob that does not import (damaged) is
removed and the model compiled again."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import openvino as ov

from corescale.machine.environment import cpu_kind
from corescale.userfiles import fsync_path

SUFFIX = ".blob"


def model_files(path: Path) -> list[Path]:
    """The files a model is read from: the named one and its same-stem siblings (an IR's .bin, an ONNX file's
    external data)."""
    return [path, *sorted(p for p in path.parent.glob(f"{path.stem}.*") if p != path and p.is_file())]


def blob_path(root: Path, model: Path, config: dict) -> Path:
    digest = hashlib.sha256()
    for name in model_files(model):
        with open(name, "rb") as handle:
            digest.update(name.name.encode() + b"\0" + hashlib.file_digest(handle, "sha256").digest())
    identity = {"config": config, "openvino": ov.get_version(), "cpu": cpu_kind()}
    digest.update(json.dumps(identity, sort_keys=True, default=str).encode())
    return root / f"{digest.hexdigest()[:32]}{SUFFIX}"


def compile_cached(core: ov.Core, network: ov.Model, model: Path, config: dict,
                   root: Path | None) -> tuple[ov.CompiledModel, bool | None]:
    """The compiled model and whether it came from `root` (None: no cache, or one that cannot be written)."""
    if root is None:
        return core.compile_model(network, "CPU", config), None
    try:
        root.mkdir(parents=True, exist_ok=True)
        blob = blob_path(root, model, config)
    except OSError:
        return core.compile_model(network, "CPU", config), None
    if blob.is_file():
        try:
            return core.import_model(blob.read_bytes(), "CPU", config), True
        except (OSError, RuntimeError):
            blob.unlink(missing_ok=True)
    compiled = core.compile_model(network, "CPU", config)
    try:
        store(blob, compiled.export_model().getbuffer())
    except OSError:
        pass  # a full or read-only cache: this load compiled, the next will too
    return compiled, False


def store(blob: Path, data: memoryview) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{blob.stem}.", dir=blob.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, blob)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(blob.parent)
