"""The typed sections of a trial record: latency summaries, the drift check, each worker's report, the host (defined
in machine/environment.py, re-exported here), and the server scenario's summary. Each is a frozen dataclass read with
`from_dict` (every value checked, typed.py) and written with `to_dict` in the same JSON shape schema 2 used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corescale.machine.environment import CpuInfo as CpuInfo  # the host's sections live with capture(), read here
from corescale.machine.environment import HostEnvironment as HostEnvironment
from corescale.machine.environment import HostTopology as HostTopology
from corescale.typed import Section
from corescale.workload.tasks import BATCH_CHANGE, DROP


@dataclass(frozen=True)
class LatencySummary(Section):
    """stats.Measurement.summary(): latencies in seconds."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    cv: float
    mad: float
    outliers: int
    p50: float
    p90: float
    p95: float
    p99: float
    p99_9: float
    mean_ci95_low: float
    mean_ci95_high: float
    p50_ci95_low: float
    p50_ci95_high: float


@dataclass(frozen=True)
class Drift(Section):
    """The measured backend's output against a reference backend's on the same inputs (measure/drift.py)."""

    max_abs_error: float
    mean_abs_error: float
    max_rel_error: float
    cosine_similarity: float
    tolerance: float
    within_tolerance: bool
    min_cosine: float | None = None
    reference: str | None = None

    def failure_message(self) -> str:
        return (f"outputs drift from {self.reference}: max rel error {self.max_rel_error:.2e} "
                f"(tolerance {self.tolerance:.0e}), cosine {self.cosine_similarity:.6f}")


@dataclass(frozen=True)
class Quality(Section):
    """The task's outputs on real text against the fp32 reference's (measure/quality.py), and the gate's verdict
    (`min_quality`, or the task's defaults: workload/quality.py)."""

    task: str
    metrics: dict[str, float]
    rows: int
    origin: str
    reference: str
    reference_cached: bool = False
    seconds: float | None = None
    gate: list[str] = field(default_factory=list)  # the bounds applied, e.g. "cosine_p1>=0.99"
    failed: list[str] = field(default_factory=list)  # the bounds not met
    passed: bool | None = None  # None: not judged yet (an instance's own report), or unknown
    unknown: str | None = None  # why there is no figure: a model file with nothing to be judged against
    # quality.eval=FILE: {"kind", "origin", "rows", "libraries", "measured", "reference", "drop", "seconds"}
    evaluation: dict[str, Any] | None = None
    batch_change: float | None = None  # the largest per-text change in a second batching (a reduced precision's)

    def values(self) -> dict[str, float]:
        """What a gate's bound may name: the task's metrics, the evaluation's (fp32's drop as `<metric>_drop`)."""
        found = dict(self.metrics)
        if self.batch_change is not None:
            found[BATCH_CHANGE] = self.batch_change
        if self.evaluation:
            found = {**self.evaluation["measured"], **found}  # a task metric keeps its name (recall_at_10)
            found.update({f"{m}{DROP}": v for m, v in (self.evaluation.get("drop") or {}).items()})
        return found

    def failure_message(self) -> str:
        shown = ", ".join(f"{b} (measured {self.values().get(b.split('>')[0].split('<')[0], float('nan')):.4f})"
                          for b in self.failed)
        return f"withheld (quality): {self.task} outputs vs {self.reference} miss {shown}"

    def summary(self) -> str:
        """The headline figures: the gate's metrics, or every metric when there is no gate."""
        evaluated = ""
        if self.evaluation:
            ref = self.evaluation.get("reference") or {}
            evaluated = "; on quality.eval " + ", ".join(
                f"{m} {v:.4f}" + (f" (fp32 {ref[m]:.4f})" if m in ref else "")
                for m, v in self.evaluation["measured"].items())
        if self.unknown is not None:
            return f"quality {self.unknown}{evaluated}"
        names = [b.split(">")[0].split("<")[0] for b in self.gate] or list(self.metrics)
        values = self.values()
        return ", ".join(f"{n} {values[n]:.4f}" for n in names if n in values) + evaluated


@dataclass(frozen=True)
class WorkerImports(Section):
    """What a worker imported before it loaded its backend (measure/imports.py), each module's seconds: its own,
    and its fork server's when it was forked from one; the frameworks it held once its backend was loaded."""

    seconds: dict[str, float] = field(default_factory=dict)
    fork_server_seconds: dict[str, float] | None = None
    frameworks: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceReport(Section):
    """What one worker reported at the end of its trial (measure/worker.py's result event); the keys this type
    does not name (a backend's or a newer worker's) are kept in `extra`."""

    instance: int
    load_seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    warmup_iterations: int = 0
    warmup_stable_iterations: int | None = None  # kept warm until the common start: at least 1
    warmup_converged: bool = True
    cpu_seconds: float | None = None
    wall_seconds: float | None = None
    peak_rss_bytes: int | None = None
    peak_rss_scope: str | None = None  # what the peak covers (warm-up and window, or the whole process)
    rss_bytes: int | None = None
    framework: dict[str, Any] = field(default_factory=dict)  # backend.info(): each backend's own facts
    drift: Drift | None = None
    quality: Quality | None = None  # instance 0's check of the task's outputs (None: encode, or other instances)
    launch: dict[str, Any] = field(default_factory=dict)  # the command prefix and variables it was started with
    imports: WorkerImports | None = None  # None in records before corescale 0.2's worker imports
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def resident_bytes(self) -> int:
        """Resident memory at the end of the window, else the peak (0 when neither was reported)."""
        return self.rss_bytes or self.peak_rss_bytes or 0


