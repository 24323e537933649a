"""A bundle's `manifest.json` as a typed, versioned document: written by serve/bundle.py, read by serve/opened.py.
Reading checks every value (typed.py): a malformed manifest is one UserError line naming the bundle and the field.
Format 1 (corescale before the artifact hooks) is migrated when read: its artifact was always the ONNX export's
chain of cache folders."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corescale.errors import UserError
from corescale.measure.contract import Layout
from corescale.typed import Section
from corescale.workload.heads import HeadSpec

MANIFEST = "manifest.json"
FORMAT = 2
READS = (1, 2)


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


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Format 1 held the ONNX export's chain as a list."""
    chain = data.get("artifact")
    return {**data, "format": 2, "artifact": {"kind": "onnx", "steps": chain} if chain else None}


def read_manifest(root: Path) -> BundleManifest:
    """The manifest of the bundle at `root`, checked; one line naming the bundle and the field when it is not."""
    file = root / MANIFEST
    if not root.is_dir():
        raise UserError(f"bundle '{root}' is not a folder")
    if not file.is_file():
        raise UserError(f"'{root}' is not a corescale bundle (no {MANIFEST})")
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise UserError(f"bundle '{root}': {MANIFEST} is not JSON ({exc})") from None
    version = data.get("format") if isinstance(data, dict) else None
    if version not in READS:
        raise UserError(f"bundle '{root}': {MANIFEST} is not of format {' or '.join(map(str, READS))} (format "
                        f"{version!r}: written by another corescale version?)")
    try:
        manifest = BundleManifest.from_dict(migrate_v1(data) if version == 1 else data, "manifest")
    except UserError as exc:  # it names the field and what it must be
        raise UserError(f"bundle '{root}': {MANIFEST} is malformed: {exc}") from None
    try:
        manifest.head_spec  # noqa: B018 - checked here, read by the front
    except (TypeError, ValueError) as exc:
        raise UserError(f"bundle '{root}': {MANIFEST} is malformed: manifest.head: {exc}") from None
    return manifest
