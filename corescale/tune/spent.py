"""Where a tune's wall time went: per stage (the out-of-box baseline, the peer, screens, full windows, the final
repeats) its measurements, their wall time, and the QPS searches' share of it. The rest of a measurement (its
processes' start, loading, warm-up, the quality check, the speed sentinel) is what the budget does not bound
(tune/budget.py bounds the searches): shown so a user sees what a budget buys on their machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from corescale.errors import UserError
from corescale.record.files import read_result
from corescale.tune.document import Spent, StageTime

if TYPE_CHECKING:
    from corescale.record.trial import TrialRecord
    from corescale.tune.document import TunedFinalist, TuneTrial


def spent(trials: list[TuneTrial], rows: list[TunedFinalist], elapsed_s: float, tune_dir: Path) -> Spent:
    """`rows`: the finalists, the baseline and the peer. Each result counts once, in the first stage that used it
    (a final's first repeat is its full window); one outside `tune_dir` was measured by an earlier run under the
    same output_dir and found by key: reused, not spent (a resumed tune's own earlier sessions are in its folder,
    and in its elapsed_s)."""
    own = Path(tune_dir).resolve()
    stages = {"baseline": [p for f in rows if f.role == "baseline" for p in f.paths],
              "peer": [p for f in rows if f.role == "peer" for p in f.paths],
              "screens": [str(t.screen["path"]) for t in trials if t.screen and t.screen.get("path")],
              "full windows": [str(t.full["path"]) for t in trials if t.full and t.full.get("path")],
              "final repeats": [p for f in rows if f.role not in ("baseline", "peer") for p in f.paths]}
    seen: set[Path] = set()
    out, reused = [], 0
    for stage, paths in stages.items():
        seconds = search = 0.0
        count = 0
        for path in paths:
            where = Path(path).resolve()
            if where in seen:
                continue
            seen.add(where)
            if own not in where.parents:  # not read: only counted
                reused += 1
                continue
            record = _record(where)
            if record is None:
                continue
            count += 1
            seconds += record.elapsed_s or 0.0
            search += sum(step.duration_s or 0.0 for step in record.server.steps) if record.server else 0.0
        out.append(StageTime(stage, count, seconds, search))
    return Spent(elapsed_s, out, reused)


def _record(path: Path) -> TrialRecord | None:
    try:
        return read_result(path)
    except (UserError, OSError):  # moved or removed since: not counted
        return None
