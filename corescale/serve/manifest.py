"""A bundle's `manifest.json` as a typed, versioned document: written by serve/bundle.py, read by serve/opened.py.

A bundle is untrusted input (docs/deploy.md): it is copied between machines and teams, and what it names runs.
Reading checks every value (typed.py) and its meaning, each failure one UserError line naming the bundle and the
field: the file is read bounded (userfiles.read_json: size, nesting); every file path is a plain relative path
inside the bundle (no `..`, no absolute path, no empty part); the serving config is typed section by section
(an unknown key in a section is refused, not dropped) and validated as a run's is; its model is the bundle's own
folder or a preset, its tokenizer one of the bundle's folders; artifact steps are plain names. What a manifest
cannot do at all: set the launch (serve derives it, machine/instance_env.py), or turn on trust_remote_code or
pickle loading (the serve command line's flags decide). Optionally signed: manifest.sig holds HMAC-SHA256 of the
manifest's bytes (`run --bundle DIR --sign KEYFILE`, `serve BUNDLE --sign KEYFILE`), checked by `serve --verify
KEYFILE` on the bytes then parsed. Format 1 (corescale before the artifact hooks) is
migrated when read: its artifact was always the ONNX export's chain of cache folders."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from corescale.config import BenchmarkConfig, migrate_config_v1, validate
from corescale.errors import UserError
from corescale.measure.http.contract import Layout
from corescale.typed import Section, checked
from corescale.userfiles import parse_json, read_text
from corescale.workload.heads import HeadSpec

MANIFEST = "manifest.json"
FORMAT = 2
READS = (1, 2)
MODEL_DIR, TOKENIZER_DIR, ARTIFACT_DIR = "model", "tokenizer", "artifact"
MAX_MANIFEST_BYTES = 16 * 2**20
SIGNATURE, SIGNATURE_KIND = "manifest.sig", "hmac-sha256"  # optional: `--sign KEYFILE`, `serve --verify KEYFILE`
MIN_KEY_BYTES, MAX_KEY_BYTES = 16, 4096
SHA256 = re.compile(r"[0-9a-f]{64}")
STEP = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")  # an artifact step: one plain folder name


@dataclass(frozen=True)
class BundledArtifact(Section):
    """The artifact the instances ran, copied into the bundle by its Artifact's collect hook."""

    kind: str  # the Artifact's cache folder (backends/options.py): which hooks install it
    steps: list[str]  # what collect returned and install takes (the ONNX export: the cache folders it was built in)


@dataclass(frozen=True)
class Requires(Section):
    """What the machine serving the bundle must have."""

    cpu_features: list[str] = field(default_factory=list)  # the precision's features the measuring CPU had
    libraries: dict[str, str | None] = field(default_factory=dict)  # the backend's, at the measured versions


@dataclass(frozen=True)
class BundleManifest(Section):
    format: int
    files: dict[str, str]  # every file's sha256, by its path in the bundle
    config: dict[str, Any]  # the serving config, the model and tokenizer as paths in the bundle
    layout: Layout
    requires: Requires
    head: dict[str, Any]  # workload/heads.HeadSpec's JSON
    created_at: str = ""
    corescale: dict[str, str | None] = field(default_factory=dict)  # version, commit
    model: str = ""
    backend: str = ""
    precision: str = ""
    artifact: BundledArtifact | None = None
    measured: dict[str, Any] = field(default_factory=dict)  # the figures, their quality, the CPU
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_spec(self) -> HeadSpec:
        return HeadSpec.from_json(self.head)

    @property
    def serving_config(self) -> BenchmarkConfig:
        """The config as the manifest holds it (paths relative to the bundle), typed and validated."""
        return bundle_config(self.config)


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Format 1 held the ONNX export's chain as a list."""
    chain = data.get("artifact")
    return {**data, "format": 2, "artifact": {"kind": "onnx", "steps": chain} if chain else None}


