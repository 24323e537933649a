"""One trial: config -> model spec -> placement plan -> pinned instances -> TrialRecord -> result directory.

`prepare_trial` makes every check that needs no process; `run_instances` runs the instances and returns an
`UncommittedResult` (the record, its samples and logs: it may travel from another node); `commit` writes it
atomically. The trial loop (trials/local.py) is what calls these, under the machine lock.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.backends import check_available, entry, quality_reference, runs_model
from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine import environment, instance_env
from corescale.machine.cgroup import check_quota
from corescale.machine.environment import HostEnvironment
from corescale.machine.peak import PeakCache
from corescale.machine.placement import InstanceSpec, Plan, plan, topology_here
from corescale.machine.scratch import scratch
from corescale.machine.topology import Topology
from corescale.measure.aggregate import InstanceSamples, run_metrics, samples_frame
from corescale.measure.calibrate import with_peaks
from corescale.measure.gate import judge_quality, missed_gate, reference_first
from corescale.measure.launcher import Launcher, LaunchOutcome
from corescale.measure.loadgen import LoadGenServer
from corescale.measure.loadgen_summary import batches_csv, summarise
from corescale.measure.protocol import TrialFiles
from corescale.measure.timing import read_pairs
from corescale.measure.trial import Trial, UncommittedResult, check_places, housekeeping_cpus, new_record
from corescale.overrides import override_key
from corescale.record.files import PendingRun, log_name, run_name
from corescale.record.sections import Contamination, InstanceReport, ServerSummary
from corescale.record.trial import Failure, Partial, Roofline, RunMetrics, TrialRecord, spec_key, trial_key
from corescale.workload.flops import forward_flops
from corescale.workload.models import ModelSpec, configured_model
from corescale.workload.quality import build_quality_set
from corescale.workload.samples import build_query_set, uses_query_set

if TYPE_CHECKING:  # pandas (~0.4 s) is imported where a frame is made: `corescale plan` and `serve OVERRIDES`
    import pandas as pd  # (a managed endpoint's trial) start without it


def placement_for(cfg: BenchmarkConfig, topology: Topology) -> Plan:
    """The placement plan a config asks for on a topology (also used by `corescale plan`)."""
    layout = None if cfg.layout == "none" else cfg.layout
    return plan(topology, instances=None if layout and cfg.instances == 1 else cfg.instances,
                cores_per_instance=cfg.cores_per_instance, layout=layout, use_logical_cores=cfg.use_logical_cores)


def prepare_trial(cfg: BenchmarkConfig, topology: Topology | None = None, on_node: bool = False) -> Trial:
    """Every check that can be made before a process starts; raises UserError with one clear line.

    on_node: prepared again on the Ray node that measures it (the driver writes the results; the node's memory
    is what must hold the instances)."""
    if cfg.endpoint:
        from corescale.http_keys import MANAGED
        from corescale.measure.http.trial import prepare_endpoint, served_config

        return prepare_endpoint(cfg, prepare_trial(served_config(cfg)) if cfg.endpoint == MANAGED else None)
    check_available(cfg.backend.name)
    if cfg.reference_backend:
        check_available(cfg.reference_backend)
    model = configured_model(cfg)
    cfg = graph_precision(cfg, model)
    runs_model(cfg.backend.name, model)
    if cfg.reference_backend:
        runs_model(cfg.reference_backend, model, "reference")
    check_task(cfg, model)
    if model.head.entry.judged:  # what the quality check's reference runs on
        check_available(quality_reference(model))
    if model.max_positions is not None and cfg.sequence_length > model.max_positions:
        raise UserError(f"sequence_length={cfg.sequence_length} exceeds the maximum of {model.max_positions} "
                        f"positions of model '{cfg.model}'")
    instance_env.preload_paths(cfg)  # a requested allocator/OpenMP library that is missing
    topology = topology or topology_here(cfg.use_logical_cores, sized_by_machine=cfg.cores_per_instance is None)
    placement = placement_for(cfg, topology)
    check_threads(cfg, placement, topology)
    if on_node or cfg.executor.name == "local":  # the instances run here: this cgroup's quota throttles them
        check_quota(sum(cfg.threads or inst.threads for inst in placement.instances), layout_text(placement))
    if cfg.layout != "none" and len(placement.instances) != cfg.instances:
        cfg = dataclasses.replace(cfg, instances=len(placement.instances))
        if cfg.total_batch_size and cfg.total_batch_size % cfg.instances:
            raise UserError(f"total_batch_size={cfg.total_batch_size} does not split evenly over the "
                            f"{cfg.instances} instances of layout={cfg.layout}; choose a multiple of {cfg.instances}")
    if on_node or cfg.executor.name == "local":  # a Ray driver's memory says nothing about its nodes'
        check_memory(cfg, model)
    queries = build_query_set(cfg, model) if uses_query_set(cfg) else None  # files, fields, tokenizer
    quality = build_quality_set(cfg, model) if model.head.entry.judged else None  # real text, its tokenizer
    check_places(cfg, results=not on_node)  # last: every other check has passed
    key = spec_key(cfg, model)
    if cfg.workload.source and queries is not None:  # the text file's tokens, not only its name
        import hashlib

        digest = hashlib.sha256(b"".join(q.tobytes() for q in queries.ids)).hexdigest()[:16]
        key = trial_key(key, {"queries": digest})
    return Trial(cfg, model, placement, key, queries, quality)


def graph_precision(cfg: BenchmarkConfig, model: ModelSpec) -> BenchmarkConfig:
    """A model file quantized already is measured, and recorded, in the precision its graph computes in (whatever
    its config says); precision= left at its default takes it, another precision is one line."""
    from corescale.machine.precisions import REFERENCE
    from corescale.workload.modelfile import describe_quantization

    found = model.quantization
    if found is None or cfg.precision == found["precision"]:
        return cfg
    if cfg.precision != REFERENCE:
        raise UserError(contradiction(cfg.precision, cfg.model, found))
    if found["precision"] not in entry(cfg.backend.name).precisions:
        raise UserError(f"backend={cfg.backend.name} does not compute in precision={found['precision']}, which the "
                        f"graph of model file '{cfg.model}' computes in ({describe_quantization(found)})")
    return dataclasses.replace(cfg, precision=found["precision"])


def contradiction(precision: str, name: str, found: dict) -> str:
    """The line for a precision= the graph of a quantized model file does not compute in."""
    from corescale.workload.modelfile import describe_quantization

    return (f"precision={precision} contradicts model file '{name}': its graph computes in "
            f"{describe_quantization(found)}; leave precision= out (the graph decides)")


def check_stated_precision(trial: Trial, overrides: list[str]) -> None:
    """A precision= the user wrote that the graph replaced (graph_precision cannot tell an explicit fp32 from the
    default; the overrides can): one line, as any other contradiction."""
    stated = [o.split("=", 1)[1].strip("'\"") for o in overrides if "=" in o and override_key(o) == "precision"]
    found = trial.model.quantization
    if found is not None and stated and stated[-1] != trial.cfg.precision:
        raise UserError(contradiction(stated[-1], trial.cfg.model, found))


def check_task(cfg: BenchmarkConfig, model: ModelSpec) -> None:
    """The task the model computes is one the backend can run, and min_quality speaks of that task's metrics."""
    from corescale.workload.quality import parse_gate

    backend = entry(cfg.backend.name)
    if not backend.computes(model.task):
        raise UserError(f"backend={cfg.backend.name} computes task {', '.join(backend.tasks())} only; model "
                        f"'{cfg.model}' is task={model.task} ({model.head.summary()}): give task=encode to measure "
                        "its encoder alone, or use another backend")
    evaluated = None
    if cfg.quality_eval:  # read, checked and tokenized here, before any worker (ids that do not resolve, ...)
        from corescale.workload.evaluation import build_eval_set

        evaluated = build_eval_set(cfg, model)[0].kind
    parse_gate(cfg.min_quality, model.task, evaluated)
    cfg.backend.check_model(model)
    if cfg.tokenize and cfg.scenario != "offline":
        raise UserError(f"tokenize=true applies to the offline closed loop (got scenario={cfg.scenario}); a served "
                        "trial's queries arrive as token ids")
    if cfg.tokenize and not cfg.workload.source:
        raise UserError("tokenize=true times the tokenizer on text: give workload=builtin (the built-in corpus) or "
                        "workload=FILE")
    if cfg.tokenize:
        from corescale.workload.tokens import tokenizer_dir

        folder, _ = tokenizer_dir(cfg, model)
        if folder is None or not (folder / "tokenizer.json").is_file():
            raise UserError(f"tokenize=true needs the model's fast tokenizer (tokenizer.json); model '{cfg.model}' "
                            "has none: give workload.tokenizer=DIR holding tokenizer.json")


