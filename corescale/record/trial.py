"""The typed result of one trial: `TrialRecord` (+ `RunMetrics`, `InstanceMetrics`, `Failure`), its JSON form
and the migrations that read every older schema.

JSON is the record's dataclass fields as they are, plus `schema_version` and a derived `reason` line for people
reading the file. Schema 3 types every section (record/sections.py; the JSON shape is schema 2's, every value
checked on reading: a malformed one is a UserError naming where). Records written by corescale 0.1 (schema 1)
are migrated on load: backend options move into the `backend` group, failures become a `Failure`, keys are
recomputed under today's definition and the old ones kept in `legacy_keys`, so resume and latest-per-key still
find them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corescale.config import BenchmarkConfig, migrate_config_v1
from corescale.errors import UserError
from corescale.machine.placement import InstancePlacement, InstanceSpec
from corescale.record.sections import (
    Contamination,
    Drift,
    HostEnvironment,
    InstanceReport,
    LatencySummary,
    Quality,
    ServerSummary,
)
from corescale.typed import Section, plain

SCHEMA_VERSION = 3
READS = (1, 2, 3)  # schema 2 -> 3: the same JSON, now typed
FAILURE_KINDS = ("user", "crash", "timeout", "signal", "error", "drift", "quality", "interrupted")


@dataclass(frozen=True)
class Failure:
    """Why a trial did not give a valid measurement; made once where it happens, never parsed back."""

    kind: str  # one of FAILURE_KINDS
    message: str
    instance: int | None = None  # the instance at fault, None when the trial failed as a whole
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str = ""
    traceback: str | None = None

    @property
    def reason(self) -> str:
        """The one line shown to people."""
        prefix = {"user": "bad input: "}.get(self.kind, "")
        where = f"instance {self.instance}: " if self.instance is not None and self.kind != "user" else ""
        return f"{prefix}{where}{self.message}"

    @classmethod
    def from_exception(cls, exc: BaseException) -> Failure:
        """A UserError keeps its one line; anything else keeps its type and traceback."""
        if isinstance(exc, UserError):
            return cls("user", str(exc))
        return cls("error", f"{type(exc).__name__}: {exc}", traceback="".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Failure:
        return cls(**{k: v for k, v in data.items() if k in _names(cls)})


@dataclass
class InstanceMetrics:
    id: int
    cpus: list[int]
    threads: int
    batch_size: int
    start_skew_ms: float  # how late the instance's first timed call began after the common start
    latency_s: LatencySummary
    samples_in_window: float
    throughput_samples_per_s: float
    throughput_tokens_per_s: float
    cpu_utilisation: float
    foreign_load: float
    contaminated: bool
    peak_rss_bytes: int
    peak_gflops: float | None  # the best measured GEMM on its CPUs and threads (machine/peak.py)
    load_seconds: float
    stage_seconds: dict[str, float]
    warmup_iterations: int
    warmup_converged: bool
    peak_library: str | None = None
    calls_outside_window: int = 0  # timed calls that straddle the window's edges (not in the latency figures)
    rss_bytes: int | None = None  # resident memory at the end of the window (the measured backend only)


@dataclass
class Roofline:
    """A run's position on the roofline (machine/roofline.py): achieved ÷ attainable and the roof that binds."""

    intensity_flops_per_byte: float  # FLOPs per byte of the call's minimum memory traffic
    bytes_per_call: float
    peak_gflops: float  # the compute roof: best measured GEMM (summed over instances)
    peak_library: str | None
    bandwidth_gbps: float  # the memory roof: the triad (summed over instances)
    bandwidth_library: str | None
    ridge_flops_per_byte: float  # where the roofs meet
    attainable_gflops: float  # min(peak, intensity x bandwidth)
    bound: str  # "compute" or "memory": the roof that binds at this intensity
    achieved_gflops: float
    fraction_of_attainable: float


