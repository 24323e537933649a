"""Scaling studies: a grid of ordinary trials along one axis, then one table, one figure, one JSON.

- cores:     one instance on 1..N cores (latency vs cores, per swept group such as sequence length)
- instances: 1..N instances of a fixed size (total throughput vs instances, ideal-linear line, efficiency)
- batch:     one total batch B split over N instances sharing all cores (max instance latency, throughput)

The grid and the table maths are pure; `run_study` runs the trials as a sweep does (sweep.run_sweep: the one
local loop, or a Ray cluster with `executor=ray`): they resume by key (a valid result anywhere under the results
root is reused) and a failed trial is recorded in the table, never the end of the study.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from corescale.config import STUDY_KINDS
from corescale.errors import UserError
from corescale.overrides import assignment, override_key
from corescale.record.repeats import across_repeats, headline
from corescale.record.stats import ms
from corescale.record.trial import TrialRecord

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

KINDS = STUDY_KINDS
AXIS = {"cores": "cores", "instances": "instances", "batch": "instances"}  # the x of each study
# Keys a study sets itself; the user may not override them.
OWNED_KEYS = {
    "cores": ("instances", "cores_per_instance", "threads", "layout", "total_batch_size", "output_dir"),
    "instances": ("instances", "layout", "total_batch_size", "output_dir"),
    "batch": ("instances", "cores_per_instance", "threads", "layout", "batch_size", "output_dir"),
}
DEFAULT_TOTAL_BATCH = 8  # the original study's batch split


@dataclass(frozen=True)
class StudyTrial:
    overrides: tuple[str, ...]  # everything compose() needs for this trial
    group: str  # the swept user overrides that distinguish this trial's line ("" when only one)
    value: int  # the study axis value (cores, or instances)


def default_values(limit: int) -> list[int]:
    """1, 2, 4, ... below `limit`, then `limit` itself."""
    values = [2**k for k in range(int(math.log2(limit)) + 1) if 2**k < limit] if limit >= 1 else []
    return values + [limit] if limit >= 1 else []


def group_labels(groups: list[list[str]]) -> list[str]:
    """Per group, the overrides that are not common to all groups (what a legend should say)."""
    common = set.intersection(*(set(g) for g in groups)) if groups else set()
    return [" ".join(o for o in g if o not in common) for g in groups]


def check_overrides(kind: str, overrides: list[str]) -> None:
    if kind not in KINDS:
        raise UserError(f"unknown study '{kind}'; allowed: {', '.join(KINDS)}")
    taken = sorted({override_key(o) for o in overrides} & set(OWNED_KEYS[kind]) - {"output_dir"})
    if taken:
        raise UserError(f"study '{kind}' sets {', '.join(taken)} itself; remove {' '.join(taken)} from the "
                        f"overrides (use --values to choose the {AXIS[kind]} counts)")


def _values(values: list[int] | None, allowed: list[int], default: list[int], what: str) -> list[int]:
    if values is None:
        return default
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UserError(f"--values {','.join(map(str, bad))}: {what}; possible: {','.join(map(str, allowed))}")
    return sorted(set(values))


def axis_trials(kind: str, cfg: BenchmarkConfig, physical_cores: int,
                values: list[int] | None) -> list[tuple[int, list[str]]]:
    """(axis value, overrides the study adds) for one group, given its composed config."""
    if kind == "cores":
        counts = _values(values, list(range(1, physical_cores + 1)), default_values(physical_cores),
                         f"one instance can use 1 to {physical_cores} cores")
        return [(c, ["instances=1", f"cores_per_instance={c}"]) for c in counts]
    if kind == "instances":
        per = cfg.cores_per_instance or 1
        most = physical_cores // per
        if most < 1:
            raise UserError(f"cores_per_instance={per} exceeds the {physical_cores} physical cores")
        counts = _values(values, list(range(1, most + 1)), default_values(most),
                         f"at most {most} instances of {per} core(s) fit")
        return [(n, [f"instances={n}", f"cores_per_instance={per}"]) for n in counts]
    total = cfg.total_batch_size or DEFAULT_TOTAL_BATCH
    divisors = [n for n in range(1, min(total, physical_cores) + 1) if total % n == 0]
    counts = _values(values, divisors, divisors,
                     f"the instance count must divide total_batch_size={total} and fit {physical_cores} cores")
    return [(n, [f"instances={n}", f"cores_per_instance={physical_cores // n}", f"total_batch_size={total}"])
            for n in counts]


def trial_grid(kind: str, overrides: list[str], physical_cores: int, study_dir: Path,
               values: list[int] | None = None) -> list[StudyTrial]:
    """Every trial of a study: the user's (possibly swept) overrides × the study axis."""
    from corescale.overrides import compose, expand_sweep

    check_overrides(kind, overrides)
    groups = expand_sweep(overrides) if overrides else [[]]
    labels = group_labels(groups)
    trials = []
    for group, label in zip(groups, labels):
        given = {override_key(o) for o in group}
        for value, extra in axis_trials(kind, compose(group), physical_cores, values):
            extra = [o for o in extra if override_key(o) not in given]  # the user's own setting stays (same value)
            own = [o for o in group if override_key(o) != "output_dir"]  # results go into the study directory
            trials.append(StudyTrial(tuple([*own, *extra, assignment("output_dir", study_dir)]), label, value))
    return trials


