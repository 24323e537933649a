"""The tune's plan: every check that needs no worker (the overrides, the space, the budget, the places written),
the Tune that the search runs, and the labels and overrides of its configurations."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.backends import BACKENDS, DEFAULT_BACKEND, OPTIONS, quality_reference
from corescale.config import BenchmarkConfig
from corescale.config_server import EARLY_STOPPING_QUERIES
from corescale.errors import UserError
from corescale.http_keys import MANAGED
from corescale.machine.precisions import PRECISIONS, REFERENCE
from corescale.overrides import assignment, compose, override_key
from corescale.record.trial import TrialRecord
from corescale.trials.sweep import plan_sweep
from corescale.tune import peer as peers
from corescale.tune import space as spaces
from corescale.tune import verdict as verdicts
from corescale.tune.budget import search_bounds
from corescale.tune.document import SearchBounds
from corescale.tune.priors import MachineKind
from corescale.tune.settings import LOAD_MARGIN_S, TuneSettings, scenario_overrides
from corescale.userfiles import check_writable
from corescale.workload.tasks import TASKS

if TYPE_CHECKING:
    from corescale.analysis.cost import Machine
    from corescale.machine.topology import Topology

STUDY_FILE = "study.db"
# a server screen's QPS search: LoadGen's early-stopping minimum for a p99 (config.EARLY_STOPPING_QUERIES), at
# most 5 tests, a 15 % bracket (a screen ranks; the full window and the final repeats measure)
SCREEN_QUERIES, SCREEN_STEPS, SCREEN_PRECISION = EARLY_STOPPING_QUERIES["server"], 5, 0.15
# the serving knobs at the service's defaults (config.ServerConfig, pad): a label shows only what differs
SERVING_DEFAULTS = {"server.queue_delay": "fixed", "server.max_queue_ms": "2", "server.max_batch_tokens": "null",
                    "server.max_padding": "null", "pad": "max", "server.fronts": "1"}


def merge(*groups: list[str]) -> list[str]:
    """Overrides, a later one replacing an earlier one of the same key (Hydra refuses duplicates)."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged[override_key(override)] = override
    return list(merged.values())


def config_label(overrides: list[str]) -> str:
    """A short label of a configuration: what tells it apart from the defaults."""
    values = {override_key(o): o.split("=", 1)[1] for o in overrides}
    parts = [values.get("backend", DEFAULT_BACKEND), values.get("precision", REFERENCE)]
    if "instances" in values:
        parts.append(f"{values['instances']}×{values.get('cores_per_instance', '?')}c")
    else:
        parts.append("1×all")
    defaults = OPTIONS[parts[0]]()
    options = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("backend.")}
    parts += [f"{k}={v}" for k, v in options.items() if v != spaces.text(getattr(defaults, k, None))]
    for key, default in (("threads", None), ("batch_size", None), ("allocator", "default"), ("openmp", "default")):
        if key in values and values[key] != default:
            parts.append(f"{'bs' if key == 'batch_size' else key}={values[key]}")
    if "server.max_batch" in values:
        parts.append(f"max_batch={values['server.max_batch']}")
    parts += [f"{key.removeprefix('server.')}={values[key]}" for key, default in SERVING_DEFAULTS.items()
              if key in values and values[key] != default]
    return " ".join(parts)


def artifact_key(overrides: list[str]) -> str:
    """What decides a configuration's outputs, so its quality: the code that builds the artifact (the backend's
    module: PyTorch eager, TorchScript and torch.compile share one dynamic quantization), the precision and the
    quantization recipe (the int8 options). Layouts, threads, batching and allocators change the speed only: a
    configuration whose artifact missed the quality gate once misses it in every one of them."""
    from corescale.backends.options import Int8Options

    values = {override_key(o): o.split("=", 1)[1] for o in overrides}
    backend = values.get("backend", DEFAULT_BACKEND)
    code = BACKENDS[backend].backend.split(":")[0] if backend in BACKENDS else backend
    recipe = sorted((k, v) for k, v in values.items()
                    if k.startswith("backend.") and k.split(".", 1)[1] in Int8Options.int8_options())
    return json.dumps([code, values.get("precision", REFERENCE), recipe])


