"""Where a tune's wall time went: per stage (the out-of-box baseline, the peer, screens, full windows, the final
repeats) its measurements, their wall time, and the QPS searches' share of it. The rest of a measurement (its
processes' start, loading, warm-up, the quality check, the speed sentinel) is what the budget does not bound
(tune/budget.py bounds the searches): shown so a user sees what a budget buys on their machine."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.errors import UserError
from corescale.record.files import read_result
from corescale.tune.document import Spent, StageTime

if TYPE_CHECKING:
    from corescale.record.trial import TrialRecord
    from corescale.tune.document import TunedFinalist, TuneTrial


def spent(trials: list[TuneTrial], rows: list[TunedFinalist], elapsed_s: float, began: float) -> Spent:
    """`rows`: the finalists, the baseline and the peer; `began`: the tune's start (epoch seconds). Each result
    counts once, in the first stage that used it (a final's first repeat is its full window)."""
    stages = {"baseline": [p for f in rows if f.role == "baseline" for p in f.paths],
              "peer": [p for f in rows if f.role == "peer" for p in f.paths],
              "screens": [str(t.screen["path"]) for t in trials if t.screen and t.screen.get("path")],
              "full windows": [str(t.full["path"]) for t in trials if t.full and t.full.get("path")],
              "final repeats": [p for f in rows if f.role not in ("baseline", "peer") for p in f.paths]}
    seen: set[str] = set()
    out, reused = [], 0
    for stage, paths in stages.items():
        seconds = search = 0.0
        count = 0
        for path in paths:
            key = str(Path(path).resolve())
            if key in seen:
                continue
            seen.add(key)
            record = _record(path)
            if record is None:
                continue
            start = _started(record)
            if start is None or start < began - 1:  # started_at is to the second
                reused += 1
                continue
            count += 1
            seconds += record.elapsed_s if record.elapsed_s is not None else (record.finished_at or start) - start
            search += sum(step.duration_s or 0.0 for step in record.server.steps) if record.server else 0.0
        out.append(StageTime(stage, count, seconds, search))
    return Spent(elapsed_s, out, reused)


def _record(path: str) -> TrialRecord | None:
    try:
        return read_result(Path(path))
    except (UserError, OSError):  # moved or removed since: not counted
        return None


def _started(record: TrialRecord) -> float | None:
    try:
        return datetime.strptime(record.started_at, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (TypeError, ValueError):
        return None
