"""Benchmark configuration: dataclasses that are both the Hydra structured config and the Python API."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, List, Optional

from corescale.errors import UserError

SCHEMA_NAME = "corescale"
PRECISIONS = ("fp32", "bf16", "int8")
ALLOCATORS = ("default", "jemalloc", "tcmalloc")
OPENMP_RUNTIMES = ("default", "gnu", "intel")
LAYOUTS = ("none", "latency", "throughput", "max")
ORT_GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
ORT_EXECUTION_MODES = ("sequential", "parallel")
OV_PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")


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


EXECUTORS = {"local": ExecutorConfig, "ray": RayExecutorConfig}


@dataclass
class BenchmarkConfig:
    model: str = "bert-base"
    backend: str = "pytorch"
    precision: str = "fp32"
    batch_size: int = 1
    sequence_length: int = 128
    padding_fraction: float = 0.0
    threads: Optional[int] = None  # intra-op threads per instance; None = the instance's cores
    interop_threads: int = 1
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    duration: float = 10.0
    min_iterations: int = 10
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
    calibrate: bool = True  # measure SGEMM GFLOP/s on the instance cores
    # backend options
    reference: Optional[str] = None  # run this backend on the same inputs and compare outputs
    compile_mode: str = "default"  # torch.compile mode
    ort_graph_optimization_level: str = "all"
    ort_execution_mode: str = "sequential"
    ort_fusion: bool = False
    ov_performance_hint: str = "LATENCY"
    cache_dir: str = "~/.cache/corescale"
    drift_tolerance: Optional[float] = None  # max_rel_error allowed vs the reference; None = the precision's
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchmarkConfig":
        data = dict(data)
        data["warmup"] = WarmupConfig(**data.get("warmup", {}))
        data["executor"] = executor_from_dict(data.get("executor") or {})
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def key(self) -> str:
        """Stable hash of everything that changes what is measured (not where it is written)."""
        data = self.to_dict()
        data.pop("output_dir")
        executor = data.pop("executor")  # where the cluster is does not matter; which machine kind does
        if executor.get("node_type"):
            data["node_type"] = executor["node_type"]
        blob = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


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
    from corescale.backends import BACKENDS

    _one_of("backend", cfg.backend, sorted(BACKENDS))
    if cfg.reference is not None:
        _one_of("reference backend", cfg.reference, sorted(BACKENDS))
    _one_of("precision", cfg.precision, PRECISIONS)
    _one_of("allocator", cfg.allocator, ALLOCATORS)
    _one_of("openmp", cfg.openmp, OPENMP_RUNTIMES)
    _one_of("layout", cfg.layout, LAYOUTS)
    _validate_executor(cfg.executor)
    _one_of("ort_graph_optimization_level", cfg.ort_graph_optimization_level, ORT_GRAPH_OPTIMIZATION_LEVELS)
    _one_of("ort_execution_mode", cfg.ort_execution_mode, ORT_EXECUTION_MODES)
    _one_of("ov_performance_hint", cfg.ov_performance_hint, OV_PERFORMANCE_HINTS)
    for name in ("batch_size", "sequence_length", "duration", "min_iterations", "instances", "timeout"):
        _positive(name, getattr(cfg, name))
    for name in ("threads", "cores_per_instance", "total_batch_size", "drift_tolerance"):
        if getattr(cfg, name) is not None:
            _positive(name, getattr(cfg, name))
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
    if cfg.total_batch_size is not None and cfg.total_batch_size % cfg.instances:
        raise UserError(
            f"total_batch_size={cfg.total_batch_size} does not split evenly over instances={cfg.instances}; "
            "choose a multiple of the instance count"
        )
    return cfg


def _validate_executor(executor: ExecutorConfig) -> None:
    _one_of("executor", executor.name, EXECUTORS)
    if isinstance(executor, RayExecutorConfig):
        if executor.max_retries < 0:
            raise UserError(f"executor.max_retries must be >= 0 (got {executor.max_retries})")
        if executor.node_type is not None and not str(executor.node_type).strip():
            raise UserError("executor.node_type must not be empty (omit it to use every corescale node)")


@dataclass
class _HydraSchema(BenchmarkConfig):
    """The composed schema: BenchmarkConfig plus the defaults list that selects the executor group."""

    defaults: List[Any] = field(default_factory=lambda: ["_self_", {"executor": "local"}])


def register_hydra_schema() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=_HydraSchema)
    for name, node in EXECUTORS.items():
        store.store(group="executor", name=name, node=node)
