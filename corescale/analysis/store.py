"""Every result under a results root as one pandas table: one row per run directory.

A row holds the flattened config, the key metrics, status and path. By default only the latest attempt of each
trial key is kept (a failed attempt is superseded by a later one); `latest=False` keeps every attempt.
Unreadable result files are reported in `Table.problems` and skipped.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from corescale.analysis.catalog import catalog_isa
from corescale.config import flatten as flatten_dict
from corescale.errors import UserError
from corescale.record.files import RESULT_FILE, TMP_PREFIX, iter_run_dirs, read_result
from corescale.record.sections import HostEnvironment
from corescale.record.stats import ms
from corescale.record.trial import TrialRecord

# Columns shown by `corescale results` unless --columns says otherwise.
SUMMARY_COLUMNS = ["status", "model", "backend", "precision", "batch_size", "sequence_length", "instances",
                   "cpus_per_instance", "threads_per_instance", "latency_p50_ms", "latency_p99_ms",
                   "throughput_samples_per_s", "contaminated", "run"]
# with them where some result judged its task's quality (`corescale results` shows them before "contaminated")
QUALITY_SUMMARY = ["quality_task", "quality_metric", "quality_value", "quality_verdict"]
SERVER_SUMMARY = ["server_max_valid_qps", "server_p50_ms", "server_p99_ms"]  # where some result is a QPS search
MAX_VARYING = 6  # at most this many differing settings join the summary (--columns shows any)
_FILTER = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(!=|>=|<=|=|>|<)\s*(.*?)\s*$")


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


def scan(root) -> tuple[list[tuple[Path, TrialRecord]], list[tuple[Path, str]]]:
    """(run dir, record) for every readable result under root, and (path, reason) for the others."""
    found, problems = [], []
    for run_dir in iter_run_dirs(root):
        try:
            record = read_result(run_dir)
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
            frame = frame.drop_duplicates(["key", "repeat"], keep="last").reset_index(drop=True)
        frame = filter_frame(frame, where or [])
    return Table(frame, problems, unfinished)


def _finished_at(record: TrialRecord, path: Path) -> float:
    if record.finished_at is not None:
        return float(record.finished_at)
    try:
        started = time.mktime(time.strptime(record.started_at[:19], "%Y-%m-%dT%H:%M:%S"))
        return started + float(record.elapsed_s or 0)
    except (TypeError, ValueError):
        return (path / RESULT_FILE).stat().st_mtime


def config_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of a table that come from the run configs (dotted for nested keys), in table order."""
    return [c for c in frame.columns if c not in _NOT_CONFIG]


def flatten(record: TrialRecord, path: Path) -> dict:
    """One table row: run, key, status, flattened config, layout facts, key metrics, host."""
    config = record.config.to_dict()
    config["backend"] = {"name": record.config.backend.name, **record.config.backend.options()}
    row = {**_run_columns(record, path), **flatten_dict(config), **_metric_columns(record),
           **quality_columns(record)}
    row["backend"] = row.pop("backend.name")  # the column people filter on
    row["measured"] = json.dumps(record.config.key_fields(), sort_keys=True, default=str)  # what the key hashes
    row["path"] = str(path)
    return row