@dataclass
class RunMetrics:
    window_s: float
    window_start_ns: int
    window_end_ns: int
    max_start_skew_ms: float
    samples_in_window: float
    throughput_samples_per_s: float
    throughput_tokens_per_s: float
    latency_s: LatencySummary  # pooled over instances
    max_instance_p50_s: float
    gflops_per_s: float | None  # None: the model's FLOPs are unknown (a model file without config.json)
    peak_gflops: float | None  # sum over instances of the best measured GEMM on their CPUs (the yardstick)
    percent_of_peak: float | None  # None when there is no peak, or when it would exceed 100 (see peak_problem)
    flops_per_sample: float | None  # None: unknown, as gflops_per_s
    peak_rss_bytes: int
    cpu_utilisation: float
    foreign_load: float
    contaminated: bool
    contaminated_instances: list[int]
    load_seconds: float
    per_instance: list[InstanceMetrics]  # schema <= 2 stored it as `instances`
    peak_library: str | None = None  # which GEMM implementation set the peak ("a+b" when instances differ)
    peak_precision: str | None = None  # the precision of that GEMM (fp32 for bf16/int8 on CPUs without them)
    peak_problem: str | None = None  # why percent_of_peak is not given although a peak is known
    calls_outside_window: int = 0
    padded_tokens_per_s: float | None = None  # tokens/s including padding (throughput_tokens_per_s: real ones)
    warmup_converged: bool = True  # every instance's warm-up reached a stable latency
    roofline: Roofline | None = None  # None: a roof was not measured (calibrate=false), or an older record

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunMetrics:
        data = _known(cls, _renamed(_renamed_v1(data, "sgemm_peak_gflops"), "instances", "per_instance"))
        data["latency_s"] = LatencySummary.from_dict(data.get("latency_s"), "metrics.latency_s")
        data["per_instance"] = [_instance_metrics(_renamed_v1(inst, "sgemm_gflops"), f"metrics.per_instance[{i}]")
                                for i, inst in enumerate(data.get("per_instance", []))]
        if data.get("roofline"):
            data["roofline"] = Roofline(**_known(Roofline, data["roofline"]))
        return cls(**data)


@dataclass
class Partial:
    """What a failed trial still measured: finished instances' metrics, flagged invalid."""

    states: dict[str, dict[str, Any]]  # per instance: state, calls done and pid when the trial ended
    finished_instances: list[int]
    metrics: RunMetrics | None = None
    streamed_calls: dict[str, int] = field(default_factory=dict)  # timed calls kept of instances that died


@dataclass
class TrialRecord:
    config: BenchmarkConfig
    key: str  # config.key(): the measured fields
    trial_key: str  # config key + model identity (+ a local model's files): what resume looks up
    model: dict[str, Any]  # ModelSpec.identity()
    plan: dict[str, Any]  # Plan.to_dict()
    environment: HostEnvironment
    started_at: str
    status: str = "ok"  # ok | failed
    valid: bool = True  # False: the figures (if any) must not be trusted or compared
    failure: Failure | None = None
    metrics: RunMetrics | None = None
    partial: Partial | None = None
    drift: Drift | None = None
    quality: Quality | None = None  # the task's outputs on real text vs the fp32 reference, and the gate's verdict
    instance_reports: list[InstanceReport] = field(default_factory=list)  # each worker's own (schema <= 2: `instances`)
    specs: list[InstanceSpec] = field(default_factory=list)  # each instance as it ran
    elapsed_s: float | None = None
    finished_at: float | None = None  # epoch seconds, stamped by the trial loop
    lock_wait_s: float | None = None
    node: dict[str, Any] | None = None  # Ray: where it ran
    executor: dict[str, Any] | None = None
    legacy_keys: list[str] = field(default_factory=list)  # keys this trial had under older key definitions
    repeat: int = 0  # which of the config's `repeats` (fresh processes each) this record is
    repeats: int = 1
    schema_migrated_from: int | None = None
    server: ServerSummary | None = None  # scenario=server|single_stream: LoadGen's verdicts, steps, load curve
    workload: dict[str, Any] | None = None  # a query set's lengths, padding policy and padding waste
    contamination: Contamination | None = None  # steal and the speed sentinel (None: records before 0.4)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def valid_ok(self) -> bool:
        return self.status == "ok" and self.valid

    @property
    def reason(self) -> str | None:
        return self.failure.reason if self.failure else None

    def fail(self, failure: Failure, valid: bool = False) -> TrialRecord:
        self.status, self.failure, self.valid = "failed", failure, valid
        return self

    @property
    def placed(self) -> list[InstanceSpec]:
        """Per instance: its CPUs and the threads it really ran (the override applied); a record without specs
        (a failed or schema-1 one) gives its plan's instances."""
        if self.specs:
            return self.specs
        return [_planned_spec(inst, self.config.instance_batch_size, f"plan.instances[{i}]")
                for i, inst in enumerate(self.plan.get("instances") or [])]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = value.to_dict() if isinstance(value, BenchmarkConfig) else _plain(value)
        data["reason"] = self.reason
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        """Any schema this version knows; newer ones are refused (ValueError)."""
        version = data.get("schema_version")
        if version == 1:
            data = migrate_v1(data)
        elif version not in READS:
            raise ValueError(f"schema_version {version!r} (this corescale reads {', '.join(map(str, READS))})")
        data = _known(cls, _renamed(data, "instances", "instance_reports"))
        data["config"] = BenchmarkConfig.from_dict(data["config"])
        data["environment"] = HostEnvironment.from_dict(data.get("environment") or {}, "environment")
        if data.get("drift") is not None:
            data["drift"] = Drift.from_dict(data["drift"], "drift")
        if data.get("quality") is not None:
            data["quality"] = Quality.from_dict(data["quality"], "quality")
        if data.get("server") is not None:
            data["server"] = ServerSummary.from_dict(data["server"], "server")
        if data.get("contamination") is not None:
            data["contamination"] = Contamination.from_dict(data["contamination"], "contamination")
        data["instance_reports"] = [InstanceReport.from_dict(r, f"instance_reports[{i}]") for i, r in
                                    enumerate(_list(data.get("instance_reports"), "instance_reports"))]
        data["specs"] = [_spec(s, f"specs[{i}]") for i, s in enumerate(_list(data.get("specs"), "specs"))]
        if data.get("failure"):
            data["failure"] = Failure.from_json(data["failure"])
        if data.get("metrics"):
            data["metrics"] = RunMetrics.from_json(data["metrics"])
        if data.get("partial"):
            partial = dict(data["partial"])
            partial["metrics"] = RunMetrics.from_json(partial["metrics"]) if partial.get("metrics") else None
            data["partial"] = Partial(**_known(Partial, partial))
        return cls(**data)


