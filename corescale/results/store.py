"""Every result under a results root as one pandas table: one row per run directory.

A row holds the flattened config, the key metrics, status and path. By default only the latest attempt of each
trial key is kept (a failed attempt is superseded by a later one); `latest=False` keeps every attempt.
Unreadable result files are reported in `Table.problems` and skipped.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from corescale.errors import UserError
from corescale.results.files import RESULT_FILE, TMP_PREFIX, iter_run_dirs, read_result, read_samples

# Columns shown by `corescale results` unless --columns says otherwise.
SUMMARY_COLUMNS = ["status", "model", "backend", "precision", "batch_size", "sequence_length", "instances",
                   "cpus_per_instance", "threads_per_instance", "latency_p50_ms", "latency_p99_ms",
                   "throughput_samples_per_s", "contaminated", "run"]
_FILTER = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(!=|>=|<=|=|>|<)\s*(.*?)\s*$")


# --- keys -------------------------------------------------------------------------------------------------------

def model_files(path: str | None) -> list | None:
    """Names, sizes and mtimes of a local model directory's files: a changed weight file changes the key."""
    if not path or not Path(path).is_dir():
        return None
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(Path(path).iterdir())
            if p.is_file() and not p.name.startswith(".")]


def trial_key(config_key: str, model_identity: dict, files: list | None = None) -> str:
    """Resume key: the resolved config hash plus the model identity (and a local model's file listing)."""
    blob = json.dumps({"config": config_key, "model": model_identity, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def spec_key(cfg, spec) -> str:
    return trial_key(cfg.key(), spec.identity(), model_files(spec.path) if spec.source == "local" else None)


def record_key(record: dict) -> str:
    """The key a record was written under (records written before trial keys existed: config + identity)."""
    return record.get("trial_key") or trial_key(record.get("key", ""), record.get("model") or {})


def is_valid_ok(record: dict) -> bool:
    return record.get("status") == "ok" and bool(record.get("valid", True))


# --- reading ----------------------------------------------------------------------------------------------------

@dataclass
class Table:
    frame: pd.DataFrame
    problems: list[tuple[Path, str]] = field(default_factory=list)  # skipped result files and why
    unfinished: int = 0  # hidden temp dirs of runs that never committed (killed or still running)


def check_root(root) -> Path:
    root = Path(root).expanduser()
    if not root.exists():
        raise UserError(f"results directory '{root}' does not exist")
    if not root.is_dir():
        raise UserError(f"'{root}' is not a directory (give the results root, e.g. outputs/)")
    return root


def scan(root) -> tuple[list[tuple[Path, dict]], list[tuple[Path, str]]]:
    """(run dir, record) for every readable result under root, and (path, reason) for the others."""
    found, problems = [], []
    for run_dir in iter_run_dirs(root):
        try:
            record = read_result(run_dir)
            if not isinstance(record.get("config"), dict) or "status" not in record:
                raise UserError(f"'{run_dir / RESULT_FILE}' has no config or status")
        except UserError as exc:
            problems.append((run_dir, str(exc)))
            continue
        except OSError as exc:  # removed or unreadable while scanning
            problems.append((run_dir, f"cannot read '{run_dir / RESULT_FILE}': {exc.strerror}"))
            continue
        found.append((run_dir, record))
    return found, problems


def load(root, latest: bool = True, where: list[str] | None = None, require: bool = True) -> Table:
    """The results table of a root. `require`: an empty root is a UserError."""
    root = check_root(root)
    found, problems = scan(root)
    unfinished = sum(1 for p in root.rglob(f"{TMP_PREFIX}*") if p.is_dir())
    rows = []
    for path, record in found:
        try:
            rows.append(flatten(record, path))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # valid JSON, wrong shape
            problems.append((path, f"malformed result '{path / RESULT_FILE}': {type(exc).__name__}: {exc}"))
    if not rows and require:
        detail = f"; {len(problems)} unreadable result file(s), e.g. {problems[0][1]}" if problems else ""
        raise UserError(f"no results under '{root}' (no run directory holding {RESULT_FILE}){detail}")
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["finished_at", "run"], kind="stable", ignore_index=True)
        if latest:
            frame = frame.drop_duplicates("key", keep="last").reset_index(drop=True)
        frame = filter_frame(frame, where or [])
    return Table(frame, problems, unfinished)


def _flat_config(config: dict, prefix: str = "") -> dict:
    out = {}
    for name, value in config.items():
        if isinstance(value, dict):
            out.update(_flat_config(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def _ms(value) -> float | None:
    return None if value is None else value * 1e3


def _finished_at(record: dict, path: Path) -> float:
    if record.get("finished_at") is not None:
        return float(record["finished_at"])
    try:
        started = time.mktime(time.strptime(record["started_at"][:19], "%Y-%m-%dT%H:%M:%S"))
        return started + float(record.get("elapsed_s") or 0)
    except (KeyError, TypeError, ValueError):
        return (path / RESULT_FILE).stat().st_mtime


def _instance_batch(config: dict) -> int:
    """Samples per forward call of one instance (a total batch is split evenly over the instances)."""
    total = config.get("total_batch_size")
    return total // max(config.get("instances") or 1, 1) if total else config.get("batch_size")


def config_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of a table that come from the run configs (dotted for nested keys), in table order."""
    return [c for c in frame.columns if c not in _NOT_CONFIG]


def flatten(record: dict, path: Path) -> dict:
    """One table row: run, key, status, flattened config, layout facts, key metrics, host."""
    row = {**_run_columns(record, path), **_flat_config(record["config"]), **_metric_columns(record)}
    row["path"] = str(path)
    return row


def _run_columns(record: dict, path: Path) -> dict:
    return {
        "run": Path(path).name,
        "key": record_key(record),
        "status": record.get("status"),
        "valid": bool(record.get("valid", False)),
        "reason": record.get("reason"),
        "started_at": record.get("started_at"),
        "finished_at": _finished_at(record, Path(path)),
        "elapsed_s": record.get("elapsed_s"),
    }


def _metric_columns(record: dict) -> dict:
    metrics = record.get("metrics") or {}
    latency = metrics.get("latency_s") or {}
    placed = (record.get("plan") or {}).get("instances") or []
    env = record.get("environment") or {}
    return {
        "cpus_total": sum(len(inst.get("cpus", [])) for inst in placed) or None,
        "cpus_per_instance": len(placed[0].get("cpus", [])) if placed else None,
        "threads_per_instance": placed[0].get("threads") if placed else None,
        "instance_batch_size": _instance_batch(record["config"]),
        "batch_total": _instance_batch(record["config"]) * len(placed) if placed else None,
        "throughput_samples_per_s": metrics.get("throughput_samples_per_s"),
        "throughput_tokens_per_s": metrics.get("throughput_tokens_per_s"),
        "latency_mean_ms": _ms(latency.get("mean")),
        "latency_p50_ms": _ms(latency.get("p50")),
        "latency_p90_ms": _ms(latency.get("p90")),
        "latency_p99_ms": _ms(latency.get("p99")),
        "latency_cv": latency.get("cv"),
        "max_instance_p50_ms": _ms(metrics.get("max_instance_p50_s")),
        "gflops_per_s": metrics.get("gflops_per_s"),
        "percent_of_peak": metrics.get("percent_of_peak"),
        "peak_rss_mib": None if metrics.get("peak_rss_bytes") is None else metrics["peak_rss_bytes"] / 2**20,
        "cpu_utilisation": metrics.get("cpu_utilisation"),
        "foreign_load": metrics.get("foreign_load"),
        "contaminated": metrics.get("contaminated"),
        "window_s": metrics.get("window_s"),
        "samples_in_window": metrics.get("samples_in_window"),
        "load_s": metrics.get("load_seconds"),
        "host": env.get("hostname"),
        "node_type": (record.get("node") or {}).get("node_type"),  # Ray sweeps: the machine kind
        "cpu_model": (env.get("cpu") or {}).get("model"),
        "host_physical_cores": (env.get("topology") or {}).get("physical_cores"),
        "host_logical_cpus": (env.get("topology") or {}).get("logical_cpus"),
    }


# the column names flatten() adds around the config (from a minimal record; only the names are used)
_MINIMAL = {"config": {"batch_size": 1}, "finished_at": 0, "plan": {"instances": [{"cpus": [0], "threads": 1}]}}
_NOT_CONFIG = {*_run_columns(_MINIMAL, Path("run")), *_metric_columns(_MINIMAL), "path"}


# --- filters ----------------------------------------------------------------------------------------------------

def _coerce(series: pd.Series, text: str):
    if text.lower() in ("none", "null", ""):
        return None
    boolean = pd.api.types.is_bool_dtype(series) or set(series.dropna().unique()) <= {True, False}
    if boolean and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if pd.api.types.is_numeric_dtype(series):
        try:
            return float(text)
        except ValueError:
            raise UserError(f"filter value '{text}' is not a number, but column '{series.name}' is numeric") from None
    return text


def _mask(frame: pd.DataFrame, expression: str) -> pd.Series:
    match = _FILTER.match(expression)
    if not match:
        raise UserError(f"cannot parse filter '{expression}': use COLUMN=VALUE[,VALUE...], COLUMN!=VALUE, "
                        "or COLUMN<, <=, >, >= NUMBER (e.g. backend=onnxruntime)")
    column, op, text = match.groups()
    if column not in frame.columns:
        raise UserError(f"unknown column '{column}' in filter '{expression}'; columns: {', '.join(frame.columns)}")
    series = frame[column]
    if op in ("=", "!="):
        values = [_coerce(series, part.strip()) for part in text.split(",")]
        hit = pd.Series(False, index=frame.index)
        for value in values:
            if value is None:
                hit |= series.isna()
            elif isinstance(value, str):
                hit |= series.astype(str) == value
            else:
                hit |= series == value
        return hit if op == "=" else ~hit
    value = _coerce(series, text)
    if not isinstance(value, float):
        raise UserError(f"filter '{expression}': {op} needs a numeric column and a number")
    numbers = pd.to_numeric(series, errors="coerce")
    return {"<": numbers < value, "<=": numbers <= value, ">": numbers > value, ">=": numbers >= value}[op]


def filter_frame(frame: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    for expression in where:
        frame = frame[_mask(frame, expression)]
    return frame.reset_index(drop=True)


# --- helpers for other stages -----------------------------------------------------------------------------------

def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with a valid, successful measurement."""
    if frame.empty:
        return frame
    return frame[(frame["status"] == "ok") & frame["valid"]].reset_index(drop=True)


def timed_latencies_ms(run_dir) -> np.ndarray:
    """Raw latencies (ms) of the timed calls of one run, for significance tests."""
    try:
        samples = read_samples(Path(run_dir))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the samples of '{run_dir}': {exc}") from None
    return samples.loc[samples["phase"] == "timed", "latency_ms"].to_numpy(dtype=float)


def describe_value(value) -> str:
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class ResultIndex:
    """Valid results by key under one root, refreshed incrementally (only new run dirs are read)."""

    def __init__(self, root):
        self.root = Path(root).expanduser()
        self.seen: set[Path] = set()
        self.ok: dict[str, Path] = {}

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
            if is_valid_ok(record):
                self.ok[record_key(record)] = run_dir

    def find(self, key: str) -> Path | None:
        self.refresh()
        return self.ok.get(key)