def normalise_value(value) -> str:
    """One spelling per value across tables: NaN/None alike, 8.0 as 8."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return "None"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _run_columns(record: TrialRecord, path: Path) -> dict:
    return {
        "run": Path(path).name,
        "key": record.trial_key,
        "repeat": record.repeat,
        "status": record.status,
        "valid": record.valid,
        "reason": record.reason,
        "started_at": record.started_at,
        "finished_at": _finished_at(record, Path(path)),
        "elapsed_s": record.elapsed_s,
    }


def _metric_columns(record: TrialRecord) -> dict:
    m = record.metrics
    latency = m.latency_s if m else None
    placed = record.placed
    env = record.environment
    batch = record.config.instance_batch_size
    server = record.server
    return {
        "server_validity": server.validity if server else None,  # scenario=server|single_stream (LoadGen)
        "server_max_valid_qps": server.max_valid_qps if server else None,
        "server_p50_ms": server.latency_ms.get("p50") if server else None,
        "server_p99_ms": server.latency_ms.get("p99") if server else None,
        "server_errors": server.errors if server else None,  # endpoint=: failed requests over every test
        "cpus_total": sum(len(inst.cpus) for inst in placed) or None,
        "cpus_per_instance": len(placed[0].cpus) if placed else None,
        "threads_per_instance": placed[0].threads if placed else None,
        "instance_batch_size": batch,
        "batch_total": batch * len(placed) if placed else None,
        "throughput_samples_per_s": m.throughput_samples_per_s if m else None,
        "throughput_tokens_per_s": m.throughput_tokens_per_s if m else None,
        "latency_mean_ms": ms(latency.mean) if latency else None,
        "latency_p50_ms": ms(latency.p50) if latency else None,
        "latency_p90_ms": ms(latency.p90) if latency else None,
        "latency_p99_ms": ms(latency.p99) if latency else None,
        "latency_cv": latency.cv if latency else None,
        "max_instance_p50_ms": ms(m.max_instance_p50_s) if m else None,
        "gflops_per_s": m.gflops_per_s if m else None,
        "percent_of_peak": m.percent_of_peak if m else None,
        **_roofline_columns(m.roofline if m else None),
        "peak_rss_mib": m.peak_rss_bytes / 2**20 if m else None,
        "cpu_utilisation": m.cpu_utilisation if m else None,
        "foreign_load": m.foreign_load if m else None,
        "contaminated": m.contaminated if m else None,
        **_shared_host_columns(record),
        "window_s": m.window_s if m else None,
        "samples_in_window": m.samples_in_window if m else None,
        "load_s": m.load_seconds if m else None,
        "host": env.hostname,
        "node_type": (record.node or {}).get("node_type"),  # Ray sweeps: the machine kind
        "cpu_model": env.cpu.model,
        "cpu_isa": " ".join(sorted(catalog_isa(env.cpu.isa))) or None,  # in the machine catalog's ISA names
        "host_physical_cores": env.topology.physical_cores,
        "host_logical_cpus": env.topology.logical_cpus,
        "schema_migrated_from": record.schema_migrated_from,
    }


def _shared_host_columns(record: TrialRecord) -> dict:
    """Steal over the window and the speed sentinel's range and verdict (None: a record before 0.4, or no
    reading)."""
    found = record.contamination
    span = found.sentinel_range if found else None
    return {"steal_fraction": found.steal_fraction if found else None,
            "sentinel_low": span[0] if span else None, "sentinel_high": span[1] if span else None,
            "sentinel_moved": found.sentinel_moved if found and found.sentinel else None,
            "sentinel_at": found.sentinel[-1].at if found and found.sentinel else None}


def quality_columns(record: TrialRecord) -> dict:
    """The task's quality (record.quality): its task, the gate's first metric and its value, the verdict (passed,
    or withheld: the configuration keeps its figures and is never recommended), the reference, and every metric
    as `quality_<metric>`; None where the result has none (task=encode, or a result from before tasks)."""
    quality = record.quality
    if quality is None:
        return dict.fromkeys(QUALITY_COLUMNS)
    first = quality.gate[0].split(">")[0].split("<")[0] if quality.gate else next(iter(quality.metrics), None)
    verdict = None if quality.passed is None else "passed" if quality.passed else "withheld"
    return {"quality_task": quality.task, "quality_metric": first, "quality_value": quality.metrics.get(first or ""),
            "quality_verdict": verdict, "quality_gate": ", ".join(quality.gate) or None,
            "quality_reference": quality.reference, **{f"quality_{k}": v for k, v in quality.metrics.items()},
            **evaluation_columns(quality.evaluation)}


def evaluation_columns(evaluation: dict | None) -> dict:
    """quality.eval's metrics as `quality_eval_<metric>`, fp32's on the same data as `quality_fp32_eval_<metric>`
    (the report's quality table shows both)."""
    if not evaluation:
        return {}
    return {**{f"quality_eval_{k}": v for k, v in evaluation["measured"].items()},
            **{f"quality_fp32_eval_{k}": v for k, v in (evaluation.get("reference") or {}).items()}}


def summary_columns(frame: pd.DataFrame) -> list[str]:
    """SUMMARY_COLUMNS, with the measured settings whose values differ between the rows (a sweep's axes) before the
    figures, the server scenario's max QPS and its latencies where some result searched it, and the quality
    columns where some result has a quality verdict."""
    columns = list(SUMMARY_COLUMNS)
    if frame.empty:
        return columns
    measured = [set(json.loads(text)) for text in frame["measured"]]  # what each row's key holds

    def differs(column: str) -> bool:  # among the rows whose measurement it is part of
        rows = [column in names for names in measured]
        return frame.loc[rows, column].map(normalise_value).nunique() > 1

    varying = [c for c in config_columns(frame) if c not in columns and differs(c)]
    at = columns.index("latency_p50_ms")
    columns[at:at] = varying[:MAX_VARYING]
    extra = []
    if frame["server_max_valid_qps"].notna().any():
        extra += SERVER_SUMMARY
    if "quality_task" in frame.columns and frame["quality_task"].notna().any():
        extra += QUALITY_SUMMARY
    at = columns.index("contaminated")
    return [*columns[:at], *extra, *columns[at:]]


def _quality_names() -> list[str]:
    from corescale.workload.tasks import TASKS

    return [*QUALITY_SUMMARY, "quality_gate", "quality_reference",
            *dict.fromkeys(f"quality_{m}" for task in TASKS.values() for m in task.directions)]


QUALITY_COLUMNS = _quality_names()


ROOFLINE_COLUMNS = {"roofline_intensity": "intensity_flops_per_byte", "roofline_bytes_per_call": "bytes_per_call",
                    "roofline_attainable_gflops": "attainable_gflops", "roofline_fraction": "fraction_of_attainable",
                    "roofline_bound": "bound",
                    "roof_peak_gflops": "peak_gflops", "roof_peak_library": "peak_library",
                    "roof_bandwidth_gbps": "bandwidth_gbps", "roof_bandwidth_library": "bandwidth_library"}


def _roofline_columns(roofline) -> dict:
    """The run's roofline position (RunMetrics.roofline) as columns; None where a roof was not measured."""
    return {column: getattr(roofline, name) if roofline else None for column, name in ROOFLINE_COLUMNS.items()}


def _not_config() -> set[str]:
    """The column names flatten() adds around the config (from a minimal record; only the names are used)."""
    from corescale.config import BenchmarkConfig

    minimal = TrialRecord(BenchmarkConfig(), "", "", {}, {"instances": [{"id": 0, "cpus": [0], "threads": 1}]},
                          HostEnvironment(), "", finished_at=0)
    return {*_run_columns(minimal, Path("run")), *_metric_columns(minimal), *QUALITY_COLUMNS, "measured", "path"}


_NOT_CONFIG = _not_config()


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


def describe_value(value) -> str:
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