def read_manifest(root: Path, key: bytes | None = None) -> BundleManifest:
    """The manifest of the bundle at `root`, checked; one line naming the bundle and the field when it is not.
    With `key` (serve --verify KEYFILE), its signature is checked first, on the bytes then parsed."""
    text = manifest_text(root)
    if key is not None:
        check_signature(root, text, key)
    data = parse_json(text, root / MANIFEST, f"bundle manifest ({MANIFEST})")
    version = data.get("format") if isinstance(data, dict) else None
    if version not in READS or isinstance(version, bool):
        raise UserError(f"bundle '{root}': {MANIFEST} is not of format {' or '.join(map(str, READS))} (format "
                        f"{version!r}: written by another corescale version?)")
    try:
        manifest = BundleManifest.from_dict(migrate_v1(data) if version == 1 else data, "manifest")
        check(manifest)
    except UserError as exc:  # it names the field and what it must be
        raise UserError(f"bundle '{root}': {MANIFEST} is malformed: {exc}") from None
    return manifest


def manifest_text(root: Path) -> str:
    """manifest.json as read once (bounded, a plain file: never through a link)."""
    file = root / MANIFEST
    if not root.is_dir():
        raise UserError(f"bundle '{root}' is not a folder")
    if file.is_symlink() or not file.is_file():
        raise UserError(f"'{root}' is not a corescale bundle (no {MANIFEST}"
                        f"{' file: it is a symbolic link' if file.is_symlink() else ''})")
    return read_text(file, f"bundle manifest ({MANIFEST})", MAX_MANIFEST_BYTES)


def read_key(path: str | Path) -> bytes:
    """A signing key: the bytes of a file (surrounding whitespace dropped), at least MIN_KEY_BYTES of them."""
    try:
        with open(Path(path).expanduser(), "rb") as handle:
            key = handle.read(MAX_KEY_BYTES + 1).strip()
    except OSError as exc:
        raise UserError(f"cannot read the key file '{path}': {exc.strerror or exc}") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise UserError(f"the key file '{path}' holds {len(key)} bytes; a key is {MIN_KEY_BYTES} to "
                        f"{MAX_KEY_BYTES} bytes (e.g. `head -c 32 /dev/urandom > KEYFILE`)")
    return key


def signature(text: str, key: bytes) -> str:
    """What manifest.sig holds: HMAC-SHA256 of the manifest's bytes (which hold every file's sha256)."""
    return f"{SIGNATURE_KIND}:{hmac.new(key, text.encode(), hashlib.sha256).hexdigest()}\n"


def write_signature(folder: Path, key: bytes, text: str | None = None) -> Path:
    """Signs the manifest in `folder` (`text`: its bytes as checked), written whole (a temporary file renamed
    into place)."""
    target = folder / SIGNATURE
    tmp = folder / f".{SIGNATURE}.tmp"
    tmp.write_text(signature(manifest_text(folder) if text is None else text, key))
    os.replace(tmp, target)
    return target


def check_signature(root: Path, text: str, key: bytes) -> None:
    file = root / SIGNATURE
    if file.is_symlink() or not file.is_file():
        raise UserError(f"bundle '{root}' is not signed (no {SIGNATURE}); --verify serves signed bundles only")
    found = read_text(file, f"bundle signature ({SIGNATURE})", 1024)
    if not hmac.compare_digest(found.strip().encode(), signature(text, key).strip().encode()):
        raise UserError(f"bundle '{root}': {SIGNATURE} does not match {MANIFEST} with this key (changed after it "
                        "was signed, or signed with another key)")


