"""Valid results under a results root, by trial key: what the loops' resume reads."""

from __future__ import annotations

from pathlib import Path

from corescale.errors import UserError
from corescale.record.files import iter_run_dirs, read_result
from corescale.record.trial import machine_fingerprint


class ResultIndex:
    """Valid results by key under one root, refreshed incrementally (only new run dirs are read)."""

    def __init__(self, root, machines: str | frozenset[str] | None = None):
        """machines: machine_fingerprints (or one); when given, only results measured on one of those machines and
        software count."""
        self.root = Path(root).expanduser()
        self.machines = frozenset([machines]) if isinstance(machines, str) else machines
        self.foreign = 0  # valid results skipped because they come from another machine or software
        self.seen: set[Path] = set()
        self.ok: dict[tuple[str, int], Path] = {}

    def refresh(self) -> None:
        if not self.root.is_dir():
            return
        for run_dir in iter_run_dirs(self.root):
            if run_dir in self.seen:
                continue
            self.seen.add(run_dir)
            try:
                record = read_result(run_dir)
            except (UserError, OSError):
                continue
            if (record.valid_ok and self.machines is not None
                    and machine_fingerprint(record.environment) not in self.machines):
                self.foreign += 1
            elif record.valid_ok:
                for key in (record.trial_key, *record.legacy_keys):  # old keys stay findable
                    self.ok[(key, record.repeat)] = run_dir

    def find(self, key: str, repeat: int = 0) -> Path | None:
        """A valid result of that trial key and repeat (repeats are measured in fresh processes each)."""
        self.refresh()
        return self.ok.get((key, repeat))
