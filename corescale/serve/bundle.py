"""The deployment bundle: what one measured result ran, in one folder that `corescale serve BUNDLE` starts again.

It holds the artifact the instances loaded (the file the backend reported as its `model_path`, copied by its
Artifact's collect hook: the ONNX export as built, exported, fused, quantized), the model folder's configuration
and tokenizer (its weights too when the backend builds from them: PyTorch, TensorFlow), the head, the layout read
from the result's record (each instance's CPUs, memory binding, threads and the environment the launcher really
set: never derived again), the measured figures with their quality and CPU, and `manifest.json`
(serve/manifest.py's BundleManifest): every file's sha256 and what the machine must have (CPU features the
precision uses that the measuring CPU had; the backend's library versions, which name the artifact's build
steps). Written whole into a temporary folder, then renamed: nothing half-written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corescale.backends import attribute, bundled_artifact, entry
from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine.placement import InstanceSpec
from corescale.machine.precisions import PRECISIONS
from corescale.measure.http.contract import InstanceLayout, Layout, ServiceInfo
from corescale.record.trial import TrialRecord
from corescale.serve import examples
from corescale.serve.manifest import (
    ARTIFACT_DIR,
    FORMAT,
    MANIFEST,
    MODEL_DIR,
    TOKENIZER_DIR,
    BundledArtifact,
    BundleManifest,
    Requires,
    write_signature,
)
from corescale.userfiles import file_sha256 as sha256  # a bundle's file hashes (bundle.sha256)

RECORD = "record.json"  # the measured result; not result.json, which a results root would count as a run
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx", ".pt", ".ckpt", ".xml")
SKIPPED_DIRS = ("onnx", "openvino", ".git", ".cache")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "sentencepiece.bpe.model", "spiece.model", "merges.txt", "vocab.json", "added_tokens.json")


def check_destination(directory: Path, cfg: BenchmarkConfig) -> None:
    """Before any measurement: the folder is new (or empty) and writable, and the model has a tokenizer."""
    if cfg.endpoint and cfg.endpoint != "managed":
        raise UserError("--bundle needs what ran here or in a managed service; a server measured at endpoint=URL "
                        "has no artifact here: measure its layout with endpoint=managed or in process")
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UserError(f"bundle folder '{directory}' exists and is not empty: give a new folder")
    parent = directory.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UserError(f"bundle folder '{directory}': '{parent}' is not a writable folder")
    tokenizer = tokenizer_source(cfg)
    folder = model_folder(cfg)
    if folder is not None:
        folder_files(folder)
    for name in TOKENIZER_FILES if tokenizer != folder else ():
        if (tokenizer / name).is_file():
            tokenizer_file(tokenizer, name)


def tokenizer_file(folder: Path, name: str) -> Path:
    """A tokenizer file a bundle copies: the folder's own (a link out of it is refused, as in folder_files)."""
    real = (folder / name).resolve()
    if not any(real.is_relative_to(root) for root in allowed_roots(folder)):
        raise UserError(f"tokenizer folder '{folder}': {name} is a link to {real}, outside the folder; a bundle "
                        "carries only the folder's own files")
    return real


def model_spec(cfg: BenchmarkConfig):
    from corescale.workload.models import configured_model

    return configured_model(cfg)


def model_folder(cfg: BenchmarkConfig) -> Path | None:
    """The model's own folder (a local or packaged directory, or a cached hub snapshot); None for a preset."""
    from corescale.workload.models import hub_snapshot

    spec = model_spec(cfg)
    if spec.source == "preset":
        return None
    folder = hub_snapshot(spec.name) if spec.source == "hub" else Path(spec.path) if spec.path else None
    if folder is None or not folder.is_dir():
        raise UserError(f"model '{cfg.model}': its folder cannot be found to copy into the bundle")
    return folder


def tokenizer_source(cfg: BenchmarkConfig) -> Path:
    """The tokenizer a bundle carries: the one the measurement's text went through (workload/tokens.py)."""
    from corescale.workload.tokens import tokenizer_dir

    folder, _ = tokenizer_dir(cfg, model_spec(cfg))
    if folder is None:
        raise UserError(f"model '{cfg.model}' has no tokenizer; a bundle serves text: give workload.tokenizer=DIR "
                        "(a folder holding tokenizer.json)")
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"'{folder}' has no tokenizer.json (the fast tokenizer a bundle serves text with)")
    return folder


