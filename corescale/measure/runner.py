"""One trial: config -> model spec -> placement plan -> launch pinned instances -> metrics -> result dir."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from corescale.backends import check_available
from corescale.errors import UserError
from corescale.machine import environment, instance_env
from corescale.machine.placement import Plan, plan
from corescale.machine.topology import Topology
from corescale.measure.aggregate import InstanceSamples, run_metrics, samples_frame
from corescale.measure.launcher import Launcher
from corescale.results.files import PendingRun, run_name
from corescale.workload.flops import forward_flops
from corescale.workload.models import ModelSpec, resolve_model


@dataclass
class Trial:
    cfg: object
    model: ModelSpec
    plan: Plan
    batch_size: int  # per instance
    sgemm_known: dict = field(default_factory=dict)  # (cpus, threads) -> GFLOP/s calibrated earlier in a sweep

    @property
    def threads(self) -> list[int]:
        return [inst.threads if self.cfg.threads is None else self.cfg.threads for inst in self.plan.instances]


def instance_batch_size(cfg) -> int:
    return cfg.total_batch_size // cfg.instances if cfg.total_batch_size else cfg.batch_size


def placement_for(cfg, topology: Topology) -> Plan:
    """The placement plan a config asks for on a topology (also used by `corescale plan`)."""
    layout = None if cfg.layout == "none" else cfg.layout
    return plan(topology, instances=None if layout and cfg.instances == 1 else cfg.instances,
                cores_per_instance=cfg.cores_per_instance, layout=layout, use_logical_cores=cfg.use_logical_cores)


def prepare_trial(cfg, topology: Topology | None = None) -> Trial:
    """Every check that can be made before a process starts; raises UserError with one clear line."""
    check_available(cfg.backend)
    if cfg.reference:
        check_available(cfg.reference)
    model = resolve_model(cfg.model, cfg.trust_remote_code)
    if cfg.sequence_length > model.max_positions:
        raise UserError(f"sequence_length={cfg.sequence_length} exceeds the maximum of {model.max_positions} "
                        f"positions of model '{cfg.model}'")
    instance_env.preload_paths(cfg)  # a requested allocator/OpenMP library that is missing
    topology = topology or Topology.from_sysfs()
    layout = None if cfg.layout == "none" else cfg.layout
    placement = placement_for(cfg, topology)
    if cfg.threads is not None and cfg.threads > len(topology.cpu_ids):
        raise UserError(f"threads={cfg.threads} exceeds the {len(topology.cpu_ids)} CPUs available to this process "
                        f"({topology.describe()})")
    if layout and len(placement.instances) != cfg.instances:
        cfg = dataclasses.replace(cfg, instances=len(placement.instances))
        if cfg.total_batch_size and cfg.total_batch_size % cfg.instances:
            raise UserError(f"total_batch_size={cfg.total_batch_size} does not split evenly over the "
                            f"{cfg.instances} instances of layout={layout}; choose a multiple of {cfg.instances}")
    return Trial(cfg, model, placement, instance_batch_size(cfg))


def worker_specs(trial: Trial, work_dir: Path) -> list[dict]:
    specs = []
    for inst, threads in zip(trial.plan.instances, trial.threads):
        placement = {"id": inst.id, "cpus": list(inst.cpus), "numa_nodes": list(inst.numa_nodes),
                     "threads": threads}
        specs.append({
            "config": trial.cfg.to_dict(),
            "model": dataclasses.asdict(trial.model),
            "instance": placement,
            "batch_size": trial.batch_size,
            "samples_path": str(work_dir / f"samples-{inst.id}.npz"),
            "sgemm_gflops": trial.sgemm_known.get((tuple(inst.cpus), threads)),
        })
    return specs


@dataclass
class TrialOutcome:
    path: Path | None
    record: dict

    @property
    def ok(self) -> bool:
        return self.record["status"] == "ok"


@dataclass
class Measured:
    """Everything a trial produced, before it is written anywhere (it may travel from another node)."""

    record: dict
    samples: pd.DataFrame | None
    logs: dict[str, bytes]


def measure(trial: Trial, on_event=None, host: dict | None = None) -> Measured:
    """Runs the trial's instances; a failed instance gives a failed record, bad input raises UserError."""
    cfg = trial.cfg
    started = time.time()
    record = {
        "config": cfg.to_dict(),
        "key": cfg.key(),
        "model": trial.model.identity(),
        "plan": trial.plan.to_dict(),
        "environment": host or environment.capture(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
    }
    with tempfile.TemporaryDirectory(prefix="corescale-") as work:
        specs = worker_specs(trial, Path(work))
        outcome = Launcher(Path(work), cfg.timeout, on_event).run(specs, cfg)
        if outcome.failure and outcome.failure.get("user_error"):
            raise UserError(outcome.failure["reason"].split(": ", 1)[-1])
        logs = {p.name: p.read_bytes()[-200_000:] for p in Path(work).glob("instance-*.stderr.log")
                if p.stat().st_size}
        samples = None
        if outcome.failure:  # keep what finished instances measured, flagged invalid
            partial, samples = _partial(trial, specs, outcome)
            record.update(status="failed", reason=outcome.failure["reason"], failure=outcome.failure,
                          valid=False, partial=partial)
        else:
            measured, samples = _measured(trial, specs, outcome)
            record.update(measured)
    record["elapsed_s"] = time.time() - started
    return Measured(record, samples, logs)


def commit(cfg, measured: Measured) -> TrialOutcome:
    """Writes the result directory atomically under cfg.output_dir."""
    pending = PendingRun(Path(os.path.expanduser(cfg.output_dir)), run_name(cfg))
    try:
        for name, data in measured.logs.items():
            (pending.tmp / name).write_bytes(data)
        if measured.samples is not None:
            pending.write_samples(measured.samples)
        pending.write_config(cfg.to_dict())
        return TrialOutcome(pending.commit(measured.record), measured.record)
    except BaseException:
        pending.discard()
        raise


def execute(trial: Trial, on_event=None, host: dict | None = None) -> TrialOutcome:
    """Measure here, then write the result (failed trials too, with their reason)."""
    return commit(trial.cfg, measure(trial, on_event, host))


def _load_instances(trial: Trial, specs: list[dict], outcome) -> list[InstanceSamples]:
    """Samples of every instance that finished its timed window."""
    return [InstanceSamples.load(spec["samples_path"], spec["instance"], trial.batch_size,
                                 outcome.results[spec["instance"]["id"]]) for spec in specs
            if spec["instance"]["id"] in outcome.results and Path(spec["samples_path"]).is_file()]


def _partial(trial: Trial, specs: list[dict], outcome) -> tuple[dict, pd.DataFrame | None]:
    instances = _load_instances(trial, specs, outcome) if outcome.start_ns else []
    partial = {"states": outcome.states, "finished_instances": [inst.id for inst in instances], "metrics": None}
    if not instances:
        return partial, None
    partial["metrics"] = run_metrics(instances, outcome.start_ns, trial.cfg.sequence_length,
                                     forward_flops(trial.model, 1, trial.cfg.sequence_length))
    m = partial["metrics"]
    return partial, samples_frame(instances, (m["window_start_ns"], m["window_end_ns"]))


def _measured(trial: Trial, specs: list[dict], outcome) -> tuple[dict, pd.DataFrame]:
    cfg = trial.cfg
    instances = _load_instances(trial, specs, outcome)
    flops = forward_flops(trial.model, 1, cfg.sequence_length)
    metrics = run_metrics(instances, outcome.start_ns, cfg.sequence_length, flops)
    frame = samples_frame(instances, (metrics["window_start_ns"], metrics["window_end_ns"]))
    reports = [outcome.results[spec["instance"]["id"]] for spec in specs]
    drift = [r["drift"] for r in reports if r.get("drift")]
    status, reason = "ok", None
    failed_drift = [d for d in drift if not d["within_tolerance"]]
    if failed_drift:
        d = failed_drift[0]
        status, reason = "failed", (f"outputs drift from {d['reference']}: max rel error {d['max_rel_error']:.2e} "
                                    f"(tolerance {d['tolerance']:.0e}), cosine {d['cosine_similarity']:.6f}")
    return {
        "status": status,
        "reason": reason,
        "valid": True,
        "metrics": metrics,
        "drift": drift[0] if drift else None,
        "instances": [{k: v for k, v in r.items() if k != "event"} for r in reports],
    }, frame
