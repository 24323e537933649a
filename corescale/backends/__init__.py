"""Backend registry. Light on purpose: nothing here imports a framework."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from corescale.errors import UserError


@dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    extra: str | None  # the optional dependency group that brings the framework
    requires: tuple[str, ...]  # top-level modules that must be importable


BACKENDS: dict[str, BackendEntry] = {
    "pytorch": BackendEntry("corescale.backends.pytorch", "EagerBackend", None, ("torch",)),
    "torchscript": BackendEntry("corescale.backends.pytorch", "TorchScriptBackend", None, ("torch",)),
    "torch_compile": BackendEntry("corescale.backends.pytorch", "CompileBackend", None, ("torch",)),
    "onnxruntime": BackendEntry("corescale.backends.onnxruntime", "OnnxRuntimeBackend", "onnxruntime",
                                ("onnxruntime", "onnx")),
    "openvino": BackendEntry("corescale.backends.openvino", "OpenVinoBackend", "openvino", ("openvino", "onnx")),
    "tensorflow": BackendEntry("corescale.backends.tensorflow", "EagerBackend", "tensorflow", ("tensorflow",)),
    "tensorflow_graph": BackendEntry("corescale.backends.tensorflow", "GraphBackend", "tensorflow", ("tensorflow",)),
    "tensorflow_xla": BackendEntry("corescale.backends.tensorflow", "XlaBackend", "tensorflow", ("tensorflow",)),
}


def check_available(name: str) -> BackendEntry:
    """Fails with the extra to install when the backend's framework is missing (no framework import)."""
    entry = BACKENDS[name]
    missing = [m for m in entry.requires if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"backend '{name}' needs {', '.join(missing)}: install it with pip install 'corescale[{entry.extra}]'"
        )
    return entry


def create_backend(name: str):
    entry = check_available(name)
    return getattr(importlib.import_module(entry.module), entry.cls)()