# ---- the table -------------------------------------------------------------------------------------------



def trial_row(kind: str, trial: StudyTrial, record: TrialRecord, path) -> dict:
    """One table row from a trial's result record (failed trials keep NaN figures)."""
    cfg = record.config
    placed = record.placed
    m = record.metrics
    latency = m.latency_s if m else None
    head = headline(record)  # the server scenario has no closed-loop metrics: its max QPS at the SLO
    return {
        "study": kind,
        "group": trial.group,
        AXIS[kind]: trial.value,
        "model": cfg.model,
        "backend": cfg.backend.name,
        "sequence_length": cfg.sequence_length,
        "batch_size": cfg.instance_batch_size,
        "total_batch_size": cfg.total_batch_size or cfg.batch_size * cfg.instances,
        "instances": cfg.instances,
        "cores_per_instance": len(placed[0].cpus) if placed else np.nan,
        "total_cores": sum(len(i.cpus) for i in placed),
        "status": record.status,
        "valid": record.valid,
        "contaminated": bool(m and m.contaminated),
        "foreign_load": m.foreign_load if m else np.nan,
        "latency_p50_ms": head.p50_ms if head and head.p50_ms is not None else np.nan,
        "latency_mean_ms": ms(latency.mean if latency else None, np.nan),
        "latency_p90_ms": ms(latency.p90 if latency else None, np.nan),
        "latency_p99_ms": head.p99_ms if head and head.p99_ms is not None else np.nan,
        "max_instance_p50_ms": ms(m.max_instance_p50_s, np.nan) if m else np.nan,
        "throughput_samples_per_s": head.rate if head and head.rate is not None else np.nan,
        "throughput_tokens_per_s": m.throughput_tokens_per_s if m else np.nan,
        "path": str(path) if path is not None else "",
    }


def with_repeats(row: dict, records: list[TrialRecord]) -> dict:
    """A trial measured `repeats` times: its figures are the means over the repeats, with their 95 % interval and
    whether it is usable (Interval.usable; a failed repeat fails the row: a study compares like with like)."""
    summary = across_repeats(records)
    row = {**row, "repeats": len(records), "repeats_ok": summary.repeats}
    if len(records) < 2 or summary.repeats == 0:
        return row
    if summary.failed:
        row["status"] = "failed"
    for name, interval in (("throughput_samples_per_s", summary.throughput), ("latency_p50_ms", summary.p50_ms)):
        row[name] = interval.mean
        row[f"{name}_ci95_low"], row[f"{name}_ci95_high"] = interval.low, interval.high
        row[f"{name}_ci95_usable"] = interval.usable  # else the repeats (their values in each result) say more
    row["latency_p99_ms"] = summary.p99_ms.mean
    return row


def add_scaling(kind: str, frame: pd.DataFrame) -> pd.DataFrame:
    """Speedup / efficiency against the smallest axis value of each group (NaN where a trial failed).

    cores:     speedup = p50(c0) / p50(c); efficiency = speedup / (c / c0)
    instances: ideal = T(n0) · n / n0;      efficiency = T(n) / ideal
    batch:     throughput_gain = T(n) / T(n0); latency_gain = max p50(n0) / max p50(n)
    """
    frame = frame.copy()
    axis = AXIS[kind]
    ok = frame["status"] == "ok"
    for column in ("speedup", "efficiency", "ideal_throughput_samples_per_s", "throughput_gain", "latency_gain"):
        frame[column] = np.nan
    for _, rows in frame.groupby("group", sort=False):
        rows = rows.sort_values(axis)
        base = rows.iloc[0]
        if base["status"] != "ok":  # no baseline, no ratios
            continue
        x = rows[axis] / base[axis]
        good = rows.index[ok[rows.index]]
        if kind == "cores":
            speedup = base["latency_p50_ms"] / rows["latency_p50_ms"]
            frame.loc[good, "speedup"] = speedup[good]
            frame.loc[good, "efficiency"] = (speedup / x)[good]
        elif kind == "instances":
            ideal = base["throughput_samples_per_s"] * x
            frame.loc[rows.index, "ideal_throughput_samples_per_s"] = ideal
            frame.loc[good, "efficiency"] = (rows["throughput_samples_per_s"] / ideal)[good]
        else:
            frame.loc[good, "throughput_gain"] = (rows["throughput_samples_per_s"]
                                                  / base["throughput_samples_per_s"])[good]
            frame.loc[good, "latency_gain"] = (base["max_instance_p50_ms"] / rows["max_instance_p50_ms"])[good]
    return frame.dropna(axis=1, how="all")