def layout_text(placement: Plan) -> str:
    """e.g. "the layout of 2 instance(s) on CPUs 0,1"."""
    from corescale.machine.cpulist import format_cpulist

    cpus = [cpu for inst in placement.instances for cpu in inst.cpus]
    return f"the layout of {len(placement.instances)} instance(s) on CPUs {format_cpulist(cpus)}"


def check_threads(cfg: BenchmarkConfig, placement: Plan, topology: Topology) -> None:
    """`threads` and `interop_threads` stay within each instance's CPUs (more would only time-slice them)."""
    from corescale.machine.cpulist import format_cpulist

    smallest = min(placement.instances, key=lambda inst: len(inst.cpus))
    cpus = len(smallest.cpus)
    several = len(placement.instances) > 1
    where = (f"instance {smallest.id} of {len(placement.instances)}" if several else "the instance") + \
        f" (CPUs {format_cpulist(smallest.cpus)} of {len(topology.cpu_ids)} usable)"
    hint = ", or fewer instances with more cores_per_instance" if several else (
        ", or more cores_per_instance" if cpus < len(topology.cpu_ids) else "")
    for name, value in (("threads", cfg.threads), ("interop_threads", cfg.interop_threads)):
        if value is not None and value > cpus:
            raise UserError(f"{name}={value} exceeds the {cpus} CPUs of {where}; allowed: {name} <= {cpus}{hint}")


