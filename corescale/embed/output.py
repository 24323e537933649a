"""The output folder of one embed job: `job.json` (what the job is: the bundle, the corpus, the options), one
Parquet shard per `shard_rows` input rows (`shard-00000.parquet`, rows in input order), a rejects file beside a
shard that had any (`rejects-00000.parquet`: row, id, reason), and `manifest.json` when the job has ended.

Every file appears whole or not at all (written beside, fsynced, renamed): a shard that is there is complete, so a
job started again over the same folder computes only the shards that are not (a shard's rejects are renamed into
place before it, so a shard never stands without them). A folder holding another job's files is refused."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corescale.errors import UserError

JOB, MANIFEST = "job.json", "manifest.json"
FORMAT = "corescale-embed/1"
SHARD = re.compile(r"shard-(\d{5,})\.parquet")


def shard_name(index: int, kind: str = "shard") -> str:
    return f"{kind}-{index:05d}.parquet"


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` beside `path`, fsynced, then renamed over it (and the folder fsynced)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as file:
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1, default=str) + "\n"))


class Output:
    def __init__(self, folder: Path, identity: dict[str, Any]):
        self.folder, self.identity = folder, identity

    @classmethod
    def open(cls, path: str | Path, identity: dict[str, Any]) -> Output:
        """The folder for this job: new, empty, or this same job's (then resumed). Checked before any worker."""
        folder = Path(path).expanduser().resolve()
        if folder.exists() and not folder.is_dir():
            raise UserError(f"embed: OUTPUT {str(folder)[:300]} is a file, not a folder")
        if folder.is_dir():
            names = [p.name for p in folder.iterdir() if not p.name.startswith(".")]
            if names and JOB not in names:
                raise UserError(f"embed: OUTPUT {str(folder)[:300]} holds files that are not an embed job's "
                                f"({', '.join(sorted(names)[:3])[:200]}): give an empty or a new folder")
            if JOB in names:
                earlier = read_job(folder)
                if earlier.get("identity") != identity:
                    differ = [k for k in identity if earlier.get("identity", {}).get(k) != identity[k]]
                    raise UserError(f"embed: OUTPUT {str(folder)[:300]} holds another job's shards (it differs in "
                                    f"{', '.join(differ) or 'its format'}): give another folder, or remove this "
                                    "one to start over")
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"embed: cannot write to OUTPUT {str(folder)[:300]}: {existing} is not writable")
        return cls(folder, identity)

    def begin(self) -> None:
        """The folder made and the job written (once the instances are ready: a job that never started leaves
        nothing); what a killed job was writing removed."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
            if not (self.folder / JOB).exists():
                write_json(self.folder / JOB, {"format": FORMAT, "identity": self.identity})
        except OSError as exc:
            raise UserError(f"embed: cannot write to OUTPUT {str(self.folder)[:300]}: {exc.strerror or exc}") \
                from None

    def done(self) -> set[int]:
        """The shards already complete."""
        if not self.folder.is_dir():
            return set()
        return {int(m.group(1)) for p in self.folder.iterdir() if (m := SHARD.fullmatch(p.name))}

    def write_shard(self, index: int, table, rejects=None) -> None:
        import pyarrow.parquet as pq

        rejected = self.folder / shard_name(index, "rejects")
        if rejects is not None and rejects.num_rows:
            atomic_write(rejected, lambda tmp: pq.write_table(rejects, tmp))
        else:
            rejected.unlink(missing_ok=True)  # an earlier, killed attempt's
        atomic_write(self.folder / shard_name(index), lambda tmp: pq.write_table(table, tmp))

    def counts(self) -> tuple[int, int]:
        """(rows written, rows rejected) over every shard there."""
        import pyarrow.parquet as pq

        written = sum(pq.ParquetFile(p).metadata.num_rows for p in self.folder.glob("shard-*.parquet"))
        rejected = sum(pq.ParquetFile(p).metadata.num_rows for p in self.folder.glob("rejects-*.parquet"))
        return written, rejected

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json(self.folder / MANIFEST, {"format": FORMAT, **manifest})


def read_job(folder: Path) -> dict[str, Any]:
    try:
        job = json.loads((folder / JOB).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"embed: {folder.name}/{JOB} cannot be read ({exc}): give another folder") from None
    if not isinstance(job, dict) or job.get("format") != FORMAT:
        raise UserError(f"embed: {folder.name}/{JOB} is not a {FORMAT} job: give another folder")
    return job