def complexity(overrides: list[str]) -> int:
    """How many settings differ from the out-of-box defaults (ties go to the simpler)."""
    defaults = {"backend": DEFAULT_BACKEND, "precision": REFERENCE, "allocator": "default", "openmp": "default",
                "instances": "1", "backend.fusion": "false", **SERVING_DEFAULTS}
    values = {override_key(o): o.split("=", 1)[1] for o in overrides}
    return sum(1 for k, v in values.items() if k in defaults and v != defaults[k]) + ("threads" in values)


@dataclass
class Tune:
    settings: TuneSettings
    cfg: BenchmarkConfig  # the user's overrides composed
    space: spaces.Space
    tune_dir: Path
    physical_cores: int
    screen_s: float
    machine: Machine | None = None  # when there is a price
    baseline: list[str] = field(default_factory=list)
    base: list[str] = field(default_factory=list)  # the user's overrides, output_dir pointing into the tune
    topology: Topology | None = None  # the machine the trials run on (a Ray node type's, probed)
    node_type: str | None = None  # executor=ray: the node type tuned
    nodes: int = 1  # trials in flight at once (one per node of the type)
    cpu_model: str = ""
    cpus: frozenset = frozenset()  # executor=ray: the (host, CPU) pairs the type's nodes measure on
    task: str = "encode"  # what the model computes (its head): judged by quality on real text, or (a plain
    # encoder) by drift
    reference: str = DEFAULT_BACKEND  # the out-of-box backend and drift reference (a model file: the one loading it)
    peer: list[str] = field(default_factory=list)  # the peer baseline's overrides (tune/peer.py); empty: none
    peer_label: str = ""
    peer_note: str = ""  # why no peer is measured
    isa: dict = field(default_factory=dict)  # the CPU flags the trials run on (tune/priors.py)
    model_size_m: float | None = None  # millions of encoder weights (tune/priors.py)
    bounds: SearchBounds | None = None  # each QPS search's wall-time bound (tune/budget.py); None: unbounded

    @property
    def on_ray(self) -> bool:
        return self.cfg.executor.name == "ray"

    @property
    def study_path(self) -> Path:
        return self.tune_dir / STUDY_FILE

    @property
    def machine_kind(self) -> MachineKind:
        """What the tune store matches earlier tunes by (tune/priors.py)."""
        return MachineKind(self.cpu_model, self.physical_cores, self.cfg.model, self.cfg.sequence_length,
                           self.settings.objective.scenario)

    def trial_overrides(self, suggested: list[str], duration: float) -> list[str]:
        extra = [f"duration={duration:g}", *self.fidelity(duration)]
        values = {override_key(o): o.split("=", 1)[1] for o in suggested}
        if reduced(values.get("precision")) and not TASKS[self.task].judged:  # drift vs fp32, same inputs
            # (a task with a head is judged by its quality on real text in every trial: min_quality)
            extra.append(f"reference={self.reference}")
            if self.settings.max_drift is not None:
                extra.append(f"drift_tolerance={self.settings.max_drift:g}")
        if not getattr(BACKENDS.get(values.get("backend", "")), "openmp", False):
            extra.append("openmp=default")
        return merge(self.base, suggested, extra)

    def fidelity(self, duration: float) -> list[str]:
        """A server screen's cheaper QPS search (the multi-fidelity of the server objective): LoadGen's fewest
        queries that can judge a p99, fewer steps and a coarser bracket; a full window searches as configured."""
        if self.cfg.scenario != "server" or duration >= self.cfg.duration:
            return []
        server = self.cfg.server
        bound = [] if self.bounds is None else [f"server.max_search_s={self.bounds.screen_s:g}"]
        return [f"server.min_query_count={min(server.min_query_count, SCREEN_QUERIES)}",
                f"server.max_steps={min(server.max_steps, SCREEN_STEPS)}",
                f"server.search_precision={max(server.search_precision, SCREEN_PRECISION):g}", *bound]

    def cost_of(self, record: TrialRecord) -> float | None:
        """US$ per 1M inferences: on the priced machine (measured, or its projection's slow end), else at the
        price of this machine's catalog kind or core-hour rate (analysis/pricing.py)."""
        rate = verdicts.samples_per_s(record)
        if rate is None:
            return None
        from corescale.analysis import cost
        from corescale.analysis.projection import measured_of
        from corescale.analysis.store import flatten

        row = flatten(record, Path("."))
        if self.machine is None:
            return self.price_of(record).per_million(rate)[0]
        measured = measured_of(row)
        found = cost.on_machine(self.machine, row, measured)
        total = measured.per_instance * int(row.get("instances") or 1)
        machine_rate = found.low * rate / total if found.copies and total else 0.0  # of the rate the tune saw
        return cost.cost_per_million(self.machine.price_per_hour, machine_rate)

    def price_of(self, record: TrialRecord):
        """The price of the layout `record` measured (pricing.Price), when no machine was priced."""
        from corescale.analysis.catalog import load_catalog
        from corescale.analysis.pricing import price_here
        from corescale.analysis.store import flatten

        return price_here(flatten(record, Path(".")), load_catalog())

    def cost_source(self, record: TrialRecord | None) -> str:
        """Where the cost figures' price comes from, in words."""
        if self.machine is not None:
            return (f"{self.machine.name} at US${self.machine.price_per_hour:g}/h" +
                    ("" if self.machine.measured_here else " (projected from this machine where it is another)"))
        return "no price given: " + (self.price_of(record).source if record is not None else "none measured")


