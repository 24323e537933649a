"""A bundle opened for serving: every check before any worker starts, each failure one line (UserError).

The checks: the manifest is there and of a known format; every file it lists has its sha256; this CPU has the
features the bundle requires; the backend's libraries are the measured versions (they name the artifact's build
steps: another version would build a different graph); the instances' CPUs are allowed here; the preloaded
libraries exist. Then the runtime cache: the artifact is found by the backend's own load path (the ONNX export
cache), filed as final, so nothing is exported, fused or quantized again.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.machine.cpulist import format_cpulist
from corescale.machine.environment import cpuinfo
from corescale.machine.placement import InstanceSpec
from corescale.record.files import read_result
from corescale.serve import bundle


@dataclass(frozen=True)
class Bundle:
    root: Path | None  # None: a layout from overrides (`corescale serve OVERRIDES`), no bundle
    manifest: dict[str, Any]
    cfg: BenchmarkConfig  # the serving config: model and tokenizer paths inside the bundle, cache_dir runtime
    specs: list[InstanceSpec]
    launches: list[instance_env.Launch]

    @property
    def head(self) -> dict[str, Any]:
        return self.manifest["head"]

    @property
    def tokenizer(self) -> Path:
        return Path(self.cfg.workload.tokenizer or "") / "tokenizer.json"


def open_bundle(path: str | Path, runtime: Path | None = None) -> Bundle:
    """Checks the bundle at `path`; its runtime cache goes under `runtime` (a fresh temporary folder if None)."""
    root = Path(path).expanduser()
    manifest = read_manifest(root)
    check_files(root, manifest)
    check_cpu(manifest)
    check_libraries(manifest)
    record = read_result(root / bundle.RECORD)
    specs = list(record.specs)
    check_cpus(specs)
    runtime = Path(tempfile.mkdtemp(prefix="corescale-serve-")) if runtime is None else runtime
    cfg = runtime_config(root, manifest, runtime)
    launches = [instance_env.Launch.from_recorded(cfg, spec, entry)
                for spec, entry in zip(specs, manifest["layout"]["instances"])]
    if manifest.get("artifact"):
        map_artifact(root, manifest["artifact"], cfg)
    return Bundle(root, manifest, cfg, specs, launches)


def from_overrides(overrides: list[str]) -> Bundle:
    """`corescale serve OVERRIDES`: the layout a config asks for (from_config)."""
    from corescale.overrides import compose

    return from_config(compose(overrides))


def from_config_file(path: Path) -> Bundle:
    """`corescale serve CONFIG.json`: a config as a record holds it (what endpoint=managed starts for a trial)."""
    from corescale.config import validate
    from corescale.userfiles import read_json

    return from_config(validate(BenchmarkConfig.from_dict(read_json(path, "the config"))))


def from_config(cfg: BenchmarkConfig) -> Bundle:
    """The layout a config asks for, checked and placed as a run's trial is (`prepare_trial`), started as a run
    starts it; the artifact is built or found in cache_dir as a run's is. Nothing here was measured: a bundle is."""
    import dataclasses

    from corescale.measure.runner import prepare_trial
    from corescale.workload.tokens import served_tokenizer

    trial = prepare_trial(cfg)
    cfg = bundle.serving(trial.cfg)
    folder = served_tokenizer(cfg, trial.model)
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, tokenizer=str(folder)))
    specs = trial.instance_specs()
    preload = instance_env.preload_paths(cfg)
    launches = [instance_env.Launch.of(cfg, spec, preload) for spec in specs]
    launched = [(spec, launch.recorded()) for spec, launch in zip(specs, launches)]  # GET /info shows them
    return Bundle(None, {"model": cfg.model, "head": trial.model.head.to_json(),
                         "layout": bundle.layout_of(cfg, launched)}, cfg, specs, launches)


