"""The bundle a deploy target starts from, checked as `corescale serve` checks it, and the folder a target writes.

A bundle is untrusted input (docs/deploy.md): the manifest is read typed and validated (serve/manifest.py), it
asks for no trust_remote_code or pickle loading the command line did not allow, every file is the one the
manifest lists with its sha256 (serve/opened.verified_copy, into a scratch folder), and the manifest's layout is
the one its record measured. What is not checked here: this machine's CPU features and library versions (the
engine's machines run the bundle, and `corescale serve` checks them there when it starts). Each failure is one
line (UserError) before anything is written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corescale.errors import UserError
from corescale.record.trial import TrialRecord
from corescale.serve.manifest import BundleManifest


@dataclass(frozen=True)
class CheckedBundle:
    root: Path
    manifest: BundleManifest
    record: TrialRecord  # the measured record (record.json): the layout's specs, the figures, the memory
    size_bytes: int  # the bundle's files, together (the image's share of it)


def read_bundle(path: str | Path, trust=None, key: bytes | None = None) -> CheckedBundle:
    """The bundle at `path`, checked (see the module's docstring); `key`: its signature must verify with it."""
    from corescale.machine.scratch import scratch
    from corescale.record.files import read_result
    from corescale.serve import bundle
    from corescale.serve.manifest import read_manifest
    from corescale.serve.opened import Trust, check_layout, check_trust, verified_copy

    root = Path(path).expanduser()
    manifest = read_manifest(root, key)
    check_trust(root, manifest, trust or Trust())
    with scratch("deploy") as work:
        verified_copy(root, manifest, work / "bundle")
        record = read_result(work / "bundle" / bundle.RECORD)
    check_layout(root, manifest, list(record.specs))
    size = sum((root / name).stat().st_size for name in manifest.files)
    return CheckedBundle(root, manifest, record, size)


def check_out(out: Path | None) -> Path:
    """--out: a new folder or an empty one, in a place that takes new files; checked before the bundle is read."""
    from corescale.userfiles import check_writable

    if out is None:
        raise UserError("this target writes files: give --out DIR (a new or empty folder)")
    out = check_writable(out, "--out", directory=True)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out '{out}' is not empty: give a new or empty folder (nothing is overwritten)")
    return out


def write_folder(out: Path, files: dict[str, str]) -> Path:
    """Writes `files` (name -> text) into `out` whole: into a temporary folder beside it, then renamed into
    place, so that a failure leaves nothing half-written there."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.resolve().parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()  # empty: check_out said so
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