def tune_name(settings: TuneSettings) -> str:
    blob = json.dumps(settings.identity(), sort_keys=True, default=str)
    return "tune-" + hashlib.sha256(blob.encode()).hexdigest()[:10]


def plan_tune(settings: TuneSettings, topology=None, kind=None, name: str | None = None) -> Tune:
    """Every check that needs no worker: the overrides, the space, the budget, the places written.
    kind: a probed Ray node type (fleet.NodeKind) the trials run on; name: the tune's folder (default: from
    the settings; a fleet's types share their fleet's)."""
    from corescale.machine import environment
    from corescale.machine.topology import Topology

    cfg = compose(merge(settings.overrides, scenario_overrides(settings)))
    if cfg.executor.name != "local" and kind is None:
        raise UserError("executor=ray: the tune probes the cluster's nodes first (corescale tune does)")
    topology = kind.topology if kind is not None else topology or Topology.from_sysfs()
    cores = len(topology.physical_cores)
    isa = kind.isa if kind is not None else environment.cpuinfo().isa
    model = tuned_model(cfg, settings)
    space = spaces.derive(cfg, settings.overrides, settings.space, cores, isa, model=model,
                          latency=settings.objective.name == "latency",
                          batch_key="server.max_batch" if settings.objective.scenario == "server" else "batch_size")
    if cfg.endpoint == MANAGED:
        served_precisions(space)
    screen = settings.screen or max(cfg.duration / 4, min(cfg.duration, 1.0))
    if screen > cfg.duration:
        raise UserError(f"tune.screen={screen:g} s is longer than the full window duration={cfg.duration:g} s")
    least = cfg.duration + LOAD_MARGIN_S
    if settings.budget_s is not None and settings.budget_s < least:
        raise UserError(f"budget={settings.budget_s:g}s is too small for one trial: each needs at least its "
                        f"window (duration={cfg.duration:g} s) plus {LOAD_MARGIN_S:g} s to start; allowed: "
                        f"budget >= {math.ceil(least)}s (a useful tune needs minutes: budget=5m)")
    machine = tune_machine(settings, kind)
    node_type = kind.node_type if kind is not None else None
    tune_dir = cfg.results_root / (name or tune_name(settings))
    if kind is not None:
        tune_dir = tune_dir / (node_type or "any-node")
    check_writable(tune_dir, "output_dir", directory=True)
    placed = [assignment("executor.node_type", node_type)] if node_type else []
    bounds = search_bounds(settings, cfg, screen)
    bounded = [f"server.max_search_s={bounds.full_s:g}"] if bounds and cfg.server.max_search_s is None else []
    base = merge([o for o in settings.overrides if override_key(o) != "output_dir"], scenario_overrides(settings),
                 placed, bounded, [assignment("output_dir", tune_dir)])
    if model.reference is not None and not model.head.entry.judged:
        raise UserError(f"reference={cfg.reference} judges a head's quality on real text; model '{cfg.model}' is "
                        f"task={model.task}, judged by drift against a backend in a tune: give pooling= (a head) "
                        "or leave reference= out")
    # out of the box: the PyTorch model, or the backend that loads a model file (reference=DIR stays in `base`:
    # every trial's quality is judged on the user's fp32 model)
    reference = quality_reference(replace(model, reference=None))
    tune = Tune(settings, cfg, space, tune_dir, cores, screen, machine, spaces.baseline_overrides(base, reference),
                base, topology, node_type, kind.nodes if kind is not None else 1,
                kind.cpu_model if kind is not None else "", kind.cpus if kind is not None else frozenset(),
                model.task, reference)
    found = peers.choose(settings.peer, cfg, model, base, settings.objective.scenario)
    tune.peer, tune.peer_label, tune.peer_note = found.overrides, found.label, found.note
    tune.bounds = bounds
    from corescale.tune.priors import model_size_m

    tune.isa, tune.model_size_m = dict(isa), model_size_m(model)
    tune.cpu_model = tune.cpu_model or environment.cpuinfo().model or ""
    plan_sweep([merge(c, [f"duration={cfg.duration:g}"]) for c in (tune.baseline, tune.peer) if c],
               topology)  # the baseline and the peer can run here
    return tune


