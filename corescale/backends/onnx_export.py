"""ONNX export of the PyTorch model, cached on disk so sweeps export each model once.

Each artifact (the export and every variant derived from it: fusion, quantization) is built once and verified
before each use by the artifact cache (backends/artifact_cache.py: a lock per artifact, a private temporary
directory renamed into place, a manifest of sizes and hashes). Instances that start together on a cold cache wait
for the one building it, then use its result. A derived variant reads its input through a private view (links in
its own temporary directory), because tools such as quantize_dynamic write scratch files beside their input.

The keys cover what changes an artifact: the model (config, weights, files), the input names, the opset, the
exporter's code and options, the versions of torch, Transformers and ONNX, and for a derived variant its tools'
versions and its builder's code.

The key needs the model built in torch, so each export is also filed under its source
(`<cache>/onnx-sources/<source>.json`; the source: the model's identity and files, seed, inputs, opset, the
exporter's code, torch's, Transformers' and ONNX's versions, all known without importing any): a worker whose
source was exported before opens the artifact with neither torch nor Transformers imported (torch is imported
here only to build and export).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from corescale.backends.artifact_cache import cached, damage
from corescale.errors import UserError
from corescale.userfiles import fsync_path
from corescale.workload.inputs import make_inputs
from corescale.workload.models import configured_model, source_files

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

OPSET = 17
MODEL_FILE = "model.onnx"
IR_FILE = "model.xml"  # an OpenVINO IR artifact (its weights beside it in model.bin)
SOURCES_DIR = "onnx-sources"  # beside the artifacts' folder: source -> artifact, see the module's docstring
EXPORT_LIBRARIES = ("torch", "transformers", "onnx")  # what the export is made with
DERIVED_LIBRARIES = ("onnx", "onnxruntime", "openvino", "nncf")  # what a derived variant (fusion, int8) is made with
WRAPPER_MODULE = "corescale.backends.pytorch.task"  # the torch module the export traces (its file is hashed)
KEY = re.compile(r"[0-9a-f]{24}")
EXTERNAL_DATA_BYTES = 3 << 29  # 1.5 GiB: derived models keep weights in model.onnx.data (protobuf limit 2 GiB;
# the exporter itself switches to external data files at that limit)


def cache_root(cfg: BenchmarkConfig) -> Path:
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
                "inputs": list(input_names), "libraries": versions(EXPORT_LIBRARIES), "code": exporter_code(),
                **spec.head.identity()}
    return digest(identity)


def digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def versions(names: tuple[str, ...]) -> dict[str, str | None]:
    return {name: _version(name) for name in names}


def exporter_code() -> str:
    """The code that shapes the exported graph (export() with its options, and the torch wrapper it traces),
    hashed without importing torch: a change to either is a new artifact."""
    found = importlib.util.find_spec(WRAPPER_MODULE)
    wrapper = Path(found.origin).read_bytes() if found and found.origin else WRAPPER_MODULE.encode()
    return hashlib.sha256(code_of(export).encode() + wrapper).hexdigest()[:16]


def code_of(function: Callable) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):  # no source file (a frozen or generated function): its name then
        return f"{function.__module__}.{function.__qualname__}"


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
    axes[output] = {0: "batch", 1: "sequence"} if spec.head.entry.head == "tokens" else {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings about the legacy exporter
        torch.onnx.export(module, tuple(torch.from_numpy(example[n]) for n in names), str(path),
                          input_names=names, output_names=[output], dynamic_axes=axes,
                          opset_version=OPSET, dynamo=False)


class OnnxModel:
    """The exported model on disk, plus what later stages (fusion, quantization) need to know."""

    def __init__(self, path: Path, key: str, large: bool, cache_hit: bool, root: Path | None = None,
                 final: bool = False):
        self.path, self.key, self.large, self.cache_hit = path, key, large, cache_hit
        self.root = root or path.parent.parent  # where derived variants go: beside the artifact
        self.final = final  # a deployment bundle's artifact, filed as built: no step is applied to it again

    def derived(self, variant: str, build: Callable[[Path, Path, bool], None], file: str = MODEL_FILE) -> "OnnxModel":
        """A cached transformation of this model: build(source_path, output_path, external_data), its output
        `file` (OpenVINO's int8 is an IR, model.xml). Its key: this model's, the variant, the tools' versions and the
        builder's code."""
        if self.final:
            return self
        tools = digest({"variant": variant, "libraries": versions(DERIVED_LIBRARIES), "code": code_of(build)})
        target = self.root / f"{self.key}-{variant}-{tools[:8]}"

        def build_variant(tmp: Path) -> None:
            view = tmp / ".input"
            build(private_view(self.path, view), tmp / file, self.large)
            shutil.rmtree(view)  # the links (and the tool's scratch files) are not part of the artifact

        hit = cached(target, build_variant)
        return OnnxModel(target / file, target.name, self.large, hit)


def model_file(spec, cfg: BenchmarkConfig) -> OnnxModel:
    """The user's model file as it is (model=FILE: nothing exported); its derived variants are cached under a key
    of its name, size and modification time, and its graph."""
    files = source_files(spec)
    key = digest({"files": files, "file": spec.model_file})
    return OnnxModel(Path(str(spec.path)), key, spec.model_file["bytes"] > EXTERNAL_DATA_BYTES, cache_hit=True,
                     root=cache_root(cfg))


def onnx_model(spec, cfg: BenchmarkConfig, inputs: dict[str, np.ndarray], stages) -> OnnxModel:
    """The model as ONNX: the model file itself (model=FILE); from its source's entry when this source was
    exported before (no torch, no Transformers); otherwise built and hashed, exported only when the cache does not
    have it, and filed."""
    if spec.model_file is not None:
        return model_file(spec, cfg)
    source = source_key(spec, cfg, inputs)
    known = known_export(cfg, source) if source else None
    if known is not None:
        return known
    model = exported_model(spec, cfg, inputs, stages)
    if source:
        file_export(cfg, source, model)
    return model


def exported_model(spec, cfg: BenchmarkConfig, inputs: dict[str, np.ndarray], stages) -> OnnxModel:
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


def source_key(spec, cfg: BenchmarkConfig, inputs) -> str | None:
    """What an export is made from, known without torch; None when the model's files cannot be found."""
    files = source_files(spec)
    if files is None:
        return None
    identity = {"model": spec.identity(), "files": files, "seed": cfg.seed, "trust_remote_code": cfg.trust_remote_code,
                "allow_pickle": cfg.allow_pickle, "inputs": list(inputs), "opset": OPSET,
                "libraries": versions(EXPORT_LIBRARIES), "code": exporter_code()}
    return digest(identity)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)  # read from its metadata: nothing is imported
    except metadata.PackageNotFoundError:
        return None