def check(manifest: BundleManifest) -> None:
    """What the types do not say: paths inside the bundle, digests, the head, the config, artifact steps."""
    for name, digest in manifest.files.items():
        bundle_path(name, f"manifest.files['{name[:80]}']")
        if not SHA256.fullmatch(digest):
            raise UserError(f"manifest.files['{name}']: expected a sha256 (64 hex digits), got {digest[:70]!r}")
    try:
        manifest.head_spec  # noqa: B018 - checked here, read by the front
    except (TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"manifest.head: {exc}") from None
    cfg = manifest.serving_config
    if cfg.model != MODEL_DIR and not is_preset(cfg.model):
        raise UserError(f"manifest.config.model: expected '{MODEL_DIR}' (the bundle's model folder) or a preset, "
                        f"got {cfg.model[:80]!r}: a bundle carries its model")
    if cfg.workload.tokenizer not in (MODEL_DIR, TOKENIZER_DIR):
        raise UserError(f"manifest.config.workload.tokenizer: expected '{TOKENIZER_DIR}' or '{MODEL_DIR}' (a folder "
                        f"of the bundle), got {str(cfg.workload.tokenizer)[:80]!r}")
    if manifest.artifact is not None:
        steps = manifest.artifact.steps
        if not steps or not all(STEP.fullmatch(step) for step in steps) or not STEP.fullmatch(manifest.artifact.kind):
            raise UserError(f"manifest.artifact: expected a kind and steps that are plain folder names, got "
                            f"{manifest.artifact.kind[:40]!r} and {str(steps)[:80]}")
    for instance in manifest.layout.instances:
        if not instance.cpus or instance.threads < 1 or instance.batch_size < 1:
            raise UserError(f"manifest.layout.instances[{instance.id}]: expected CPUs, threads >= 1 and "
                            f"batch_size >= 1, got {instance.cpus[:8]}, {instance.threads}, {instance.batch_size}")
        if instance.threads > len(instance.cpus):  # corescale never measures more threads than CPUs
            raise UserError(f"manifest.layout.instances[{instance.id}]: {instance.threads} threads on "
                            f"{len(instance.cpus)} CPU(s); at most one thread a CPU (corescale measures no more)")


def bundle_path(name: str, where: str) -> PurePosixPath:
    """A path of a file in the bundle: relative, each part a plain name (no `..`, `.`, empty part or NUL)."""
    path = PurePosixPath(name)
    parts = name.split("/")
    if not name or path.is_absolute() or "\0" in name or "\\" in name or \
            any(part in ("", ".", "..") for part in parts):
        raise UserError(f"{where}: expected a relative path inside the bundle, got {name[:80]!r}")
    return path


def is_preset(model: str) -> bool:
    from corescale.workload.models import PRESETS

    return model in PRESETS


def bundle_config(data: Any, where: str = "manifest.config") -> BenchmarkConfig:
    """A serving config as a manifest holds it, checked: each section typed, an unknown key in one refused (a
    key this corescale does not know would be dropped, and the service would run something else); then
    validate() as a run's config is (a serving config has no target QPS: the service is the target)."""
    from corescale.backends import DEFAULT_BACKEND, OPTIONS
    from corescale.config import EXECUTORS, CostConfig, ServerConfig, WarmupConfig, WorkloadConfig

    if not isinstance(data, dict):
        raise UserError(f"{where}: expected an object, got {type(data).__name__}")
    data = migrate_config_v1(data)
    kinds: dict[str, type] = {"warmup": WarmupConfig, "server": ServerConfig, "workload": WorkloadConfig,
                              "cost": CostConfig}
    named: dict[str, tuple[dict[str, Any], str]] = {"backend": (OPTIONS, DEFAULT_BACKEND),
                                                   "executor": (EXECUTORS, "local")}
    for name, (registry, default) in named.items():
        section = {} if data.get(name) is None else data[name]
        chosen = section.get("name", default) if isinstance(section, dict) else None
        if not isinstance(chosen, str) or chosen not in registry:
            raise UserError(f"{where}.{name}: expected an object naming one of {', '.join(sorted(registry))}, "
                            f"got {str(section)[:60]}")
        kinds[name] = registry[chosen]
    sections: dict[str, Any] = {}
    for name, kind in kinds.items():
        section = {} if data.get(name) is None else data[name]
        if isinstance(section, dict):
            unknown = sorted(set(section) - {f.name for f in dataclasses.fields(kind)})
            if unknown:
                raise UserError(f"{where}.{name}: unknown key '{unknown[0][:40]}' (this corescale knows "
                                f"{', '.join(f.name for f in dataclasses.fields(kind))})")
        sections[name] = checked(kind, section, f"{where}.{name}")
    known = {f.name for f in dataclasses.fields(BenchmarkConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0][:40]}'")
    cfg = checked(BenchmarkConfig, {**data, **sections}, where)
    try:
        validate(dataclasses.replace(cfg, target_qps="auto", slo_p99_ms=cfg.slo_p99_ms or 1000.0))
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return cfg