def reduced(precision: str | None) -> bool:
    """A reduced precision counts only once it passes a drift check against the reference at REFERENCE (encode) or
    the quality gate (a head)."""
    return precision in PRECISIONS and PRECISIONS[precision].reduced


def served_precisions(space: spaces.Space) -> None:
    """endpoint=managed: no drift or quality check runs over HTTP, so the service is tuned in fp32 (a reduced
    precision is checked in process first, without endpoint=)."""
    left_out = sorted({p for found in space.precisions.values() for p in found if reduced(p)})
    space.precisions = {b: [p for p in found if not reduced(p)] for b, found in space.precisions.items()}
    space.backends = [b for b in space.backends if space.precisions.get(b)]
    if not space.backends:
        raise UserError(f"endpoint=managed tunes {REFERENCE} only (no drift or quality check runs over HTTP); "
                        f"measure {', '.join(left_out)} in process, without endpoint=")
    if left_out:
        space.notes.append(f"precision {', '.join(left_out)}: not with endpoint=managed (no drift or quality check "
                           "over HTTP)")


def tuned_model(cfg: BenchmarkConfig, settings: TuneSettings):
    """The tuned model (its task: max_drift judges only a plain encoder, a head is judged by quality)."""
    from corescale.workload.models import configured_model

    model = configured_model(cfg)
    if settings.max_drift is not None and model.head.entry.judged:
        raise UserError(f"max_drift judges a plain encoder's hidden state; model '{cfg.model}' is task={model.task}, "
                        "judged by its quality on real text: use min_quality= (docs/tasks.md)")
    return model


def tune_machine(settings: TuneSettings, kind):
    """The priced machine of cost figures: a catalog machine, or the measured one (a node type) at a price."""
    if settings.price_per_hour is None and not settings.machine:
        return None
    from dataclasses import replace

    from corescale.analysis.cost import choose_machine

    machine = choose_machine(settings.machine, settings.price_per_hour)
    if kind is not None and machine.measured_here and kind.node_type:
        machine = replace(machine, name=f"node type {kind.node_type}")
    return machine