def available_memory() -> tuple[int, str] | None:
    """(bytes a new process can still get, where that figure comes from): MemAvailable, or the cgroup's limit
    minus its usage where that is lower; None when neither can be read."""
    import re

    known = []
    match = re.search(r"^MemAvailable:\s+(\d+) kB", environment.read_text("/proc/meminfo") or "", re.M)
    if match:
        known.append((int(match.group(1)) * 1024, "MemAvailable in /proc/meminfo"))
    limit, used = (environment.read_text(f"/sys/fs/cgroup/memory.{n}") for n in ("max", "current"))
    if limit and used and limit.strip().isdigit() and used.strip().isdigit():
        known.append((int(limit) - int(used), "the cgroup's memory.max - memory.current"))
    return min(known) if known else None


def check_memory(cfg: BenchmarkConfig, model: ModelSpec) -> None:
    """Weights + activations of every instance (a lower bound) must fit in the memory available now."""
    from corescale.workload.memory import estimate, gib

    available = available_memory()
    if available is None:
        return
    each = estimate(model, cfg.instance_batch_size, cfg.sequence_length)
    needed = each.total_bytes * cfg.instances
    if needed > available[0]:
        raise UserError(
            f"batch_size={cfg.instance_batch_size} x sequence_length={cfg.sequence_length} of '{cfg.model}' on "
            f"{cfg.instances} instance(s) needs at least {gib(needed)} (per instance: weights "
            f"{gib(each.weights_bytes)} + activations {gib(each.activation_bytes)}), more than the "
            f"{gib(available[0])} available ({available[1]}); use a smaller batch_size or sequence_length, or "
            "fewer instances")


@dataclass
class TrialOutcome:
    path: Path | None
    record: TrialRecord

    @property
    def ok(self) -> bool:
        return self.record.ok


