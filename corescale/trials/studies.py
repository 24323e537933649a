"""Scaling studies: a grid of ordinary trials along one axis, then one table, one figure, one JSON.

- cores:     one instance on 1..N cores (latency vs cores, per swept group such as sequence length)
- instances: 1..N instances of a fixed size (total throughput vs instances, ideal-linear line, efficiency)
- batch:     one total batch B split over N instances sharing all cores (max instance latency, throughput)

The grid and the table maths are pure; `run_study` runs the trials one at a time through the runner.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from corescale.errors import UserError

KINDS = ("cores", "instances", "batch")
AXIS = {"cores": "cores", "instances": "instances", "batch": "instances"}  # the x of each study
# Keys a study sets itself; the user may not override them.
OWNED_KEYS = {
    "cores": ("instances", "cores_per_instance", "threads", "layout", "total_batch_size", "output_dir"),
    "instances": ("instances", "layout", "total_batch_size", "output_dir"),
    "batch": ("instances", "cores_per_instance", "threads", "layout", "batch_size", "output_dir"),
}
DEFAULT_TOTAL_BATCH = 8  # the original study's batch split
FILES = {"csv": "study.csv", "figure": "study.png", "json": "study.json"}


@dataclass(frozen=True)
class StudyTrial:
    overrides: tuple[str, ...]  # everything compose() needs for this trial
    group: str  # the swept user overrides that distinguish this trial's line ("" when only one)
    value: int  # the study axis value (cores, or instances)


def default_values(limit: int) -> list[int]:
    """1, 2, 4, ... below `limit`, then `limit` itself."""
    values = [2**k for k in range(int(math.log2(limit)) + 1) if 2**k < limit] if limit >= 1 else []
    return values + [limit] if limit >= 1 else []


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def group_labels(groups: list[list[str]]) -> list[str]:
    """Per group, the overrides that are not common to all groups (what a legend should say)."""
    common = set.intersection(*(set(g) for g in groups)) if groups else set()
    return [" ".join(o for o in g if o not in common) for g in groups]


def check_overrides(kind: str, overrides: list[str]) -> None:
    if kind not in KINDS:
        raise UserError(f"unknown study '{kind}'; allowed: {', '.join(KINDS)}")
    taken = sorted({_key(o) for o in overrides} & set(OWNED_KEYS[kind]) - {"output_dir"})
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


def axis_trials(kind: str, cfg, physical_cores: int, values: list[int] | None) -> list[tuple[int, list[str]]]:
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
        given = {_key(o) for o in group}
        for value, extra in axis_trials(kind, compose(group), physical_cores, values):
            extra = [o for o in extra if _key(o) not in given]  # the user's own setting stays (same value)
            own = [o for o in group if _key(o) != "output_dir"]  # results go into the study directory
            trials.append(StudyTrial(tuple([*own, *extra, f"output_dir={study_dir}"]), label, value))
    return trials


# ---- the table -------------------------------------------------------------------------------------------


def _ms(value):
    return value * 1e3 if value is not None else np.nan


def trial_row(kind: str, trial: StudyTrial, record: dict, path) -> dict:
    """One table row from a trial's result record (failed trials keep NaN figures)."""
    cfg = record["config"]
    plan = record["plan"]["instances"]
    metrics = record.get("metrics") or {}
    latency = metrics.get("latency_s") or {}
    return {
        "study": kind,
        "group": trial.group,
        AXIS[kind]: trial.value,
        "model": cfg["model"],
        "backend": cfg["backend"],
        "sequence_length": cfg["sequence_length"],
        "batch_size": (cfg["total_batch_size"] // cfg["instances"]) if cfg.get("total_batch_size") else
        cfg["batch_size"],
        "total_batch_size": cfg.get("total_batch_size") or cfg["batch_size"] * cfg["instances"],
        "instances": cfg["instances"],
        "cores_per_instance": len(plan[0]["cpus"]) if plan else np.nan,
        "total_cores": sum(len(i["cpus"]) for i in plan),
        "status": record["status"],
        "valid": bool(record.get("valid")),
        "contaminated": bool(metrics.get("contaminated", False)),
        "foreign_load": metrics.get("foreign_load", np.nan),
        "latency_p50_ms": _ms(latency.get("p50")),
        "latency_mean_ms": _ms(latency.get("mean")),
        "latency_p90_ms": _ms(latency.get("p90")),
        "latency_p99_ms": _ms(latency.get("p99")),
        "max_instance_p50_ms": _ms(metrics.get("max_instance_p50_s")),
        "throughput_samples_per_s": metrics.get("throughput_samples_per_s", np.nan),
        "throughput_tokens_per_s": metrics.get("throughput_tokens_per_s", np.nan),
        "path": str(path) if path is not None else "",
    }


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


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".tmp-", suffix=".csv", delete=False) as tmp:
        frame.to_csv(tmp, index=False)
    os.replace(tmp.name, path)


def study_dir_name(kind: str) -> str:
    return f"study-{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


FIGURES = {"cores": "cores_figure", "instances": "instances_figure", "batch": "batch_figure"}


