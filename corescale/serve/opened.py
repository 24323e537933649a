"""A bundle opened for serving: every check before any worker starts, each failure one line (UserError).

The checks: the manifest is there, of a known format and well formed (serve/manifest.py); every file it lists
has its sha256; this CPU has the features the bundle requires; the backend's libraries are the measured versions
(they name the artifact's build steps: another version would build a different graph); the instances' CPUs are
allowed here; the preloaded libraries exist. Then the runtime cache: the artifact's install hook
(backends/options.py Artifact) files the bundle's copy where the backend's own load finds it as built, so
nothing is exported, fused or quantized again.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from corescale.backends import attribute, bundled_artifact
from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.machine.cpulist import format_cpulist
from corescale.machine.environment import cpuinfo
from corescale.machine.placement import InstanceSpec
from corescale.measure.contract import Layout
from corescale.record.files import read_result
from corescale.serve import bundle
from corescale.serve.manifest import MANIFEST, BundleManifest, read_manifest
from corescale.workload.heads import HeadSpec


@dataclass(frozen=True)
class Bundle:
    root: Path | None  # None: a layout from overrides (`corescale serve OVERRIDES`), no bundle
    manifest: BundleManifest | None  # None: from overrides
    model: str  # as the config names it
    head: HeadSpec
    layout: Layout  # each instance as it runs (GET /info adds the artifact each one loaded)
    cfg: BenchmarkConfig  # the serving config: model and tokenizer paths inside the bundle, cache_dir runtime
    specs: list[InstanceSpec]
    launches: list[instance_env.Launch]

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
    launches = [instance_env.Launch.from_recorded(cfg, spec, entry.to_dict())
                for spec, entry in zip(specs, manifest.layout.instances)]
    if manifest.artifact is not None:
        hooks = bundled_artifact(cfg.backend.name, manifest.artifact.kind)
        attribute(str(hooks.install))(root / bundle.ARTIFACT_DIR, manifest.artifact.steps, cfg)
    return Bundle(root, manifest, manifest.model, manifest.head_spec, manifest.layout, cfg, specs, launches)


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
    return Bundle(None, None, cfg.model, trial.model.head, bundle.layout_of(cfg, launched), cfg, specs, launches)


def check_files(root: Path, manifest: BundleManifest) -> None:
    for name, digest in manifest.files.items():
        path = root / name
        if not path.is_file():
            raise UserError(f"bundle '{root}': file '{name}' is missing")
        if bundle.sha256(path) != digest:
            raise UserError(f"bundle '{root}': file '{name}' does not match its sha256 in {MANIFEST} "
                            "(changed since it was written)")


def check_cpu(manifest: BundleManifest) -> None:
    isa = cpuinfo().isa
    missing = [f for f in manifest.requires.cpu_features if not isa.get(f)]
    if missing:
        raise UserError(f"this CPU lacks {', '.join(missing)}, which the bundle's {manifest.precision} "
                        f"graph was measured with on {manifest.measured.get('cpu') or 'its CPU'}: "
                        "measure again here")


def check_libraries(manifest: BundleManifest) -> None:
    for name, wanted in manifest.requires.libraries.items():
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


def runtime_config(root: Path, manifest: BundleManifest, runtime: Path) -> BenchmarkConfig:
    data = json.loads(json.dumps(manifest.config))
    if data["model"] == bundle.MODEL_DIR:  # else a preset: its name, its weights from the seed
        data["model"] = str((root / bundle.MODEL_DIR).resolve())
    data["workload"]["tokenizer"] = str((root / data["workload"]["tokenizer"]).resolve())
    data["cache_dir"] = str(runtime)
    cfg = BenchmarkConfig.from_dict(data)
    if not Path(cfg.workload.tokenizer or "", "tokenizer.json").is_file():
        raise UserError(f"bundle '{root}' has no tokenizer.json in '{manifest.config['workload']['tokenizer']}'")
    return cfg