def failed_result(trial: Trial, failure: Failure, host: HostEnvironment | None, started: float) -> UncommittedResult:
    """A trial that ended before producing its own record still leaves one, with its reason."""
    record = new_record(trial, host, started).fail(failure)
    record.elapsed_s = time.time() - started
    return UncommittedResult(record, None, {})


def _trial_files(trial: Trial, work: Path) -> TrialFiles:
    """The query and quality sets saved in `work`, and the tokenizer's directory (tokenize=true)."""
    saved = {}
    for name, found in (("queries", trial.queries), ("quality", trial.quality)):
        if found is not None:
            found.save(work / f"{name}.npz")
            saved[name] = str(work / f"{name}.npz")
    if trial.cfg.tokenize:
        from corescale.workload.tokens import tokenizer_dir

        saved["tokenizer"] = str(tokenizer_dir(trial.cfg, trial.model)[0])
    return TrialFiles(**saved)


def run_instances(trial: Trial, on_event=None, host: HostEnvironment | None = None,
                  forkservers=None) -> UncommittedResult:
    """Runs the trial's instances (forked from `forkservers` when given); a failed instance gives a failed record,
    bad input raises UserError."""
    started = time.time()
    host = host or environment.capture()
    record = new_record(trial, host, started)
    if trial.texts is not None:
        from corescale.measure.http.trial import run_endpoint

        return run_endpoint(trial, record, started)
    samples = None
    with scratch() as work:
        specs = trial.instance_specs(Path(work))
        if trial.cfg.calibrate:  # the yardstick of "% of peak", measured once per CPUs, threads and precision
            specs = with_peaks(specs, trial.cfg, host.cpu.isa, Path(work), PeakCache(trial.cfg.cache_dir))
        record.specs = list(specs)
        server = None
        files = _trial_files(trial, Path(work))
        if trial.cfg.scenario != "offline":
            assert trial.queries is not None, "a served trial has its query set (uses_query_set)"
            server = LoadGenServer(trial.cfg, trial.queries.lengths, Path(work),
                                   lambda found: missed_gate(found, trial))
            if trial.quality is not None:  # instance 0 checks quality before the search: its reference first
                reference_first(trial, specs[0], files, Path(work))
        cpus = sorted({cpu for spec in specs for cpu in spec.cpus})
        readings = [sentinel_reading(trial.cfg, cpus, "before")]
        with housekeeping_cpus(specs) as parent_cpus:
            outcome = Launcher(Path(work), trial.cfg.timeout, on_event, server, files, forkservers).run(
                specs, trial.cfg, trial.model)
        readings.append(sentinel_reading(trial.cfg, cpus, "after"))
        record.contamination = contamination_of(trial.cfg, [r for r in readings if r is not None],
                                                list(outcome.results.values()))
        if outcome.failure and outcome.failure.kind == "user":
            raise UserError(outcome.failure.message)
        logs = {p.name: p.read_bytes()[-200_000:] for p in Path(work).glob("instance-*.stderr.log")
                if p.stat().st_size}
        if server is not None:
            _finish_server(record, trial, server, outcome, logs, parent_cpus)
            record.elapsed_s = time.time() - started
            return UncommittedResult(record, None, logs, outcome.interrupted)
        start_ns = outcome.start_ns
        instances = _load_instances(specs, outcome) if start_ns else []
        metrics, samples = _metrics(trial, instances, start_ns) if instances and start_ns else (None, None)
        if outcome.failure:  # keep what finished instances measured, and the calls the others streamed: invalid
            streamed = streamed_samples(specs, outcome) if outcome.start_ns else None
            if streamed is not None:
                import pandas as pd

                samples = streamed if samples is None else pd.concat([samples, streamed], ignore_index=True)
            record.partial = Partial(outcome.states, [inst.id for inst in instances], metrics,
                                     {} if streamed is None else streamed.groupby("instance").size().to_dict())
            record.fail(outcome.failure)
        else:
            assert metrics is not None, "a launch without a failure measured every instance"
            _finish(record, trial, metrics, [outcome.results[spec.id] for spec in specs])
        if trial.queries is not None and metrics is not None and metrics.padded_tokens_per_s:
            record.workload = {**trial.queries.summary(), "pad": trial.cfg.pad, "padding_waste":
                               1 - metrics.throughput_tokens_per_s / metrics.padded_tokens_per_s}
    record.elapsed_s = time.time() - started
    return UncommittedResult(record, samples, logs, outcome.interrupted)


