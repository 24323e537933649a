"""ONNX export of the PyTorch model, cached on disk so sweeps export each model once.

Key: model config + hash of the weights + opset + exporter (and its torch version). Each artifact (the export
and every variant derived from it: fusion, quantization) is built once: under an inter-process lock
(`<cache>/onnx/.locks/<artifact>.lock`, fcntl, released by the kernel if its holder dies), in a private temporary
directory renamed into place when complete. Instances that start together on a cold cache wait for the one
building it, then use its result; none ever sees a half-written file. A derived variant reads its input through
a private view (links in its own temporary directory), because tools such as quantize_dynamic write scratch
files beside their input.

The key needs the model built in torch, so each export is also filed under its source
(`<cache>/onnx-sources/<source>.json`; the source: the model's identity and files, seed, inputs, opset, torch's
and Transformers' versions, all known without importing either): a worker whose source was exported before
opens the artifact with neither torch nor Transformers imported (torch is imported here only to build and
export).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

from corescale.workload.inputs import make_inputs
from corescale.workload.models import source_files

OPSET = 17
MODEL_FILE = "model.onnx"
SOURCES_DIR = "onnx-sources"  # beside the artifacts' folder: source -> artifact, see the module's docstring
LOCK_DIR = ".locks"  # beside the artifacts: one lock file per artifact
EXTERNAL_DATA_BYTES = 3 << 29  # 1.5 GiB: derived models keep weights in model.onnx.data (protobuf limit 2 GiB;
# the exporter itself switches to external data files at that limit)


def cache_root(cfg) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir)) / "onnx"


def exporter() -> str:
    """The TorchScript-based exporter: onnxruntime's transformer optimizer fully fuses only its graphs."""
    import torch

    return f"torch.onnx-torchscript-{torch.__version__}"


def weights_hash(module) -> str:
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def parameter_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def export_key(spec, module, input_names) -> str:
    identity = {"config": spec.config, "weights": weights_hash(module), "opset": OPSET, "exporter": exporter(),
                "inputs": list(input_names), **spec.head.identity()}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


@contextmanager
def build_lock(target: Path):
    """Exclusive, across processes, while `target` is built (opened read-only: flock needs no write access, so
    a lock file another user created works too)."""
    locks = target.parent / LOCK_DIR
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{target.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def cached(target: Path, build: Callable[[Path], None]) -> bool:
    """Makes `target` (a directory) with build(tmp_dir) unless it exists; True when it was already there
    (also when another process built it while this one waited for the lock)."""
    if target.is_dir():
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target):
        if target.is_dir():
            return True
        for stale in target.parent.glob(f".{target.name}.*"):  # left by a builder that was killed: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return False


def private_view(source: Path, where: Path) -> Path:
    """`source` (a model file) seen from a directory of our own: a link to every file beside it (external data
    included), so scratch files a tool writes next to its input land in `where`, not in the shared cache."""
    where.mkdir()
    for item in source.parent.iterdir():
        if item.is_file():
            os.symlink(item.resolve(), where / item.name)
    return where / source.name


def export(module, spec, path: Path) -> None:
    """The model with its head (one output, named by the task); dynamic batch and sequence axes; traced on a
    fixed small example so the graph is shape-independent."""
    import torch

    example = make_inputs(spec, 2, 16, seed=0)
    names = list(example)
    output = spec.head.output_name
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[output] = {0: "batch", 1: "sequence"} if spec.task == "encode" else {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings about the legacy exporter
        torch.onnx.export(module, tuple(torch.from_numpy(example[n]) for n in names), str(path),
                          input_names=names, output_names=[output], dynamic_axes=axes,
                          opset_version=OPSET, dynamo=False)


class OnnxModel:
    """The exported model on disk, plus what later stages (fusion, quantization) need to know."""

    def __init__(self, path: Path, key: str, large: bool, cache_hit: bool):
        self.path, self.key, self.large, self.cache_hit = path, key, large, cache_hit

    def derived(self, variant: str, build: Callable[[Path, Path, bool], None]) -> "OnnxModel":
        """A cached transformation of this model: build(source_path, output_path, external_data)."""
        target = self.path.parent.parent / f"{self.key}-{variant}"

        def build_variant(tmp: Path) -> None:
            view = tmp / ".input"
            build(private_view(self.path, view), tmp / MODEL_FILE, self.large)
            shutil.rmtree(view)  # the links (and the tool's scratch files) are not part of the artifact

        hit = cached(target, build_variant)
        return OnnxModel(target / MODEL_FILE, f"{self.key}-{variant}", self.large, hit)


def onnx_model(spec, cfg, inputs: dict[str, np.ndarray], stages) -> OnnxModel:
    """The model as ONNX: from its source's entry when this source was exported before (no torch, no
    Transformers); otherwise built and hashed, exported only when the cache does not have it, and filed."""
    source = source_key(spec, cfg, inputs)
    known = known_export(cfg, source) if source else None
    if known is not None:
        return known
    model = exported_model(spec, cfg, inputs, stages)
    if source:
        file_export(cfg, source, model)
    return model


def exported_model(spec, cfg, inputs: dict[str, np.ndarray], stages) -> OnnxModel:
    """Built in torch and hashed; exported only when the cache does not have it."""
    from corescale.backends.pytorch.task import task_module

    with stages.stage("build_model"):
        module = task_module(spec, cfg, inputs)
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


def source_key(spec, cfg, inputs) -> str | None:
    """What an export is made from, known without torch; None when the model's files cannot be found."""
    files = source_files(spec)
    if files is None:
        return None
    identity = {"model": spec.identity(), "files": files, "seed": cfg.seed, "trust_remote_code": cfg.trust_remote_code,
                "allow_pickle": cfg.allow_pickle, "inputs": list(inputs), "opset": OPSET,
                "libraries": {name: _version(name) for name in ("torch", "transformers")}}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)  # read from its metadata: nothing is imported
    except metadata.PackageNotFoundError:
        return None


def sources_root(cfg) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir)) / SOURCES_DIR


def known_export(cfg, source: str) -> OnnxModel | None:
    """The artifact filed under `source`, when both are still there."""
    try:
        entry = json.loads((sources_root(cfg) / f"{source}.json").read_text())
        key, large = str(entry["key"]), bool(entry["large"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    path = cache_root(cfg) / key / MODEL_FILE
    return OnnxModel(path, key, large, cache_hit=True) if path.is_file() else None


def file_export(cfg, source: str, model: OnnxModel) -> None:
    """Files the artifact under its source, atomically: a worker reads a whole entry or none."""
    root = sources_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"key": model.key, "large": model.large}, handle)
        os.chmod(tmp, 0o644)  # readable by every user of a shared cache, as the artifacts are
        os.replace(tmp, root / f"{source}.json")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