@dataclass(frozen=True)
class ServerStep(Section):
    """One LoadGen test (measure/loadgen.py's StepResult)."""

    target_qps: float | None
    validity: str
    meets_slo: bool | None  # None: LoadGen could not decide (too few queries)
    latency_ms: dict[str, float]
    scheduled_qps: float | None = None
    completed_qps: float | None = None
    queries: int = 0
    overlatency_queries: int | None = None
    early_stopping: str = ""
    checks: dict[str, bool] = field(default_factory=dict)
    duration_s: float = 0.0
    parent_cpu_s: float = 0.0
    batches: dict[str, float] = field(default_factory=dict)
    log_prefix: str = ""
    errors: int = 0  # queries the system under test failed (a step with any is not valid)
    http: HttpStep | None = None  # endpoint=: the requests of this test
    broken: bool = False  # every query failed, none for lack of time: the search stops there
    cut: bool = False  # the search's wall-time bound ended this test (its queued queries answered at once)
    retest: bool = False  # the search ran this rate again: its first test's miss was doubtful (a shared host's pause)


@dataclass(frozen=True)
class TimingStats(Section):
    """Milliseconds over the requests of one test that have the figure."""

    count: int
    mean: float
    p50: float
    p99: float
    max: float


@dataclass(frozen=True)
class HttpStep(Section):
    """One LoadGen test over HTTP (measure/http/load.py): requests sent, failures by kind, and where the time went
    as the client saw it and as the server's timing headers say (queue, tokenization, inference, total)."""

    requests: int
    errors: dict[str, int]  # http_500 | connect | reset | timeout | bad_answer | ... -> count
    max_in_flight: int
    client_ms: dict[str, TimingStats]  # wait: LoadGen's issue -> sent; response: sent -> answer read
    server_ms: dict[str, TimingStats]  # the server's headers, where it sends them
    error_examples: list[str] = field(default_factory=list)  # the first few, as one line each


@dataclass(frozen=True)
class CurvePoint(Section):
    """One point of the load curve: latency (ms, from LoadGen's scheduled issue) at an offered load."""

    target_qps: float
    scheduled_qps: float | None = None
    completed_qps: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    validity: str | None = None
    meets_slo: bool | None = None


@dataclass(frozen=True)
class Batching(Section):
    max_batch: int
    max_queue_ms: float
    max_batch_tokens: int | None
    pad: str
    batches: int
    mean_rows: float
    max_rows: int
    padding_waste: float
    queue_delay: str = "fixed"
    real_tokens: int = 0
    padded_tokens: int = 0  # rows x padded length, summed over the calls
    rows_histogram: dict[str, int] = field(default_factory=dict)  # rows per call -> calls
    padded_length_histogram: dict[str, int] = field(default_factory=dict)  # the length a call was padded to -> calls
    max_padding: float | None = None  # the share of a call's padded tokens that may be padding (None: no cap)


@dataclass(frozen=True)
class ParentLoad(Section):
    """The parent's own CPU (LoadGen, the queue and the dispatchers are its threads)."""

    cpu_seconds: float
    wall_seconds: float
    cores_used: float | None
    cpus: list[int] = field(default_factory=list)  # the CPUs it ran on


@dataclass(frozen=True)
class SearchStart(Section):
    """target_qps=auto: the capacity estimate its first test came from (loadgen.LoadGenServer._first_guess), beside
    the rate the first test ran at, so that a reader can check the estimate against what the search found."""

    qps: float  # the instances' capacity at the SLO, summed, as their warm calls say
    share: float  # the first test's share of it (before the bound or the floor raised it)
    basis: str  # "real lengths": calls of real queries, padded as served; "sequence_length calls": the old estimate
    per_instance: str = ""  # each instance's batch size, call time and rate, in words
    first_qps: float | None = None  # the rate the first test ran at