def sentinel_reading(cfg: BenchmarkConfig, cpus: list[int], phase: str) -> dict | None:
    """The run's speed sentinel on the trial's CPUs (None: sentinel=false)."""
    if not cfg.sentinel:
        return None
    from corescale.measure.sentinel import run_sentinel

    return run_sentinel().read(cpus, phase)


def contamination_of(cfg: BenchmarkConfig, readings: list[dict], reports: list[dict]) -> Contamination:
    """Steal over the timed window from the workers' reports (each over its own CPUs), the worst foreign load, and
    the sentinel's readings."""
    from corescale.measure.sentinel import run_sentinel

    by_cpu = {cpu: float(v) for r in reports for cpu, v in (r.get("steal_by_cpu") or {}).items()}
    foreign = [float(r["foreign_load"]) for r in reports if r.get("foreign_load") is not None]
    return Contamination.from_dict({
        "steal_fraction": sum(by_cpu.values()) / len(by_cpu) if by_cpu else None, "steal_by_cpu": by_cpu,
        "foreign_load": max(foreign) if foreign else None, "sentinel": readings,
        "sentinel_tolerance": run_sentinel().tolerance if cfg.sentinel else None,
        "sentinel_memory_tolerance": run_sentinel().memory_tolerance if cfg.sentinel else None}, "contamination")


def commit(measured: UncommittedResult) -> TrialOutcome:
    """Writes the result directory atomically under the config's results root. A write that fails (a full disk,
    a quota, a read-only or vanished folder) leaves nothing behind and is one line (UserError)."""
    cfg = measured.record.config
    try:
        pending = PendingRun(cfg.results_root, run_name(cfg))
    except OSError as exc:
        raise _unwritable(cfg, exc) from None
    try:
        for name, data in measured.logs.items():
            (pending.tmp / log_name(name)).write_bytes(data)
        if measured.samples is not None:
            pending.write_samples(measured.samples)
        pending.write_config(cfg.to_dict())
        return TrialOutcome(pending.commit(measured.record.to_json()), measured.record)
    except OSError as exc:
        pending.discard()
        raise _unwritable(cfg, exc) from None
    except BaseException:
        pending.discard()
        raise


def _unwritable(cfg: BenchmarkConfig, exc: OSError) -> UserError:
    return UserError(f"cannot write the result of this trial under '{cfg.results_root}': "
                     f"{exc.strerror or exc}; nothing of it was written (free space, or give another output_dir, "
                     "then run the same command again: what was committed before resumes)")


def streamed_samples(specs: list[InstanceSpec], outcome: LaunchOutcome) -> pd.DataFrame | None:
    """The timed calls that instances without a result streamed before they died or were stopped."""
    import pandas as pd

    frames = []
    for spec in specs:
        path = Path(f"{spec.samples_path}.stream")
        if spec.id in outcome.results or not path.is_file():
            continue
        calls = read_pairs(path)
        if len(calls.starts_ns):
            frames.append(pd.DataFrame({
                "instance": spec.id, "phase": "timed", "iteration": range(len(calls.starts_ns)),
                "start_ns": calls.starts_ns, "end_ns": calls.ends_ns, "latency_ms": calls.durations_ns / 1e6,
                "in_window": False, "streamed": True}))
    return pd.concat(frames, ignore_index=True) if frames else None


def _load_instances(specs: list[InstanceSpec], outcome: LaunchOutcome) -> list[InstanceSamples]:
    """Samples of every instance that finished its timed window."""
    return [InstanceSamples.load(spec, outcome.results[spec.id]) for spec in specs
            if spec.id in outcome.results and Path(spec.samples_path).is_file()]