def allowed_roots(source: Path) -> list[Path]:
    """Where a model folder's files may really lie: in the folder, and for a hub cache's snapshot
    (`models--ORG--NAME/snapshots/REV`, whose files link into `../../blobs`) in that model's blobs."""
    root = source.resolve()
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def folder_files(source: Path) -> list[tuple[Path, Path]]:
    """(path in the folder, the file it really is) for each file a bundle would copy; a symbolic link that leads
    out of the folder (or out of a hub snapshot's blobs) is refused with one line naming it: a folder from someone
    else must not carry another file of this machine into a bundle, and from it into an image."""
    roots = allowed_roots(source)
    found = []
    for item in sorted(source.rglob("*")):
        relative = item.relative_to(source)
        if relative.parts[0] in SKIPPED_DIRS or not item.is_file():
            continue
        real = item.resolve()
        if not any(real.is_relative_to(root) for root in roots):
            raise UserError(f"model folder '{source}': {relative} is a link to {real}, outside the folder; a bundle "
                            "carries only the folder's own files (copy that file in, or remove the link)")
        found.append((relative, real))
    return found


def copy_folder(source: Path, target: Path, encoder: Path | None) -> None:
    """The model folder's files (sub-folders such as 1_Pooling too); the encoder's weights only when `encoder`
    is None (with an ONNX artifact they are in the graph; a Dense module's stay: its folder is checked)."""
    for relative, real in folder_files(source):
        item = source / relative
        if encoder is not None and item.suffix in WEIGHT_SUFFIXES and item.parent.resolve() == encoder.resolve():
            continue
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(real, target / relative)


def figures(record: TrialRecord) -> dict[str, Any]:
    """The figures the bundle's layout was measured at, with their quality and the CPU."""
    metrics, server = record.metrics, record.server
    found: dict[str, Any] = {"trial_key": record.trial_key, "started_at": record.started_at,
                             "cpu": record.environment.cpu.model, "isa": dict(record.environment.cpu.isa),
                             "physical_cores": record.environment.topology.physical_cores}
    if metrics is not None:
        found.update(throughput_samples_per_s=metrics.throughput_samples_per_s,
                     latency_ms={k: getattr(metrics.latency_s, k) * 1e3 for k in ("p50", "p90", "p99")})
    if server is not None:
        found.update(max_valid_qps=server.max_valid_qps, slo_p99_ms=server.slo_p99_ms,
                     server_latency_ms=dict(server.latency_ms))
    if record.drift is not None:
        found["quality"] = {"reference": record.drift.reference, "cosine": record.drift.cosine_similarity,
                            "min_cosine": record.drift.min_cosine, "within_tolerance": record.drift.within_tolerance}
    if record.quality is not None:  # a head's quality on real text, and what it was judged against
        found["quality"] = {"reference": record.quality.reference, "metrics": dict(record.quality.metrics),
                            "passed": record.quality.passed, "unknown": record.quality.unknown}
    return found


def layout(record: TrialRecord) -> Layout:
    """Each instance as it ran: CPUs, memory nodes, threads, batch, and the launch the launcher recorded."""
    return layout_of(record.config, [(spec, report.launch) for spec, report in zip(record.specs,
                                                                                  record.instance_reports)])


def layout_of(cfg: BenchmarkConfig, launched: list[tuple[InstanceSpec, dict[str, Any]]]) -> Layout:
    """The layout of instances started with these launches (command prefix, the variables set)."""
    instances = [InstanceLayout(spec.id, list(spec.cpus), list(spec.numa_nodes), spec.threads, spec.batch_size,
                                list(launch.get("command_prefix") or []), dict(launch.get("env") or {}))
                 for spec, launch in launched]
    return Layout(instances, cfg.allocator, cfg.openmp, cfg.interop_threads,
                  "the CPUs no instance uses when there are any, else shared with the instances")


def serving(cfg: BenchmarkConfig) -> BenchmarkConfig:
    """A config as the service runs it: the server scenario's dynamic batching at its batch (a server config's
    max_batch, else the per-instance batch), no reference, no calibration; the front tokenizes (the workers get
    token ids)."""
    batch = cfg.server.max_batch if cfg.scenario == "server" else cfg.instance_batch_size
    return dataclasses.replace(cfg, scenario="server", target_qps=None, reference=None, calibrate=False, repeats=1,
                               tokenize=False, server=dataclasses.replace(cfg.server, max_batch=batch))


def manifest_config(measured: BenchmarkConfig, folder: Path | None, has_tokenizer_dir: bool) -> dict[str, Any]:
    """The measured config as the service runs it, the model from the bundle (paths relative to it)."""
    cfg = serving(measured).to_dict()
    if folder is not None:
        cfg["model"] = MODEL_DIR
    cfg["workload"] = {**cfg["workload"], "tokenizer": TOKENIZER_DIR if has_tokenizer_dir else MODEL_DIR}
    return cfg