# --- keys ------------------------------------------------------------------------------------------------------

def model_files(path: str | None) -> list | None:
    """Names, sizes and mtimes of a local model directory's files: a changed weight file changes the key."""
    if not path or not Path(path).is_dir():
        return None
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(Path(path).iterdir())
            if p.is_file() and not p.name.startswith(".")]


def trial_key(config_key: str, model_identity: dict, files: list | None = None) -> str:
    """Resume key: the config key plus the model identity (and a local model's file listing)."""
    blob = json.dumps({"config": config_key, "model": model_identity, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def measuring_libraries() -> tuple[str, ...]:
    """The libraries whose versions enter the fingerprint: numpy (the inputs) and every registered backend's.
    A backend that brings a new library changes every fingerprint once (resume then measures again)."""
    from corescale.backends import BACKENDS

    return tuple(dict.fromkeys(["numpy", *(n for e in BACKENDS.values() for n in e.libraries)]))


def machine_fingerprint(environment: HostEnvironment) -> str:
    """Which machine and software a result was measured on: CPU model and ISA, core counts, the frameworks'
    versions, and the inherited environment that changes what runs (LD_PRELOAD, allocator, OpenMP and
    framework variables: machine/environment.measuring_variables). Resume counts only results with this
    machine's fingerprint (unless asked to accept any)."""
    from corescale.machine.environment import measuring_variables

    cpu, topology = environment.cpu, environment.topology
    identity: dict[str, Any] = {
        "cpu": cpu.model, "isa": cpu.isa or None, "cores": [topology.physical_cores, topology.logical_cpus],
        "libraries": {name: environment.libraries.get(name) for name in measuring_libraries()}}
    variables = measuring_variables(environment.env)
    if variables:  # none set: the fingerprint of every earlier result measured that way stays what it was
        identity["env"] = variables
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def spec_key(cfg: BenchmarkConfig, spec) -> str:
    """The trial key of a config and a resolved ModelSpec."""
    local = spec.source in ("local", "packaged")
    if spec.source == "file":  # the file and what is beside it (its weights, config.json): names, sizes, mtimes
        from corescale.workload.models import source_files

        listed = source_files(spec) or []
        return trial_key(cfg.key(), spec.identity(), [[name, size, mtime] for name, _, size, mtime in listed])
    return trial_key(cfg.key(), spec.identity(), model_files(spec.path) if local else None)


# --- migrations -------------------------------------------------------------------------------------------------

def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """0.1.0's dict record -> schema 2 fields."""
    data = dict(data)
    old_key = data.get("trial_key") or trial_key(data.get("key", ""), data.get("model") or {})
    config = BenchmarkConfig.from_dict(migrate_config_v1(data["config"]))
    data["config"] = config.to_dict()
    data["key"] = config.key()
    data["trial_key"] = trial_key(data["key"], data.get("model") or {})
    data["legacy_keys"] = [old_key]
    data["failure"] = _failure_v1(data)
    partial = data.get("partial")
    if partial is not None:
        data["partial"] = {"states": partial.get("states") or {}, "finished_instances":
                           partial.get("finished_instances") or [], "metrics": partial.get("metrics")}
    data["schema_migrated_from"] = 1
    return data


def _failure_v1(data: dict[str, Any]) -> dict[str, Any] | None:
    if data.get("status") == "ok":
        return None
    old = data.get("failure") or {}
    reason = data.get("reason") or old.get("reason") or "failed"
    if old.get("user_error") or data.get("user_error"):
        kind = "user"
    elif old.get("signal"):
        kind = "signal"
    elif "timed out" in reason:
        kind = "timeout"
    elif data.get("drift") and not data["drift"].get("within_tolerance", True):
        kind = "drift"
    elif old:
        kind = "crash"
    else:
        kind = "error"
    message = old.get("message") or reason.removeprefix("bad input: ")
    if old.get("instance") is not None and message.startswith(f"instance {old['instance']}"):
        message = message[len(f"instance {old['instance']}"):].lstrip(": ")
    return {"kind": kind, "message": message, "instance": old.get("instance"), "exit_code": old.get("exit_code"),
            "signal": old.get("signal"), "stderr_tail": old.get("stderr_tail") or "",
            "traceback": old.get("traceback") or data.get("traceback")}


# --- helpers ----------------------------------------------------------------------------------------------------

def _renamed_v1(data: dict[str, Any], old: str) -> dict[str, Any]:
    """0.1 called the peak `sgemm_*`: a 1024² torch.mm, whatever library that ran on."""
    if old not in data:
        return data
    data = {**data, "peak_gflops": data[old]}
    data.setdefault("peak_library", "torch_mm" if data[old] else None)
    return data


def _renamed(data: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """A field stored under its schema-2 name is read under its schema-3 one."""
    if old not in data or new in data:
        return data
    return {**{k: v for k, v in data.items() if k != old}, new: data[old]}


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _known(cls, data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in _names(cls)}


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, InstanceSpec):
        return value.to_json()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    return value


def _list(value: Any, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UserError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _instance_metrics(data: Any, where: str) -> InstanceMetrics:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected an object, got {type(data).__name__}")
    known = _known(InstanceMetrics, data)
    known["latency_s"] = LatencySummary.from_dict(data.get("latency_s"), f"{where}.latency_s")
    return InstanceMetrics(**known)


def _spec(data: Any, where: str) -> InstanceSpec:
    """An InstanceSpec from its JSON (InstanceSpec.to_json), checked."""
    ran = _SpecJson.from_dict(data, where)
    return dataclasses.replace(_planned_spec(data, ran.batch_size, where), samples_path=ran.samples_path,
                               peak=ran.peak)


def _planned_spec(data: Any, batch_size: int, where: str) -> InstanceSpec:
    """A plan's instance (Placement.to_dict: id, cpus, numa_nodes, threads) as the spec it ran as."""
    placed = _PlacedJson.from_dict(data, where)
    cpus = tuple(placed.cpus)
    return InstanceSpec(InstancePlacement(placed.id, cpus, tuple(placed.numa_nodes), len(cpus)), placed.threads,
                        batch_size)


@dataclass(frozen=True)
class _PlacedJson(Section):
    id: int
    cpus: list[int]
    threads: int
    numa_nodes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _SpecJson(Section):
    batch_size: int
    samples_path: str = ""
    peak: dict[str, Any] | None = None