@dataclass(frozen=True)
class ServerSummary(Section):
    """scenario=server|single_stream: LoadGen's verdict, the search's steps and load curve, the batches formed."""

    scenario: str  # server | single_stream
    target_qps: float | str | None  # a rate, or "auto" (search the max valid QPS)
    slo_p99_ms: float | None
    validity: str | None
    max_valid_qps: float | None
    latency_ms: dict[str, float]
    steps: list[ServerStep]
    load_curve: list[CurvePoint]
    knee_qps: float | None
    search_floor_qps: float | None
    unreachable: str | None
    batching: Batching | None  # None over HTTP: the server batches
    parent: ParentLoad
    queries: dict[str, Any] = field(default_factory=dict)  # the query set's summary
    errors: int = 0  # failed queries over every step
    endpoint: Endpoint | None = None  # endpoint=: the server measured, as it describes itself
    bounded: str | None = None  # target_qps=auto ended by its wall-time bound (server.max_search_s), in words
    # target_qps=auto: no rate met the SLO before a bound ended the search, in words ("not established: one LoadGen
    # test at 58.3 QPS missed the SLO (p99 368 ms); ..."): the max is unknown, not 0 (None: found, or none can)
    unestablished: str | None = None
    capacity: SearchStart | None = None  # target_qps=auto: the estimate its first test came from
    skipped: str | None = None  # no LoadGen test ran: the artifact missed the quality gate before it, in words

    @property
    def searched(self) -> bool:
        """A max-QPS search (target_qps=auto) in the server scenario."""
        return self.scenario == "server" and self.target_qps == "auto"


@dataclass(frozen=True)
class Endpoint(Section):
    """A running server measured over HTTP (endpoint=URL api=...): no local instance ran; this is what it was."""

    url: str
    api: str  # openai | tei
    path: str  # where each query was POSTed
    model_field: str | None  # the `model` every OpenAI request carried
    health: int | None  # GET /health's status (None: the server has no /health; a first request answered)
    reports: dict[str, Any] = field(default_factory=dict)  # what it says of itself: {"/info": {...}, ...}
    single_ms: float | None = None  # one request alone, warm, the fastest of a few
    warmup_requests: int = 0
    warmup_errors: int = 0
    dimension: int | None = None  # the embedding's length in its answers
    request_timeout_s: float | None = None
    managed: Managed | None = None  # endpoint=managed: the service the trial started
    engine: str | None = None  # which engine served, as its GET /info says ("corescale serve", "ray serve"); None


@dataclass(frozen=True)
class Managed(Section):
    """endpoint=managed: the `corescale serve` a trial started on its layout, where its parts ran, what the front
    cost (its /metrics `corescale_front_cpu_seconds`, over the warm-up and LoadGen's tests) and how it stopped."""

    layout: str  # the layout served, in words (the record's plan holds it whole)
    front: str  # where its HTTP front ran: "CPUs 2-3" or "shared with the instances"
    client_cpus: list[int]  # where LoadGen and the HTTP client ran (the trial's process)
    front_cpu_s: float | None = None
    front_wall_s: float | None = None
    exit_code: int | None = None  # after SIGTERM: 0 when it drained

    @property
    def front_cores(self) -> float | None:
        return self.front_cpu_s / self.front_wall_s if self.front_cpu_s is not None and self.front_wall_s else None


@dataclass(frozen=True)
class SentinelReading(Section):
    """One reading of the speed sentinel (measure/sentinel.py): per measured CPU the fixed GEMM's and the triad's
    milliseconds, and the worst part's ratio to that CPU's reference (1.0 = unchanged)."""

    at: float  # epoch seconds
    phase: str  # before | after (the trial's instances)
    compute_ms: dict[str, float]
    memory_ms: dict[str, float]
    ratio: float
    moved: bool  # a part slower than its reference beyond its tolerance (earlier 0.4 builds: either way)
    compute_ratio: float | None = None  # the GEMM's worst ratio alone (None: records of the first 0.4 builds)
    memory_ratio: float | None = None  # the triad's: moved alone, a neighbour on the caches or memory bandwidth


@dataclass(frozen=True)
class Contamination(Section):
    """What may have taken the measured CPUs during the trial, beyond its own processes: the hypervisor's steal
    over the timed window (all measured CPUs together and per CPU, a fraction of the window), the worst foreign load
    (RunMetrics.foreign_load, repeated here) and the speed sentinel's readings before and after the trial.
    Absent (None) in records before corescale 0.4."""

    steal_fraction: float | None = None  # None: not measured (a served trial, a worker that did not report it)
    steal_by_cpu: dict[str, float] = field(default_factory=dict)
    foreign_load: float | None = None
    sentinel: list[SentinelReading] = field(default_factory=list)
    sentinel_tolerance: float | None = None  # the GEMM's; None: the sentinel was off (sentinel=false)
    sentinel_memory_tolerance: float | None = None  # the triad's (None: records before it had its own)
    rerun_of_moved: bool = False  # this trial measures again one whose sentinel moved (repeats, a tune's final)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sentinel_moved(self) -> bool:
        return any(r.moved for r in self.sentinel)

    @property
    def sentinel_moved_throughout(self) -> bool:
        """Moved before and after the trial: a slowdown that lasted through it (one side alone may be a blip)."""
        return len(self.sentinel) >= 2 and all(r.moved for r in self.sentinel)

    @property
    def sentinel_range(self) -> tuple[float, float] | None:
        """The lowest and highest ratio of its readings to the run's first (None without readings)."""
        ratios = [r.ratio for r in self.sentinel]
        return (min(ratios), max(ratios)) if ratios else None

    @property
    def stolen(self) -> bool:
        return (self.steal_fraction or 0.0) > STEAL_THRESHOLD


STEAL_THRESHOLD = 0.02  # steal above 2 % of the measured CPUs' window is shown on the console and in the report