def sources_root(cfg: BenchmarkConfig) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir)) / SOURCES_DIR


def known_export(cfg: BenchmarkConfig, source: str) -> OnnxModel | None:
    """The artifact filed under `source`, when both are still there and intact (else it is built again)."""
    try:
        with open(sources_root(cfg) / f"{source}.json", "rb") as handle:
            entry = json.loads(handle.read(1 << 16))
        key, large, final = entry["key"], entry["large"], entry.get("final", False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(key, str) or not KEY.fullmatch(key) or not isinstance(large, bool) or not isinstance(final, bool):
        return None  # not an entry this code wrote
    artifact = cache_root(cfg) / key
    if damage(artifact) is not None:
        return None
    return OnnxModel(artifact_file(artifact), key, large, True, final=final)


def artifact_file(artifact: Path) -> Path:
    """The model file of an artifact folder: model.onnx, or the IR (model.xml) OpenVINO's int8 is saved as."""
    return artifact / MODEL_FILE if (artifact / MODEL_FILE).exists() or not (artifact / IR_FILE).exists() \
        else artifact / IR_FILE


def file_export(cfg: BenchmarkConfig, source: str, model: OnnxModel) -> None:
    """Files the artifact under its source, atomically: a worker reads a whole entry or none."""
    root = sources_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"key": model.key, "large": model.large, "final": model.final}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # readable by every user of a shared cache, as the artifacts are
        os.replace(tmp, root / f"{source}.json")
        fsync_path(root)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def collect(model_path: Path, into: Path) -> list[str]:
    """ONNX_EXPORT's bundle hook: the folder of the file that ran, copied into `into`; returns the cache folders
    it was built through, first (the export) to last (what ran): its own folder and every sibling whose name + '-'
    begins its name (fusion, then quantization, each named by its step)."""
    final = model_path.parent
    steps = [d.name for d in final.parent.iterdir() if d.is_dir() and final.name.startswith(f"{d.name}-")]
    shutil.copytree(final, into, ignore=shutil.ignore_patterns(".*"))
    return sorted(steps, key=len) + [final.name]


def install(folder: Path, steps: list[str], cfg: BenchmarkConfig) -> None:
    """ONNX_EXPORT's serve hook: the export cache's entry for this model's source names the bundle's copy in
    `folder` as final (linked under its export key), so the backend's own load opens the measured file and applies
    no build step (fusion, quantization) to it again."""
    spec = configured_model(cfg)
    source = source_key(spec, cfg, make_inputs(spec, 1, 8, cfg.seed))
    if source is None:
        raise UserError(f"bundle artifact '{folder}': the model's files cannot be listed")
    artifact = folder.resolve()
    key = steps[0]  # the export's key: the name the cache's entries take
    if not KEY.fullmatch(key):  # it names the link made below: a bundle's manifest may say anything
        raise UserError(f"bundle artifact '{folder}': its first step {key[:40]!r} is not an export key "
                        f"({KEY.pattern})")
    cache_root(cfg).mkdir(parents=True, exist_ok=True)
    os.symlink(artifact, cache_root(cfg) / key)
    large = any(p.name != MODEL_FILE and p.name.startswith(MODEL_FILE) for p in artifact.iterdir())
    file_export(cfg, source, OnnxModel(artifact_file(artifact), key, large, True, final=True))
