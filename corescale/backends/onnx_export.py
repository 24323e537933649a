"""ONNX export of the PyTorch model, cached on disk so sweeps export each model once.

Key: model config + hash of the weights + opset + exporter (and its torch version). Each artifact is a
directory written under a temporary name and renamed into place, so concurrent instances exporting the same
model never see a half-written file: the first rename wins and the others use its result.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from corescale.backends.pytorch.backend import wrapped_torch_model
from corescale.workload.inputs import make_inputs

OPSET = 17
# The TorchScript-based exporter: onnxruntime's transformer optimizer fully fuses only its graphs.
EXPORTER = f"torch.onnx-torchscript-{torch.__version__}"
MODEL_FILE = "model.onnx"
EXTERNAL_DATA_BYTES = 3 << 29  # 1.5 GiB: derived models keep weights in model.onnx.data (protobuf limit 2 GiB;
# the exporter itself switches to external data files at that limit)


def cache_root(cfg) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir)) / "onnx"


def weights_hash(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def parameter_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def export_key(spec, module, input_names) -> str:
    identity = {"config": spec.config, "weights": weights_hash(module), "opset": OPSET, "exporter": EXPORTER,
                "inputs": list(input_names)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cached(target: Path, build: Callable[[Path], None]) -> bool:
    """Makes `target` (a directory) with build(tmp_dir) unless it exists; True when it was already there."""
    if target.is_dir():
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return False


def export(module: torch.nn.Module, spec, path: Path) -> None:
    """Dynamic batch and sequence axes; traced on a fixed small example so the graph is shape-independent."""
    example = make_inputs(spec, 2, 16, seed=0)
    names = list(example)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings about the legacy exporter
        torch.onnx.export(module, tuple(torch.from_numpy(example[n]) for n in names), str(path),
                          input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=OPSET, dynamo=False)


class OnnxModel:
    """The exported model on disk, plus what later stages (fusion, quantization) need to know."""

    def __init__(self, path: Path, key: str, large: bool, cache_hit: bool):
        self.path, self.key, self.large, self.cache_hit = path, key, large, cache_hit

    def derived(self, variant: str, build: Callable[[Path, Path, bool], None]) -> "OnnxModel":
        """A cached transformation of this model: build(source_path, output_path, external_data)."""
        target = self.path.parent.parent / f"{self.key}-{variant}"
        hit = cached(target, lambda tmp: build(self.path, tmp / MODEL_FILE, self.large))
        return OnnxModel(target / MODEL_FILE, f"{self.key}-{variant}", self.large, hit)


def onnx_model(spec, cfg, inputs: dict[str, np.ndarray], stages) -> OnnxModel:
    """The model as ONNX: built and hashed here, exported only when the cache does not have it."""
    with stages.stage("build_model"):
        module = wrapped_torch_model(spec, cfg, inputs)
    with stages.stage("hash_weights"):
        key = export_key(spec, module, inputs)
    large = parameter_bytes(module) > EXTERNAL_DATA_BYTES
    target = cache_root(cfg) / key
    with stages.stage("export"):
        hit = cached(target, lambda tmp: export(module, spec, tmp / MODEL_FILE))
    return drop_if_hit(stages, "export", OnnxModel(target / MODEL_FILE, key, large, hit))


def drop_if_hit(stages, name: str, model: OnnxModel) -> OnnxModel:
    """A stage served from the cache did no work: it is left out of the recorded stage times."""
    if model.cache_hit:
        stages.timings.pop(name, None)
    return model
