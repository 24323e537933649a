"""Backend registry: names, option dataclasses, extras. Light on purpose: nothing here imports a framework
(or the config, which reads this registry)."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from corescale.backends.onnxruntime.options import OnnxRuntimeOptions
from corescale.backends.openvino.options import OpenVinoOptions
from corescale.backends.options import BackendOptions
from corescale.backends.pytorch.options import PyTorchOptions, TorchCompileOptions, TorchScriptOptions
from corescale.backends.tensorflow.options import TensorFlowGraphOptions, TensorFlowOptions, TensorFlowXlaOptions
from corescale.errors import UserError


@dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    options: type[BackendOptions]  # the Hydra group node of `backend=NAME`
    extra: str | None  # the optional dependency group that brings the framework
    requires: tuple[str, ...]  # top-level modules that must be importable


_TORCH, _ORT, _OV, _TF = ("torch",), ("onnxruntime", "onnx"), ("openvino", "onnx"), ("tensorflow",)
BACKENDS: dict[str, BackendEntry] = {
    "pytorch": BackendEntry("corescale.backends.pytorch.backend", "EagerBackend", PyTorchOptions, None, _TORCH),
    "torchscript": BackendEntry("corescale.backends.pytorch.backend", "TorchScriptBackend", TorchScriptOptions,
                                None, _TORCH),
    "torch_compile": BackendEntry("corescale.backends.pytorch.backend", "CompileBackend", TorchCompileOptions,
                                  None, _TORCH),
    "onnxruntime": BackendEntry("corescale.backends.onnxruntime.backend", "OnnxRuntimeBackend", OnnxRuntimeOptions,
                                "onnxruntime", _ORT),
    "openvino": BackendEntry("corescale.backends.openvino.backend", "OpenVinoBackend", OpenVinoOptions, "openvino",
                             _OV),
    "tensorflow": BackendEntry("corescale.backends.tensorflow.backend", "EagerBackend", TensorFlowOptions,
                               "tensorflow", _TF),
    "tensorflow_graph": BackendEntry("corescale.backends.tensorflow.backend", "GraphBackend", TensorFlowGraphOptions,
                                     "tensorflow", _TF),
    "tensorflow_xla": BackendEntry("corescale.backends.tensorflow.backend", "XlaBackend", TensorFlowXlaOptions,
                                   "tensorflow", _TF),
}
OPTIONS: dict[str, type[BackendOptions]] = {name: entry.options for name, entry in BACKENDS.items()}


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