def study_frame(kind: str, rows: list[dict]) -> pd.DataFrame:
    return add_scaling(kind, pd.DataFrame(rows))


# ---- files -----------------------------------------------------------------------------------------------


def study_dir_name(kind: str) -> str:
    return f"study-{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


# ---- running -------------------------------------------------------------------------------------------


@dataclass
class StudyResult:
    """A study's table and JSON document; report/study.py writes them (and the figure) into `study_dir`."""

    kind: str
    study_dir: Path
    frame: pd.DataFrame
    document: dict
    state: object  # the loop's LoopState
    reused: list[Path] = field(default_factory=list)  # results of earlier runs that this study resumed from

    @property
    def failures(self) -> int:
        return int((self.frame["status"] != "ok").sum()) if "status" in self.frame else 0


def plan_study(kind: str, overrides: list[str], values: list[int] | None = None, topology=None):
    """(study dir, trials, planned loop items): every trial composed and checked before any runs."""
    from corescale.machine.placement import topology_here
    from corescale.overrides import compose, expand_sweep
    from corescale.trials.sweep import plan_sweep

    topology = topology or topology_here()  # the study's sizes from the CPUs and the CPU quota this process has
    check_overrides(kind, overrides)
    first = compose(expand_sweep(overrides)[0] if overrides else [])  # output_dir is shared by all trials
    study_dir = first.results_root / study_dir_name(kind)
    trials = trial_grid(kind, overrides, len(topology.physical_cores), study_dir, values)
    planned = plan_sweep([list(t.overrides) for t in trials], topology)
    for item, trial in zip(planned, trials):
        item.label = f"{AXIS[kind]}={trial.value}" + (f" {trial.group}" if trial.group else "")
        item.resume_root = first.results_root  # earlier studies and runs under the same root count
    return study_dir, trials, planned, topology


def run_study(kind: str, overrides: list[str], values: list[int] | None = None, listener=None,
              fail_fast: bool = False, topology=None, resume: bool = True,
              accept_foreign: bool = False, on_lock_wait=None) -> StudyResult:
    """Runs the study's trials where their executor says, as a sweep does (sweep.run_sweep: the local loop, or a
    Ray cluster); returns the table, its document and the loop state."""
    from corescale.machine import environment
    from corescale.trials.sweep import run_sweep

    study_dir, trials, planned, topology = plan_study(kind, overrides, values, topology)
    state = run_sweep(planned, listener, resume=resume, fail_fast=fail_fast, accept_foreign=accept_foreign,
                      on_lock_wait=on_lock_wait)
    study_dir.mkdir(parents=True, exist_ok=True)  # also when every trial was resumed (none was committed here)
    rows, runs, reused = [], [], []
    for item, trial in zip(planned, trials):
        done = [row for row in state.rows if row.item is item]
        if not done:  # not run: --fail-fast stopped the study first
            continue
        records = [row.result() for row in done]
        reused += [row.path for row in done if row.status == "skipped" and row.path is not None]
        rows.append(with_repeats(trial_row(kind, trial, records[-1], done[-1].path), records))
        runs += [{"overrides": list(trial.overrides), "path": str(row.path), "status": record.status,
                  "reason": record.reason, "resumed": row.status == "skipped", "trial_key": record.trial_key,
                  "repeat": row.repeat} for row, record in zip(done, records)]
    frame = study_frame(kind, rows)
    document = {"study": kind, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "overrides": overrides,
                "values": values, "topology": topology.summary(), "environment": environment.capture().to_dict(),
                "trials": runs, "failed_trials": int((frame["status"] != "ok").sum()) if rows else 0}
    return StudyResult(kind, study_dir, frame, document, state, reused)