def _metrics(trial: Trial, instances: list[InstanceSamples], start_ns: int) -> tuple[RunMetrics, pd.DataFrame]:
    length: float = trial.cfg.sequence_length
    padded = [p for inst in instances if (p := inst.report.get("padded_tokens_per_sample"))]
    if len(padded) == len(instances):  # a query set: the work done is at the lengths the batches were padded to
        length = sum(padded) / len(padded)
    tokens = max(int(round(length)), 1)
    known = trial.model.sizes_known  # a model file without config.json: its FLOPs are unknown, not invented
    metrics = run_metrics(instances, start_ns, length, forward_flops(trial.model, 1, tokens) if known else None)
    metrics.roofline = roofline_of(trial, metrics, instances, tokens) if known else None
    return metrics, samples_frame(instances, (metrics.window_start_ns, metrics.window_end_ns))


def roofline_of(trial: Trial, metrics: RunMetrics, instances: list[InstanceSamples], length: int) -> Roofline | None:
    """The run on the roofline at `length` tokens per sample, from each instance's roofs (the peak entry holds its
    bandwidth)."""
    from corescale.machine.roofline import position
    from corescale.workload.memory import traffic_bytes

    batch = trial.cfg.instance_batch_size
    assert metrics.gflops_per_s is not None, "known sizes give FLOPs"
    found = position(metrics.gflops_per_s, forward_flops(trial.model, batch, length),
                     traffic_bytes(trial.model, batch, length, trial.cfg.precision), [inst.peak for inst in instances])
    return Roofline(**found) if found else None


def _finish_server(record: TrialRecord, trial: Trial, server: LoadGenServer, outcome: LaunchOutcome,
                   logs: dict[str, bytes], parent_cpus) -> None:
    """The server scenario's record: LoadGen's steps and logs, the batches formed, each instance's report."""
    assert trial.queries is not None, "a served trial has its query set (uses_query_set)"
    logs.update(server.outcome.logs)
    logs["server-batches.csv"] = batches_csv(server.outcome.batch_rows)
    summary = summarise(trial.cfg, server.outcome, trial.queries.summary())
    summary["parent"]["cpus"] = sorted(parent_cpus or os.sched_getaffinity(0))
    record.server = served = ServerSummary.from_dict(summary, "server")
    assert served.batching is not None, "the in-process server batches"
    record.workload = {**trial.queries.summary(), "pad": trial.cfg.pad,
                       "padding_waste": served.batching.padding_waste}
    record.instance_reports = [_report(outcome.results[spec.id], spec.id) for spec in record.specs
                        if spec.id in outcome.results]
    if outcome.failure:
        record.partial = Partial(outcome.states, sorted(outcome.results))
        record.fail(outcome.failure)
    elif not server.outcome.steps and not server.outcome.unreachable and not server.outcome.skipped:
        record.fail(Failure("error", "LoadGen ran no test"))
    else:
        judge_quality(record, trial)
        if server.outcome.skipped and record.quality is not None and record.quality.passed is False:
            assert record.failure is not None, "a quality miss fails the record"
            record.fail(dataclasses.replace(record.failure, message=f"{record.failure.message}; the QPS search "
                                            "was skipped (quality is checked first): no LoadGen test ran"),
                        valid=True)


def _finish(record: TrialRecord, trial: Trial, metrics: RunMetrics, reports: list[dict]) -> None:
    record.metrics = metrics
    record.instance_reports = [_report(r, i) for i, r in enumerate(reports)]
    drift = [r.drift for r in record.instance_reports if r.drift is not None]
    record.drift = drift[0] if drift else None
    over = [d for d in drift if not d.within_tolerance]
    if over:  # the figures are real (valid), the outputs are wrong (failed)
        record.fail(Failure("drift", over[0].failure_message()), valid=True)
    judge_quality(record, trial)


def _report(result: dict, instance: int) -> InstanceReport:
    """A worker's result event as the record's typed report (the event's name dropped)."""
    return InstanceReport.from_dict({k: v for k, v in result.items() if k != "event"}, f"instance {instance}'s report")
