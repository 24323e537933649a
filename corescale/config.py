"""Benchmark configuration: dataclasses that are both the Hydra structured config and the Python API."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from corescale.backends import BACKENDS, DEFAULT_BACKEND, OPTIONS, BackendOptions, named
from corescale.bounds import LOAD_MARGIN_S, check_bounded
from corescale.config_server import LATER_SERVER_FIELDS, UNMEASURED_SERVER_FIELDS, ServerConfig, validate_server
from corescale.errors import UserError
from corescale.http_keys import default_api, validate_endpoint
from corescale.machine.placement import LAYOUTS as NAMED_LAYOUTS
from corescale.machine.precisions import PRECISIONS, REFERENCE
from corescale.userfiles import default_cache_dir, require_path, sentinel_default
from corescale.workload.tasks import TASKS, check_gate_type

SCHEMA_NAME = "corescale"
ALLOCATORS = ("default", "jemalloc", "tcmalloc")
OPENMP_RUNTIMES = ("default", "gnu", "intel")
REPEAT_ORDERS = ("interleaved", "shuffled")
LAYOUTS = ("none", *NAMED_LAYOUTS)  # none: instances and cores_per_instance as given
SCENARIOS = ("offline", "single_stream", "server")  # offline: closed loop; the others: MLPerf LoadGen drives load
PAD_POLICIES = ("max", "bucket", "sorted")
STUDY_KINDS = ("cores", "instances", "batch")  # corescale study KIND
# 0.1's flat backend options -> (backend, option in its group), as each backend's options declare them
RENAMED_OPTIONS = {old: (name, option) for name, cls in OPTIONS.items() for old, option in cls.RENAMED.items()}
# What changes a measurement, besides the backend and its options: key() hashes these and compare matches on them.
# Not paths, caches, timeouts or where a trial is dispatched.
MEASURED_FIELDS = (
    "model", "trust_remote_code", "precision", "batch_size", "sequence_length", "padding_fraction", "threads",
    "interop_threads", "warmup", "duration", "min_iterations", "seed", "instances", "cores_per_instance",
    "total_batch_size", "layout", "use_logical_cores", "allocator", "openmp", "calibrate", "reference",
    "drift_tolerance",
)
KEY_VERSION = 2  # bump when a default changes what is measured


@dataclass
class WarmupConfig:
    """Warm up until the rolling median of the last `window` latencies moves less than `tolerance`."""

    min_iterations: int = 3
    max_iterations: int = 50
    window: int = 3
    tolerance: float = 0.05
    max_seconds: float = 60.0


@dataclass
class ExecutorConfig:
    """Where trials run. The base class is `executor=local`: one trial at a time on this machine."""

    name: str = "local"


@dataclass
class RayExecutorConfig(ExecutorConfig):
    """`executor=ray`: one trial per Ray node that declares the `corescale_node` resource (see docs/ray.md)."""

    name: str = "ray"
    address: Optional[str] = None  # HOST:PORT of a running cluster, "auto", or None = start a private local Ray
    node_type: Optional[str] = None  # only nodes with resource `corescale_type:<node_type>`
    max_retries: int = 2  # re-runs of a trial whose Ray worker or node died


EXECUTORS: dict[str, type[ExecutorConfig]] = {"local": ExecutorConfig, "ray": RayExecutorConfig}


@dataclass
class WorkloadConfig:
    """What the queries hold: random ids of sequence_length (default), a length distribution or real text."""

    source: Optional[str] = None  # file.txt | file.jsonl:FIELD | file.csv:COLUMN (`workload=PATH` for short)
    tokenizer: Optional[str] = None  # local dir or hub id (cached); default: the model's own when it has one
    lengths: Optional[str] = None  # 'uniform(A,B)' or a histogram file of `length,count` lines
    samples: int = 1024  # distinct queries drawn (seeded); texts beyond this are not used


@dataclass
class CostConfig:
    """What this machine costs, for the cost on every answer (docs/cost.md); not part of what is measured."""

    price_per_hour: Optional[float] = None  # US$/h of this machine; None: its catalog kind, or a core-hour rate
    machine: Optional[str] = None  # the catalog kind this machine is (refused when its CPU does not match)
    catalog: Optional[str] = None  # a YAML machine catalog instead of the packaged one


@dataclass
class BenchmarkConfig:
    model: str = "bert-base"
    # `backend=NAME backend.OPTION=VALUE`; the field holds the base type so Hydra can merge any backend's node
    backend: BackendOptions = field(default_factory=BackendOptions)
    precision: str = REFERENCE
    batch_size: int = 1
    sequence_length: int = 128
    padding_fraction: float = 0.0
    threads: Optional[int] = None  # intra-op threads per instance; None = the instance's cores
    interop_threads: int = 1
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    duration: float = 10.0
    min_iterations: int = 10
    # repeats in fresh processes: the unit of uncertainty (a sweep interleaves them: A B C A B C ...)
    repeats: int = 1
    repeat_order: str = "interleaved"  # or "shuffled": each round in a seeded random order (seed)
    seed: int = 0
    output_dir: str = "outputs"
    # model loading
    trust_remote_code: bool = False
    allow_pickle: bool = False
    # placement (one instance per process, each pinned to its own cores)
    instances: int = 1
    cores_per_instance: Optional[int] = None
    total_batch_size: Optional[int] = None  # split one batch across instances
    layout: str = "none"
    use_logical_cores: bool = False
    allocator: str = "default"
    openmp: str = "default"
    # worker supervision
    timeout: float = 600.0  # seconds an instance may take in all before it is killed
    sentinel: bool = field(default_factory=sentinel_default)  # the speed sentinel around each trial (sentinel.py)
    calibrate: bool = True  # measure the GEMM peak (best library) and the triad bandwidth on the instance cores
    # output checks and caches
    reference: Optional[str] = None  # a backend (drift vs its outputs), or the fp32 model DIR a model file came from
    cache_dir: str = field(default_factory=default_cache_dir)  # $CORESCALE_CACHE_DIR or ~/.cache/corescale
    # a folder for compiled models (OpenVINO's), reused by later loads with the same settings on the same CPU kind;
    # None = compile at every load (`corescale serve` keeps them in the user's cache: serve/opened.py)
    compiled_cache: Optional[str] = None
    drift_tolerance: Optional[float] = None  # max_rel_error allowed vs the reference; None = the precision's
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    # scenario and workload (docs/scenarios.md)
    scenario: str = "offline"
    target_qps: Any = None  # a number, or "auto": the highest QPS whose p99 meets slo_p99_ms
    slo_p99_ms: Optional[float] = None
    # scenario=server over HTTP: a running server is measured, no local instance is started (docs/scenarios.md)
    endpoint: Optional[str] = None  # http://HOST:PORT of the server
    api: Optional[str] = None  # openai (POST /v1/embeddings, the default) | tei (POST /embed)
    request_timeout: float = 60.0  # seconds one request may take before it counts as an error
    server: ServerConfig = field(default_factory=ServerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    pad: str = "max"  # max: to the batch's longest | bucket: to a length bucket | sorted: length-sorted batches
    # the task and its quality (docs/tasks.md)
    task: Optional[str] = None  # embed | rerank | classify | encode; None = what the model's directory declares
    pooling: Optional[str] = None  # cls|mean|max|last: a head on token states (workload/heads.py; a file, a dir)
    normalize: Optional[bool] = None  # that head L2-normalises (None: yes)
    tokenize: bool = False  # the model's fast tokenizer inside the timed call (end to end; needs text queries)
    # the quality gate: "cosine_p1:0.995", "cosine_p1>=0.99,recall_at_10>=0.95" or {cosine_p1:0.99,...} (a bound's
    # direction is its metric's); None = the task's defaults (workload/quality.py)
    min_quality: Any = None
    quality_samples: int = 256  # real texts (rerank: queries) the quality check runs on
    quality_eval: Optional[str] = None  # `quality.eval=FILE`: the user's evaluation data (workload/evaluation.py)
    cost: CostConfig = field(default_factory=CostConfig)

    def __post_init__(self) -> None:
        if isinstance(self.backend, str):  # Python API: BenchmarkConfig(backend="openvino")
            self.backend = backend_from_dict({"name": self.backend})
        elif type(self.backend) is BackendOptions:  # the schema's placeholder -> the named backend's options
            self.backend = backend_from_dict({"name": self.backend.name})

    @property
    def reference_backend(self) -> Optional[str]:  # reference= naming a backend (else a model: workload/models.py)
        return self.reference if self.reference in OPTIONS else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchmarkConfig":
        data = migrate_config_v1(data)
        data["warmup"] = WarmupConfig(**data.get("warmup", {}))
        data["executor"] = executor_from_dict(data.get("executor") or {})
        data["backend"] = backend_from_dict(data.get("backend") or {})
        data["server"] = ServerConfig(**data.get("server") or {})
        data["workload"] = WorkloadConfig(**data.get("workload") or {})
        data["cost"] = CostConfig(**data.get("cost") or {})
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def results_root(self) -> Path:
        return Path(os.path.expanduser(self.output_dir))

    @property
    def http_api(self) -> str:  # the API an endpoint is driven through (api=, else the endpoint's default)
        return self.api or default_api(self.endpoint)

    @property
    def instance_batch_size(self) -> int:
        """Samples per forward call of one instance (a total batch is split evenly over the instances)."""
        return self.total_batch_size // self.instances if self.total_batch_size else self.batch_size

    def key_fields(self) -> dict[str, Any]:
        """The fields that change what is measured, flat with dotted names (what key() hashes and compare
        matches on): MEASURED_FIELDS, the backend and the options it was given other than their defaults, and
        the executor's machine kind (where the cluster is does not matter; which kind of node does)."""
        data = self.to_dict()
        flat = flatten({name: data[name] for name in MEASURED_FIELDS})
        flat["backend.name"] = self.backend.name
        flat.update({f"backend.{k}": v for k, v in self.backend.changed().items()})
        node_type = getattr(self.executor, "node_type", None)
        if node_type:
            flat["executor.node_type"] = node_type
        flat.update(scenario_key_fields(self))
        flat.update(task_key_fields(self))
        return flat

    def key(self) -> str:
        """Stable hash of what is measured (see key_fields())."""
        blob = json.dumps({"key_version": KEY_VERSION, **self.key_fields()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


KEYED = object()  # equal to no value: a field that is not a later one is always in the key


def scenario_key_fields(cfg: BenchmarkConfig) -> dict[str, Any]:
    """The scenario's and workload's fields, only where they differ from the closed loop on random ids (so the
    keys of every earlier result stay what they were)."""
    flat: dict[str, Any] = {}
    if cfg.scenario != "offline":
        flat.update(scenario=cfg.scenario, target_qps=cfg.target_qps, slo_p99_ms=cfg.slo_p99_ms)
        server = {k: v for k, v in dataclasses.asdict(cfg.server).items() if k not in UNMEASURED_SERVER_FIELDS
                  and LATER_SERVER_FIELDS.get(k, KEYED) != v}  # a later field only off its default
        flat.update(flatten({"server": server}))
    if cfg.endpoint:
        flat.update(endpoint=cfg.endpoint, api=cfg.http_api)
    if cfg.workload != WorkloadConfig() or cfg.pad != "max":
        flat.update(flatten({"workload": dataclasses.asdict(cfg.workload)}), pad=cfg.pad)
    return flat


def task_key_fields(cfg: BenchmarkConfig) -> dict[str, Any]:
    """The task's fields, only where they differ from their defaults (the keys of earlier results hold)."""
    defaults = BenchmarkConfig.__dataclass_fields__
    return {name: getattr(cfg, name) for name in ("task", "tokenize", "min_quality", "quality_samples", "pooling",
                                                  "normalize", "quality_eval")
            if getattr(cfg, name) != defaults[name].default}


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> one level with dotted names (`warmup.window`)."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def migrate_config_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict of any version -> today's shape: 0.1 kept `backend` as a name and every backend's
    options flat beside it; they move into the backend group (other backends' options are dropped)."""
    data = dict(data)
    backend = data.get("backend")
    if isinstance(backend, str) or backend is None:
        name = backend or DEFAULT_BACKEND
        group = {"name": name}
        for old, (owner, option) in RENAMED_OPTIONS.items():
            if old in data and owner == name:
                group[option] = data[old]
        data["backend"] = group
    for old in RENAMED_OPTIONS:
        data.pop(old, None)
    return data


def backend_from_dict(data: dict[str, Any] | BackendOptions) -> BackendOptions:
    if isinstance(data, BackendOptions):
        return data
    name = data.get("name", DEFAULT_BACKEND)
    _one_of("backend", name, sorted(OPTIONS))
    cls = OPTIONS[name]
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


def executor_from_dict(data: dict[str, Any]) -> ExecutorConfig:
    name = data.get("name", "local")
    _one_of("executor", name, EXECUTORS)
    cls = EXECUTORS[name]
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


def _positive(name: str, value: float) -> None:
    if value is None or value <= 0:
        raise UserError(f"{name} must be > 0 (got {value})")


def _one_of(name: str, value: str, allowed) -> None:
    if value not in allowed:
        raise UserError(f"unknown {name} '{value}'; allowed: {', '.join(allowed)}")


def validate(cfg: BenchmarkConfig) -> BenchmarkConfig:
    """Checks that need no model or machine; model- and machine-specific checks live with those stages."""
    _check_finite(cfg)  # NaN passes every comparison below (nan <= 0 is False) and inf disables checks
    _one_of("backend", cfg.backend.name, sorted(OPTIONS))
    cfg.backend.validate()
    _one_of("precision", cfg.precision, PRECISIONS)
    _check_precision(cfg)
    cfg.backend.check(cfg)
    _one_of("allocator", cfg.allocator, ALLOCATORS)
    _one_of("openmp", cfg.openmp, OPENMP_RUNTIMES)
    if cfg.openmp != "default" and not BACKENDS[cfg.backend.name].openmp:
        raise UserError(f"openmp={cfg.openmp} applies to the backends that run on OpenMP threads "
                        f"({', '.join(named('openmp'))}); backend={cfg.backend.name} uses its own thread pool: "
                        "leave openmp at default")
    _one_of("repeat_order", cfg.repeat_order, REPEAT_ORDERS)
    _one_of("layout", cfg.layout, LAYOUTS)
    _validate_executor(cfg.executor)
    for name in ("batch_size", "sequence_length", "duration", "min_iterations", "instances", "timeout", "repeats"):
        _positive(name, getattr(cfg, name))
    for name in ("threads", "cores_per_instance", "total_batch_size", "drift_tolerance"):
        if getattr(cfg, name) is not None:
            _positive(name, getattr(cfg, name))
    if cfg.cost.price_per_hour is not None:
        _positive("cost.price_per_hour", cfg.cost.price_per_hour)
    if cfg.interop_threads < 1:
        raise UserError(f"interop_threads must be >= 1 (got {cfg.interop_threads})")
    if not 0.0 <= cfg.padding_fraction < 1.0:
        raise UserError(f"padding_fraction must be in [0, 1) (got {cfg.padding_fraction})")
    w = cfg.warmup
    if w.min_iterations < 1 or w.max_iterations < w.min_iterations or w.window < 1 or w.tolerance <= 0:
        raise UserError(
            "warmup needs 1 <= min_iterations <= max_iterations, window >= 1 and tolerance > 0 "
            f"(got {w.min_iterations}, {w.max_iterations}, {w.window}, {w.tolerance})"
        )
    if w.max_seconds <= 0:
        raise UserError(f"warmup.max_seconds must be > 0 (got {w.max_seconds})")
    if cfg.total_batch_size is not None and cfg.total_batch_size % cfg.instances:
        raise UserError(
            f"total_batch_size={cfg.total_batch_size} does not split evenly over instances={cfg.instances}; "
            "choose a multiple of the instance count"
        )
    _check_seed(cfg.seed)
    _check_timeout(cfg)
    _validate_scenario(cfg)
    _validate_task(cfg)
    check_bounded(cfg, MAX_TARGET_QPS)
    for key in PATH_KEYS:
        require_path(_get(cfg, key), key)
    return cfg


PATH_KEYS = ("model", "output_dir", "cache_dir", "compiled_cache", "workload.source", "workload.tokenizer",
             "workload.lengths")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _validate_task(cfg: BenchmarkConfig) -> None:
    if cfg.task is not None:
        _one_of("task", cfg.task, TASKS)
        backend = BACKENDS[cfg.backend.name]
        if not backend.computes(cfg.task):
            raise UserError(f"backend={cfg.backend.name} computes task {', '.join(backend.tasks())} only (got "
                            f"task={cfg.task}): its graph has no place for a head; use another backend")
    check_gate_type(cfg.min_quality)
    if isinstance(cfg.quality_samples, bool) or not isinstance(cfg.quality_samples, int) or \
            not 10 <= cfg.quality_samples <= 10_000:
        raise UserError(f"quality_samples must be a whole number in [10, 10000] (got {cfg.quality_samples})")


def _check_precision(cfg: BenchmarkConfig) -> None:
    """The precisions the backend's registry entry declares it computes in (before any worker starts)."""
    allowed = BACKENDS[cfg.backend.name].precisions
    if cfg.precision not in allowed:
        raise UserError(f"backend={cfg.backend.name} does not compute in precision={cfg.precision}; allowed "
                        f"precisions: {', '.join(allowed)}")


MAX_TARGET_QPS = 1e6


def _validate_scenario(cfg: BenchmarkConfig) -> None:
    _one_of("scenario", cfg.scenario, SCENARIOS)
    _one_of("pad", cfg.pad, PAD_POLICIES)
    qps = cfg.target_qps
    if cfg.scenario != "server" and (qps is not None or cfg.slo_p99_ms is not None):
        raise UserError(f"target_qps and slo_p99_ms apply to scenario=server (got scenario={cfg.scenario}); "
                        "add scenario=server or leave them out")
    if cfg.scenario == "server":
        if qps is None:
            raise UserError("scenario=server needs target_qps=QPS (a number > 0) or target_qps=auto "
                            "(with slo_p99_ms=MS)")
        if qps == "auto":
            if cfg.slo_p99_ms is None:
                raise UserError("target_qps=auto searches the highest QPS whose p99 meets an SLO: give "
                                "slo_p99_ms=MS (MLPerf's bound for BERT is 130)")
        elif isinstance(qps, bool) or not isinstance(qps, (int, float)) or not 0 < qps <= MAX_TARGET_QPS:
            raise UserError(f"target_qps must be a number in (0, {MAX_TARGET_QPS:g}] or auto (got {qps})")
    if cfg.slo_p99_ms is not None:
        _positive("slo_p99_ms", cfg.slo_p99_ms)
    validate_server(cfg)
    if not 1 <= cfg.workload.samples <= 1_000_000:
        raise UserError(f"workload.samples must be from 1 to 1000000 (got {cfg.workload.samples})")
    if cfg.workload.source and cfg.workload.lengths:
        raise UserError("give either workload (a text file) or workload.lengths (a length distribution), not both")
    validate_endpoint(cfg)


def _check_finite(node: Any, prefix: str = "") -> None:
    """Every float of the config and of its groups (warmup, backend, executor) is a finite number."""
    import math

    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{prefix}{f.name}={value} is not a finite number; give a real number "
                            "(nan, inf and -inf are not allowed)")


def _check_seed(seed: int) -> None:
    limit = 2**32  # numpy's and every framework's seed range in common
    if not 0 <= seed < limit:
        raise UserError(f"seed must be a whole number from 0 to {limit - 1} (got {seed})")


def _check_timeout(cfg: BenchmarkConfig) -> None:
    """The timeout covers loading, warm-up and the timed window: it must leave room for at least the window and
    the quickest load."""
    load_margin_s = LOAD_MARGIN_S
    if cfg.timeout <= cfg.duration + load_margin_s:
        raise UserError(
            f"timeout={cfg.timeout:g} s leaves no time to measure: each instance needs duration={cfg.duration:g} s "
            f"for its timed window plus loading and warm-up; allowed: timeout > {cfg.duration + load_margin_s:g} "
            f"(duration + {load_margin_s:g} s), default 600"
        )


def _validate_executor(executor: ExecutorConfig) -> None:
    _one_of("executor", executor.name, EXECUTORS)
    if isinstance(executor, RayExecutorConfig):
        if executor.max_retries < 0:
            raise UserError(f"executor.max_retries must be >= 0 (got {executor.max_retries})")
        if executor.node_type is not None and not str(executor.node_type).strip():
            raise UserError("executor.node_type must not be empty (omit it to use every corescale node)")


@dataclass
class _HydraSchema(BenchmarkConfig):
    """The composed schema: BenchmarkConfig plus the defaults list that selects the executor and backend groups."""

    defaults: List[Any] = field(default_factory=lambda: ["_self_", {"executor": "local"},
                                                                   {"backend": DEFAULT_BACKEND}])


def register_hydra_schema() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=_HydraSchema)
    for name, executor in EXECUTORS.items():
        store.store(group="executor", name=name, node=executor)
    for name, options in OPTIONS.items():
        store.store(group="backend", name=name, node=options)