@dataclass
class WhatRan:
    """What a result ran, as a bundle keeps it: the config, the artifact, the layout, the record (a managed
    service's with the specs it served)."""

    cfg: BenchmarkConfig
    artifact: Path | None  # the file the backend ran (its model_path), where it ran one
    layout: Layout
    record: TrialRecord

    @classmethod
    def of(cls, record: TrialRecord) -> WhatRan:
        if not record.config.endpoint:
            framework = record.instance_reports[0].framework if record.instance_reports else {}
            artifact = Path(framework["model_path"]) if framework.get("model_path") else None
            return cls(record.config, artifact, layout(record), record)
        served = service_description(record).corescale.layout
        artifacts = {instance.artifact for instance in served.instances}
        if len(artifacts) != 1:
            raise UserError(f"the managed service's instances ran different artifacts ({sorted(map(str, artifacts))})")
        specs = [InstanceSpec.from_json(instance.to_dict()) for instance in served.instances]
        kept = dataclasses.replace(served, instances=[dataclasses.replace(instance, artifact=None)
                                                      for instance in served.instances])
        ran = next(iter(artifacts))
        return cls(dataclasses.replace(record.config, endpoint=None, api=None), Path(ran) if ran else None,
                   kept, dataclasses.replace(record, specs=specs))


def service_description(record: TrialRecord) -> ServiceInfo:
    """endpoint=managed: what the service said of its layout and artifact (its GET /info, kept in the record)."""
    endpoint = record.server.endpoint if record.server is not None else None
    if endpoint is None or endpoint.managed is None:
        raise UserError("no bundle from a server measured over HTTP (endpoint=URL): no artifact was measured here; "
                        "measure the layout in process (`corescale run ... --bundle DIR`) or with endpoint=managed")
    try:
        described = ServiceInfo.from_dict(endpoint.reports.get("/info"), "GET /info")
    except UserError as exc:
        raise UserError(f"the managed service's record holds no layout ({exc}; a corescale serve before 2026-12-03?): "
                        "serve it again with `corescale serve` and its overrides (tune.json's recipe.serve_words)") \
            from None
    if not described.corescale.layout.instances:
        raise UserError("the managed service's record holds no instance in its layout: serve it again with "
                        "`corescale serve` and its overrides (tune.json's recipe.serve_words)")
    return described


def write(directory: Path, record: TrialRecord, replace: bool = False, key: bytes | None = None) -> Path:
    """The bundle of one valid result, written whole (a temporary folder renamed into place); `replace`: an
    earlier bundle there (a tune's, resumed) is replaced once the new one is complete; `key`: signed with it
    (manifest.sig, `run --bundle DIR --sign KEYFILE`)."""
    if not record.valid_ok:
        raise UserError(f"no bundle from a failed or invalid result ({record.reason or 'invalid'})")
    measured = WhatRan.of(record)
    cfg = measured.cfg
    directory = Path(directory)
    earlier = directory.is_dir() and (directory / MANIFEST).is_file() and replace
    if not earlier:
        check_destination(directory, cfg)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.resolve().parent))
    old = tmp.with_name(f"{tmp.name}.old")
    try:
        contents(tmp, measured)
        if key is not None:
            write_signature(tmp, key)
        os.chmod(tmp, 0o755)
        if earlier:
            os.rename(directory, old)
        elif directory.exists():
            directory.rmdir()  # empty: checked
        os.rename(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return directory


def contents(tmp: Path, measured: WhatRan) -> None:
    cfg, record, model_path = measured.cfg, measured.record, measured.artifact
    if model_path is not None and not model_path.is_file():
        raise UserError(f"the measured artifact '{model_path}' is gone (measured on another node, or the cache "
                        "was cleared): measure again here")
    spec, folder, tokenizer = model_spec(cfg), model_folder(cfg), tokenizer_source(cfg)
    if folder is not None:
        encoder = Path(spec.encoder_path or folder) if model_path is not None else None
        copy_folder(folder, tmp / MODEL_DIR, encoder)
    if tokenizer != folder:
        (tmp / TOKENIZER_DIR).mkdir()
        for name in TOKENIZER_FILES:
            if (tokenizer / name).is_file():
                shutil.copy2(tokenizer_file(tokenizer, name), tmp / TOKENIZER_DIR / name)
    artifact = None
    if model_path is not None:
        kind = bundled_artifact(cfg.backend.name)
        artifact = BundledArtifact(kind.cache, attribute(str(kind.collect))(model_path, tmp / ARTIFACT_DIR))
    (tmp / RECORD).write_text(json.dumps(record.to_json(), indent=2, default=str))
    serving = manifest_config(cfg, folder, tokenizer != folder)
    backend = entry(cfg.backend.name)
    isa = record.environment.cpu.isa
    # the CPU features the precision's kernels use (its entry's `requires`) that the measuring CPU had
    requires = Requires(PRECISIONS[cfg.precision].required(isa),
                        {n: record.environment.libraries.get(n) for n in backend.libraries})
    for name, text in examples.files(serving, measured.layout, examples.pip_pins(requires.libraries)).items():
        (tmp / name).write_text(text)
    manifest = BundleManifest(
        format=FORMAT, created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), corescale=dict(record.environment.corescale),
        model=cfg.model, backend=cfg.backend.name, precision=cfg.precision, head=spec.head.to_json(),
        artifact=artifact, config=serving, layout=measured.layout, measured=figures(record), requires=requires,
        files={str(p.relative_to(tmp)): sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()})
    (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2, default=str))
