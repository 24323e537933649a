"""Files written whole: one atomic writer for every file corescale makes, and result directories written
into a hidden temp dir, then renamed into place."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from corescale.errors import UserError
from corescale.machine import scratch
from corescale.record.trial import TrialRecord
from corescale.userfiles import fsync_path, read_json

if TYPE_CHECKING:  # pandas (~0.5 s to import) only where samples are read or written
    import pandas as pd

    from corescale.config import BenchmarkConfig

RESULT_FILE = "result.json"
SAMPLES_FILE = "samples.parquet"
CONFIG_FILE = "config.yaml"
TMP_PREFIX = ".tmp-"


def umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status; else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: str | bytes | Callable[[Path], None], what: str = "") -> Path:
    """Writes `path` whole or not at all: into a temp file beside it, fsynced, then renamed over it.

    `data` is the content, or a function that writes the temp path it is given (matplotlib's savefig).
    An unwritable place is a UserError naming `what` (e.g. "--csv") and the path."""
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=path.suffix)
    except OSError as exc:
        raise UserError(f"cannot write {what + ' ' if what else ''}'{path}': {exc.strerror}") from None
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600: as readable as any file the user makes
        with os.fdopen(fd, "wb") as handle:
            if callable(data):
                data(tmp)
                fsync_path(tmp)  # what the function wrote, through its own handle
            else:
                handle.write(data.encode() if isinstance(data, str) else data)
                handle.flush()
        fsync_path(tmp)  # what a callable wrote too (it may have replaced the file: fsync the path)
        os.replace(tmp, path)
        fsync_path(path.parent)  # the rename itself survives a power loss
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: Any) -> Path:
    return write_atomic(path, json.dumps(data, indent=2, default=str))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:40] or "model"


def log_name(name: object) -> str:
    """A log file's name as it is written into a result directory: one plain name (a Ray node chooses these:
    no path, no hidden or reserved name), whatever it was sent as."""
    plain = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).lstrip(".")[:120] or "log"
    return f"log-{plain}" if plain in (RESULT_FILE, SAMPLES_FILE, CONFIG_FILE) else plain


def run_name(cfg: BenchmarkConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if cfg.endpoint:  # a server measured over HTTP: its address, not a local deployment
        return f"{stamp}-endpoint-{slug(cfg.endpoint.split('://', 1)[-1])}-{cfg.http_api}-{cfg.key()[:8]}"
    return (f"{stamp}-{slug(os.path.basename(cfg.model.rstrip('/')))}-{cfg.backend.name}-{cfg.precision}"
            f"-b{cfg.batch_size}-s{cfg.sequence_length}-i{cfg.instances}-{cfg.key()[:8]}")


class PendingRun:
    """A result directory being written; becomes visible only on commit(). Those that killed writers left behind
    are collected when the next one starts in the same root (machine/scratch.py)."""

    def __init__(self, root: Path, name: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        scratch.collect(self.root, TMP_PREFIX)
        self.name = name
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{name}-", dir=self.root))
        os.chmod(self.tmp, 0o777 & ~umask())  # mkdtemp's 0700: as readable as any directory the user makes
        scratch.mark(self.tmp)

    def write_samples(self, frame: pd.DataFrame) -> None:
        frame.to_parquet(self.tmp / SAMPLES_FILE, index=False)

    def write_config(self, config: dict) -> None:
        (self.tmp / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))

    def commit(self, record: dict) -> Path:
        """`record` is TrialRecord.to_json(); the directory appears under its final name only now, with every
        file in it on disk (samples, config, logs: fsynced before the rename)."""
        for file in self.tmp.iterdir():
            if file.is_file() and file.name != scratch.OWNER_FILE:
                fsync_path(file)
        write_json_atomic(self.tmp / RESULT_FILE, record)
        fsync_path(self.tmp)
        suffix = 0
        while True:  # rename never replaces a committed (non-empty) dir: a concurrent writer gets the next name
            final = self.root / (f"{self.name}.{suffix}" if suffix else self.name)
            try:
                os.rename(self.tmp, final)
                break
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
                suffix += 1
        scratch.unmark(final)  # after the rename: a killed writer's directory always names its owner
        fsync_path(self.root)
        return final

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def read_result(path: Path) -> TrialRecord:
    """The record of a run directory (or of a result.json path), of any schema this version reads."""
    path = Path(path)
    file = path / RESULT_FILE if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"no result at '{path}': expected a run directory holding {RESULT_FILE}")
    data = read_json(file, "result file")
    if not isinstance(data, dict) or "schema_version" not in data:
        raise UserError(f"'{file}' is not a corescale result (no schema_version)")
    try:
        return TrialRecord.from_json(data)
    except UserError as exc:  # a typed section's value of the wrong type: where it is
        raise UserError(f"malformed result '{file}': {exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # valid JSON, wrong shape
        raise UserError(f"malformed result '{file}': {type(exc).__name__}: {exc}") from None


def read_samples(path: Path) -> pd.DataFrame:
    import pandas as pd

    return pd.read_parquet(Path(path) / SAMPLES_FILE)


def iter_run_dirs(root: Path):
    """Every committed run directory under root (temp dirs of unfinished writes are skipped)."""
    for file in sorted(Path(root).rglob(RESULT_FILE)):
        if not any(part.startswith(TMP_PREFIX) for part in file.relative_to(root).parts):
            yield file.parent