def read_manifest(root: Path) -> dict[str, Any]:
    file = root / bundle.MANIFEST
    if not root.is_dir():
        raise UserError(f"bundle '{root}' is not a folder")
    if not file.is_file():
        raise UserError(f"'{root}' is not a corescale bundle (no {bundle.MANIFEST})")
    try:
        manifest = json.loads(file.read_text())
    except ValueError as exc:
        raise UserError(f"bundle '{root}': {bundle.MANIFEST} is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != bundle.FORMAT:
        raise UserError(f"bundle '{root}': {bundle.MANIFEST} is not of format {bundle.FORMAT} (written by another "
                        "corescale version?)")
    for key in ("files", "config", "layout", "requires", "head"):
        if not isinstance(manifest.get(key), dict):
            raise UserError(f"bundle '{root}': {bundle.MANIFEST} has no '{key}' object")
    return manifest


def check_files(root: Path, manifest: dict[str, Any]) -> None:
    for name, digest in manifest["files"].items():
        path = root / name
        if not path.is_file():
            raise UserError(f"bundle '{root}': file '{name}' is missing")
        if bundle.sha256(path) != digest:
            raise UserError(f"bundle '{root}': file '{name}' does not match its sha256 in {bundle.MANIFEST} "
                            "(changed since it was written)")


def check_cpu(manifest: dict[str, Any]) -> None:
    isa = cpuinfo().isa
    missing = [f for f in manifest["requires"].get("cpu_features", []) if not isa.get(f)]
    if missing:
        raise UserError(f"this CPU lacks {', '.join(missing)}, which the bundle's {manifest.get('precision')} "
                        f"graph was measured with on {manifest.get('measured', {}).get('cpu') or 'its CPU'}: "
                        "measure again here")


def check_libraries(manifest: dict[str, Any]) -> None:
    for name, wanted in manifest["requires"].get("libraries", {}).items():
        try:
            have: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if wanted and have != wanted:
            raise UserError(f"the bundle was measured with {name} {wanted}, this environment has "
                            f"{have or 'none'}: install {name}=={wanted}")


def check_cpus(specs: list[InstanceSpec]) -> None:
    allowed = os.sched_getaffinity(0)
    for spec in specs:
        if not set(spec.cpus) <= allowed:
            raise UserError(f"instance {spec.id} ran on CPUs {format_cpulist(spec.cpus)}; this process may use "
                            f"only {format_cpulist(sorted(allowed))}: serve it on the machine it was measured on "
                            "(or one with those CPUs)")


def runtime_config(root: Path, manifest: dict[str, Any], runtime: Path) -> BenchmarkConfig:
    data = json.loads(json.dumps(manifest["config"]))
    if data["model"] == bundle.MODEL_DIR:  # else a preset: its name, its weights from the seed
        data["model"] = str((root / bundle.MODEL_DIR).resolve())
    data["workload"]["tokenizer"] = str((root / data["workload"]["tokenizer"]).resolve())
    data["cache_dir"] = str(runtime)
    cfg = BenchmarkConfig.from_dict(data)
    if not Path(cfg.workload.tokenizer or "", "tokenizer.json").is_file():
        raise UserError(f"bundle '{root}' has no tokenizer.json in '{manifest['config']['workload']['tokenizer']}'")
    return cfg


def map_artifact(root: Path, chain: list[str], cfg: BenchmarkConfig) -> None:
    """The runtime cache: the export cache's entry for this model's source names the bundle's artifact as final
    (linked under its export key), so the backend's own load opens the measured file and applies no build step
    (fusion, quantization) to it again."""
    from corescale.backends.onnx_export import OnnxModel, artifact_file, cache_root, file_export, source_key
    from corescale.workload.inputs import make_inputs
    from corescale.workload.models import resolve_model

    spec = resolve_model(cfg.model, cfg.trust_remote_code, cfg.task, cfg.cache_dir)
    source = source_key(spec, cfg, make_inputs(spec, 1, 8, cfg.seed))
    if source is None:
        raise UserError(f"bundle '{root}': the model's files cannot be listed")
    artifact = (root / bundle.ARTIFACT_DIR).resolve()
    key = chain[0]  # the export's key: the name the cache's entries take
    cache_root(cfg).mkdir(parents=True, exist_ok=True)
    os.symlink(artifact, cache_root(cfg) / key)
    large = any(p.name != "model.onnx" and p.name.startswith("model.onnx") for p in artifact.iterdir())
    file_export(cfg, source, OnnxModel(artifact_file(artifact), key, large, True, final=True))