def write_outputs(kind: str, study_dir: Path, frame: pd.DataFrame, document: dict) -> dict[str, Path]:
    """study.csv, study.png, study.json in the study directory (each written whole, then renamed)."""
    from corescale.report import plots
    from corescale.results.files import write_json_atomic

    paths = {name: study_dir / file for name, file in FILES.items()}
    write_csv_atomic(frame, paths["csv"])
    plots.save_figure(getattr(plots, FIGURES[kind])(frame), paths["figure"])
    table = frame.replace({np.nan: None}).to_dict(orient="records")
    write_json_atomic(paths["json"], {**document, "table": table, "files": FILES})
    return paths


# ---- running -------------------------------------------------------------------------------------------


def run_study(kind: str, overrides: list[str], values: list[int] | None = None, progress: bool = True,
              fail_fast: bool = False, topology=None) -> tuple[pd.DataFrame, dict[str, Path], int]:
    """Runs every trial strictly one at a time; returns (table, files, failed trial count)."""
    from corescale.machine import environment
    from corescale.machine.topology import Topology
    from corescale.measure.runner import execute, prepare_trial
    from corescale.overrides import compose, expand_sweep
    from corescale.report.console import TrialProgress, console, errors
    from corescale.trials.sweep import machine_lock

    topology = topology or Topology.from_sysfs()
    check_overrides(kind, overrides)
    first = compose(expand_sweep(overrides)[0] if overrides else [])  # output_dir is shared by all trials
    study_dir = Path(os.path.expanduser(first.output_dir)) / study_dir_name(kind)
    trials = trial_grid(kind, overrides, len(topology.physical_cores), study_dir, values)
    prepared = [prepare_trial(compose(list(t.overrides)), topology) for t in trials]  # all checked first
    host = environment.capture()
    study_dir.mkdir(parents=True, exist_ok=True)
    rows, runs, failures = [], [], 0
    for number, (trial, prep) in enumerate(zip(trials, prepared), 1):
        label = f"{AXIS[kind]}={trial.value}" + (f" {trial.group}" if trial.group else "")
        console.print(f"[bold]{kind} study {number}/{len(trials)}[/bold]: {label}")
        with TrialProgress(prep.cfg, enabled=progress) as bars, machine_lock():  # no other trial overlaps
            outcome = execute(prep, on_event=bars, host=host)
        rows.append(trial_row(kind, trial, outcome.record, outcome.path))
        runs.append({"overrides": list(trial.overrides), "path": str(outcome.path), "status": outcome.record["status"],
                     "reason": outcome.record.get("reason")})
        if not outcome.ok:
            failures += 1
            errors.print(f"[red]trial {number} failed:[/red] {outcome.record['reason']}")
            if fail_fast:
                break
        else:
            console.print(summary_line(rows[-1]))
    frame = study_frame(kind, rows)
    document = {"study": kind, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "overrides": overrides,
                "values": values, "topology": topology.describe(), "environment": host, "trials": runs,
                "failed_trials": failures}
    return frame, write_outputs(kind, study_dir, frame, document), failures


def summary_line(row: dict) -> str:
    flag = " [yellow](contaminated)[/yellow]" if row["contaminated"] else ""
    return (f"  p50 {row['latency_p50_ms']:.2f} ms · max instance p50 {row['max_instance_p50_ms']:.2f} ms · "
            f"{row['throughput_samples_per_s']:.2f} samples/s{flag}")


COLUMNS = {  # what the printed table shows, per study: (column, header, format)
    "cores": [("cores", "cores", "{:.0f}"), ("latency_p50_ms", "p50 ms", "{:.2f}"),
              ("latency_p99_ms", "p99 ms", "{:.2f}"), ("speedup", "speedup", "{:.2f}x"),
              ("efficiency", "efficiency", "{:.0%}")],
    "instances": [("instances", "instances", "{:.0f}"), ("cores_per_instance", "cores each", "{:.0f}"),
                  ("throughput_samples_per_s", "samples/s", "{:.2f}"),
                  ("ideal_throughput_samples_per_s", "ideal samples/s", "{:.2f}"),
                  ("efficiency", "efficiency", "{:.0%}"), ("max_instance_p50_ms", "max p50 ms", "{:.2f}")],
    "batch": [("instances", "instances", "{:.0f}"), ("cores_per_instance", "cores each", "{:.0f}"),
              ("batch_size", "batch each", "{:.0f}"), ("max_instance_p50_ms", "max p50 ms", "{:.2f}"),
              ("throughput_samples_per_s", "samples/s", "{:.2f}"), ("throughput_gain", "gain", "{:.2f}x")],
}


def rich_table(kind: str, frame: pd.DataFrame):
    from rich.table import Table

    table = Table(title=f"{kind} study", header_style="bold")
    columns = [c for c in COLUMNS[kind] if c[0] in frame]
    show_group = frame["group"].astype(bool).any()
    if show_group:
        table.add_column("group")
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    table.add_column("status")
    for _, row in frame.iterrows():
        cells = [fmt.format(row[col]) if pd.notna(row[col]) else "-" for col, _, fmt in columns]
        status = "contaminated" if row["status"] == "ok" and row["contaminated"] else row["status"]
        table.add_row(*([row["group"]] if show_group else []), *cells, status)
    return table
