"""The tune: an Optuna study (SQLite beside the results, WAL mode) whose every measurement is an ordinary trial
of the one local loop, so results, report and compare see them and a rerun resumes them by key.

1. baseline: out-of-box PyTorch (one instance on all cores, defaults), full window;
2. search: each Optuna trial is screened on a short window; successive halving (Optuna's
   SuccessiveHalvingPruner, rung = the screened figure) promotes the promising to a full window, the rest are
   pruned; a screen that breaks a constraint is pruned at once; the first trials take one backend each, at
   its fastest precision and the objective's known-good layout (space.starting_points);
3. final: the top k full-window configurations and the baseline are measured `tune.repeats` times, interleaved,
   each in fresh processes (the full-window run counts as the first repeat); verdict.py ranks them.

Killed at any point (SIGKILL included), the same command resumes: finished Optuna trials are in the database,
a trial that was running is asked again with the same parameters and its measurements, when committed, are
found in the store by key instead of being measured again.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.config import OPENMP_BACKENDS, BenchmarkConfig
from corescale.errors import UserError, check_writable
from corescale.measure.forkserver import ForkServers
from corescale.overrides import assignment, compose, override_key
from corescale.record.trial import TrialRecord
from corescale.trials.local import Listener, fork_workers
from corescale.trials.sweep import plan_sweep, run_sweep
from corescale.tune import space as spaces
from corescale.tune import verdict as verdicts
from corescale.tune.settings import LOAD_MARGIN_S, TuneSettings, scenario_overrides

if TYPE_CHECKING:
    import optuna

    from corescale.analysis.cost import Machine
    from corescale.machine.topology import Topology

STUDY_FILE = "study.db"
REDUCED = ("bf16", "int8")  # precisions that must pass a drift check against PyTorch fp32 to count
CONVERGED = 25  # the sampler proposed only measured configurations this many times in a row: stop searching


def merge(*groups: list[str]) -> list[str]:
    """Overrides, a later one replacing an earlier one of the same key (Hydra refuses duplicates)."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged[override_key(override)] = override
    return list(merged.values())


def describe(overrides: list[str]) -> str:
    """A short label of a configuration: what tells it apart from the defaults."""
    values = {override_key(o): o.split("=", 1)[1] for o in overrides}
    parts = [values.get("backend", "pytorch"), values.get("precision", "fp32")]
    if "instances" in values:
        parts.append(f"{values['instances']}×{values.get('cores_per_instance', '?')}c")
    else:
        parts.append("1×all")
    from corescale.backends import OPTIONS

    defaults = OPTIONS.get(parts[0], OPTIONS["pytorch"])()
    options = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("backend.")}
    parts += [f"{k}={v}" for k, v in options.items() if v != spaces.text(getattr(defaults, k, None))]
    for key, default in (("threads", None), ("batch_size", None), ("allocator", "default"), ("openmp", "default")):
        if key in values and values[key] != default:
            parts.append(f"{'bs' if key == 'batch_size' else key}={values[key]}")
    return " ".join(parts)


def complexity(overrides: list[str]) -> int:
    """How many settings differ from the out-of-box defaults (ties go to the simpler)."""
    defaults = {"backend": "pytorch", "precision": "fp32", "allocator": "default", "openmp": "default",
                "instances": "1", "backend.fusion": "false"}
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

    @property
    def on_ray(self) -> bool:
        return self.cfg.executor.name == "ray"

    @property
    def study_path(self) -> Path:
        return self.tune_dir / STUDY_FILE

    def trial_overrides(self, suggested: list[str], duration: float) -> list[str]:
        extra = [f"duration={duration:g}"]
        values = {override_key(o): o.split("=", 1)[1] for o in suggested}
        if values.get("precision") in REDUCED:  # drift checked against PyTorch fp32 on the same inputs
            extra.append("reference=pytorch")
            if self.settings.max_drift is not None:
                extra.append(f"drift_tolerance={self.settings.max_drift:g}")
        if values.get("backend") not in OPENMP_BACKENDS:
            extra.append("openmp=default")
        return merge(self.base, suggested, extra)

    def cost_of(self, record: TrialRecord) -> float | None:
        rate = verdicts.samples_per_s(record)
        if self.machine is None or rate is None:
            return None
        from corescale.analysis import cost
        from corescale.analysis.store import flatten

        _, copies = cost.basis(self.machine, flatten(record, Path(".")))
        return cost.cost_per_million(self.machine.price_per_hour, rate * copies)


def tune_name(settings: TuneSettings) -> str:
    blob = json.dumps(settings.identity(), sort_keys=True, default=str)
    return "tune-" + hashlib.sha256(blob.encode()).hexdigest()[:10]


def plan_tune(settings: TuneSettings, topology=None, kind=None, name: str | None = None) -> Tune:
    """Every check that needs no worker: the overrides, the space, the budget, the places written.
    kind: a probed Ray node type (fleet.NodeKind) the trials run on; name: the tune's folder (default: from
    the settings; a fleet's types share their fleet's)."""
    from corescale.machine import environment
    from corescale.machine.topology import Topology

    cfg = compose(settings.overrides)
    if cfg.executor.name != "local" and kind is None:
        raise UserError("executor=ray: the tune probes the cluster's nodes first (corescale tune does)")
    topology = kind.topology if kind is not None else topology or Topology.from_sysfs()
    cores = len(topology.physical_cores)
    isa = kind.isa if kind is not None else (environment.capture().get("cpu") or {}).get("isa") or {}
    space = spaces.derive(cfg, settings.overrides, settings.space, cores, isa,
                          latency=settings.objective.name == "latency",
                          batch_key="server.max_batch" if settings.objective.scenario == "server" else "batch_size")
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
    base = merge([o for o in settings.overrides if override_key(o) != "output_dir"], scenario_overrides(settings),
                 placed, [assignment("output_dir", tune_dir)])
    tune = Tune(settings, cfg, space, tune_dir, cores, screen, machine, spaces.baseline_overrides(base), base,
                topology, node_type, kind.nodes if kind is not None else 1,
                kind.cpu_model if kind is not None else "", kind.cpus if kind is not None else frozenset())
    plan_sweep([merge(tune.baseline, [f"duration={cfg.duration:g}"])], topology)  # the baseline can run here
    return tune


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


# --- the study ----------------------------------------------------------------------------------------------

def open_study(tune: Tune):
    """The Optuna study in SQLite (WAL: a reader never blocks the writer), created or resumed."""
    import optuna
    from sqlalchemy import event

    tune.tune_dir.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tune.study_path}", engine_kwargs={"connect_args":
                                                                                        {"timeout": 60}})
    engine = storage.engine

    @event.listens_for(engine, "connect")
    def wal(connection, _):  # every new connection: WAL journal, fsync at each commit
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")

    engine.dispose()  # connections made before the listener are gone
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # group=True: documented
    sampler = optuna.samplers.TPESampler(seed=tune.cfg.seed, multivariate=True, group=True,  # constraints: per trial
                                         n_startup_trials=min(10, max(3, (tune.settings.trials or 12) // 3)),
                                         constant_liar=tune.nodes > 1)  # trials in flight side by side
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=tune.settings.eta)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=tune.tune_dir.name, sampler=sampler, pruner=pruner,
                                direction=tune.settings.objective.direction, load_if_exists=True)
    _recover(study, tune)
    return study


def _recover(study, tune: Tune) -> None:
    """A trial left RUNNING by a killed tune: asked again with the same parameters (its committed measurements
    are found in the store), the stale one marked failed. New study: one trial per backend first."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            study.enqueue_trial(trial.params, user_attrs={"resumed_from": trial.number})
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    if not trials:
        study.set_user_attr("settings", tune.settings.describe())
        study.set_user_attr("space", tune.space.describe())
        for point in spaces.starting_points(tune.space, latency=tune.settings.objective.name == "latency"):
            study.enqueue_trial(point, skip_if_exists=True)


# --- running ------------------------------------------------------------------------------------------------

@dataclass
class Progress:
    """What the tune shows beside each trial: how far it is, the best so far, the ETA."""

    started: float
    elapsed_before: float
    budget_s: float | None
    trials: int | None
    done: int = 0
    best: str = "best: none yet"
    screen_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)
    stage: str = "baseline"

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def eta(self, reserve: float) -> float | None:
        if self.budget_s is not None:
            return max(0.0, self.budget_s - self.elapsed())
        if not self.screen_s:
            return None
        left = max(0, (self.trials or 0) - self.done)
        return left * (sum(self.screen_s) / len(self.screen_s)) + reserve

    def text(self, reserve: float) -> str:
        eta = self.eta(reserve)
        when = "ETA after the first trial" if eta is None else f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        total = f"/{self.trials}" if self.trials else ""
        return f"{self.stage} · trial {self.done}{total} · {self.best} · {when}"


class Tuner:
    def __init__(self, tune: Tune, listener_factory=None):
        self.tune = tune
        self.listener_factory = listener_factory or (lambda progress, reserve: Listener())
        self.study: optuna.Study | None = None  # both set while _run runs
        self.progress: Progress | None = None
        self.forkservers: ForkServers | None = None  # one set for the whole tune: workers start in milliseconds

    # one measurement (or a batch of them) through the one trial loop
    def measure(self, configs: list[list[str]], labels: list[str], repeats: int = 1,
                kind: str = "full") -> list[list[tuple]]:
        """Each config through the one trial loop ((record, path) per repeat); kind: screen | full, for the
        ETA's seconds per measurement."""
        if repeats > 1:
            configs = [merge(c, [f"repeats={repeats}"]) for c in configs]
        planned = plan_sweep(configs, self.tune.topology)
        for item, label in zip(planned, labels):
            item.label = label
            item.resume_root = self.tune.cfg.results_root  # earlier tunes and runs under the same root count
        started = time.monotonic()
        state = run_sweep(planned, self.listener_factory(self.progress, self.reserve()), forkservers=self.forkservers)
        measured = [row for row in state.rows if row.status != "skipped"]
        if measured and self.progress is not None:
            (self.progress.screen_s if kind == "screen" else self.progress.full_s).append(
                (time.monotonic() - started) / len(measured))
        return [[(r.record if r.record is not None else _read(r.path), r.path)
                 for r in sorted((r for r in state.rows if r.item is item), key=lambda r: r.repeat)]
                for item in planned]

    def reserve(self) -> float:
        """Seconds the final stage will take: (top k + baseline) × the repeats still to measure."""
        p = self.progress
        if p is None:
            return 0.0
        if p.full_s:
            full = sum(p.full_s) / len(p.full_s)
        elif p.screen_s:
            full = sum(p.screen_s) / len(p.screen_s) + self.tune.cfg.duration - self.tune.screen_s
        else:
            full = self.tune.cfg.duration + LOAD_MARGIN_S
        return (self.tune.settings.top_k + 1) * (self.tune.settings.repeats - 1) * full

    def run(self) -> dict:
        if self.tune.on_ray or not fork_workers():  # Ray nodes start their workers themselves
            return self._run()
        with ForkServers.temporary() as servers:
            self.forkservers = servers
            try:
                return self._run()
            finally:
                self.forkservers = None

    def _run(self) -> dict:
        import optuna

        tune = self.tune
        self.study = study = open_study(tune)
        self.progress = Progress(time.monotonic(), float(study.user_attrs.get("elapsed_s", 0.0)),
                                 tune.settings.budget_s, tune.settings.trials)
        self._save_elapsed()
        full = tune.cfg.duration
        self.measure([merge(tune.baseline, [f"duration={full:g}"])], ["baseline: out-of-box pytorch"])
        self.progress.stage = "search"
        seen = self._seen()
        again = 0  # suggestions in a row that were measured already
        while not self._done(seen) and again < CONVERGED:
            batch = []  # one trial per node in flight (one here, on this machine)
            for _ in range(self._width()):
                trial = study.ask()
                batch.append((trial, spaces.suggest(trial, tune.space)))
            self.progress.done = self._count()
            keys = [json.dumps(suggested) for _, suggested in batch]
            fresh = [key not in seen and key not in keys[:i] for i, key in enumerate(keys)]
            again = again + len(batch) if not any(fresh) else 0
            self._search(study, batch, seen)
            again += sum(seen[key].get("outcome") == "invalid" for key in keys)  # cost nothing, bounded too
            self._save_elapsed()
            self.progress.best = self._best_text()
        self.progress.stage = "final"
        finalists = self._final()
        self._save_elapsed()
        return {"study": study, "finalists": finalists, "optuna": optuna}

    def _count(self) -> int:
        """Trials measured (a configuration asked again costs nothing and does not count: CONVERGED bounds it)."""
        from optuna.trial import TrialState

        return sum(1 for t in self._running()[0].get_trials(deepcopy=False) if "repeat_of" not in t.user_attrs
                   and t.user_attrs.get("outcome") != "invalid" and (
            t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL and "reason" in
                                                                   t.user_attrs)))

    def _seen(self) -> dict[str, dict]:
        """Configurations already tried in this study, by their overrides (a sampler may ask one again)."""
        trials = self._running()[0].get_trials(deepcopy=False)
        return {json.dumps(t.user_attrs["overrides"]): t.user_attrs for t in trials if "outcome" in t.user_attrs}

    def _done(self, seen: dict) -> bool:
        p = self._running()[1]
        if len(seen) >= self.tune.space.size():
            return True  # every configuration of the space was tried
        if p.trials is not None and self._count() >= p.trials:
            return True
        if p.budget_s is not None and self._count() >= 1:  # a budget that allows the baseline allows one trial
            per = (sum(p.screen_s) / len(p.screen_s)) if p.screen_s else self.tune.screen_s + LOAD_MARGIN_S
            return p.elapsed() + per + self.reserve() > p.budget_s
        return False

    def _width(self) -> int:
        """Trials to ask at once: one per node, no more than the trial budget has left."""
        width, trials = self.tune.nodes, self._running()[1].trials
        if trials is not None:
            width = min(width, trials - self._count())
        return max(1, width)

    def _search(self, study, batch: list[tuple], seen: dict) -> None:
        """Screens the batch side by side, promotes the promising to full windows side by side; a configuration
        asked again (here or earlier in the batch) is told its known outcome."""
        from optuna.trial import TrialState

        tune = self.tune
        screens: list[tuple] = []  # (trial, suggested) to screen
        later: list[tuple] = []  # (trial, key) asked again within the batch
        for trial, suggested in batch:
            key = json.dumps(suggested)
            trial.set_user_attr("overrides", suggested)
            trial.set_user_attr("label", describe(suggested))
            if key in seen:
                self._tell_known(study, trial, seen[key])
            elif any(json.dumps(s) == key for _, s in screens):
                later.append((trial, key))
            elif self._valid(study, trial, suggested, seen):
                trial.set_user_attr("number", trial.number)
                screens.append((trial, suggested))
        measured = self.measure([tune.trial_overrides(s, tune.screen_s) for _, s in screens],
                                [f"screen {describe(s)}" for _, s in screens], kind="screen") if screens else []
        screened = [(trial, suggested, self._screened(study, trial, rows[0], seen))
                    for (trial, suggested), rows in zip(screens, measured)]
        promoted = [(trial, suggested) for trial, suggested, figs in screened if figs is not None]
        for trial, suggested, figs in screened:  # reported together: the pruner compares each with the others
            if figs is not None and trial.should_prune():
                _constrain(trial, figs, tune.settings)
                trial.set_user_attr("outcome", "pruned")
                trial.set_user_attr("value", figs[tune.settings.objective.metric])
                study.tell(trial, state=TrialState.PRUNED)
                seen[json.dumps(suggested)] = study.trials[trial.number].user_attrs
        promoted = [(t, s) for t, s in promoted if json.dumps(s) not in seen]
        fulls = self.measure([tune.trial_overrides(s, tune.cfg.duration) for _, s in promoted],
                             [f"full {describe(s)}" for _, s in promoted]) if promoted else []
        for (trial, suggested), rows in zip(promoted, fulls):
            self._finish(study, trial, rows[0], seen)
            seen[json.dumps(suggested)] = study.trials[trial.number].user_attrs
        for trial, key in later:
            self._tell_known(study, trial, seen[key])

    def _tell_known(self, study, trial, earlier: dict) -> None:
        """Asked again: its outcome is known, nothing is measured."""
        from optuna.trial import TrialState

        for name in ("outcome", "value", "constraints", "screen", "full", "reason"):
            if name in earlier:
                trial.set_user_attr(name, earlier[name])
        trial.set_user_attr("repeat_of", earlier.get("repeat_of", earlier.get("number")))
        for name, value in zip(verdicts.violations({}, self.tune.settings), earlier.get("constraints") or []):
            trial.set_constraint(name, value)
        value = earlier.get("value")
        if earlier["outcome"] == "complete" and value is not None:
            study.tell(trial, value)
        else:
            study.tell(trial, state=TrialState.PRUNED if earlier["outcome"] == "pruned" else TrialState.FAIL)

    def _valid(self, study, trial, suggested: list[str], seen: dict) -> bool:
        """Options that do not combine (backend.linear=onednn with int8) are an uncounted failed trial."""
        from optuna.trial import TrialState

        try:
            plan_sweep([self.tune.trial_overrides(suggested, self.tune.screen_s)], self.tune.topology)
        except UserError as invalid:
            trial.set_user_attr("reason", f"not a valid combination: {invalid}")
            trial.set_user_attr("outcome", "invalid")
            study.tell(trial, state=TrialState.FAIL)
            seen[json.dumps(suggested)] = study.trials[trial.number].user_attrs
            return False
        return True

    def _screened(self, study, trial, row: tuple, seen: dict) -> dict | None:
        """Records the screen; its figures when it may be promoted (valid, feasible: reported at rung 1)."""
        from optuna.trial import TrialState

        tune = self.tune
        record, path = row
        figs = verdicts.figures(record, tune.cost_of)
        trial.set_user_attr("screen", {**_plain(figs), "path": str(path), "duration": tune.screen_s})
        trial.set_user_attr("constraints", list(verdicts.violations(figs, tune.settings).values()))
        metric = tune.settings.objective.metric
        key = json.dumps(trial.user_attrs["overrides"])
        if not figs.get("valid") or figs.get(metric) is None:
            _constrain(trial, figs, tune.settings)
            trial.set_user_attr("reason", record.reason or "no figures")
            trial.set_user_attr("outcome", "failed")
            study.tell(trial, state=TrialState.FAIL)
        elif not verdicts.feasible(figs, tune.settings):
            _constrain(trial, figs, tune.settings)
            trial.set_user_attr("outcome", "pruned")
            trial.set_user_attr("value", figs[metric])
            study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.report(figs[metric], 1)
            return figs
        seen[key] = study.trials[trial.number].user_attrs
        return None

    def _finish(self, study, trial, row: tuple, seen: dict) -> None:
        from optuna.trial import TrialState

        tune = self.tune
        record, path = row
        metric = tune.settings.objective.metric
        full = verdicts.figures(record, tune.cost_of)
        trial.set_user_attr("full", {**_plain(full), "path": str(path), "duration": tune.cfg.duration})
        _constrain(trial, full, tune.settings)
        if full.get("valid") and full.get(metric) is not None:
            trial.set_user_attr("constraints", list(verdicts.violations(full, tune.settings).values()))
            trial.set_user_attr("outcome", "complete")
            trial.set_user_attr("value", full[metric])
            study.tell(trial, full[metric])
        else:
            trial.set_user_attr("reason", record.reason or "no figures")
            trial.set_user_attr("outcome", "failed")
            study.tell(trial, state=TrialState.FAIL)

    def _best_text(self) -> str:
        best = self._ranked_complete()
        if not best:
            return "best: none feasible yet"
        t = best[0]
        return f"best {t.user_attrs['value']:.4g} {self.tune.settings.objective.unit} ({t.user_attrs['label']})"

    def _ranked_complete(self):
        from optuna.trial import TrialState

        settings = self.tune.settings
        done = [t for t in self._running()[0].get_trials(deepcopy=False) if t.state == TrialState.COMPLETE
                and "repeat_of" not in t.user_attrs and all(c <= 0 for c in t.user_attrs.get("constraints", [1]))]
        sign = -1 if settings.objective.direction == "maximize" else 1
        return sorted(done, key=lambda t: sign * t.value)

    def _final(self) -> list[verdicts.Finalist]:
        """The top k and the baseline, `tune.repeats` each, interleaved, fresh processes each."""
        tune = self.tune
        top = self._ranked_complete()[:tune.settings.top_k]
        if not top:  # nothing feasible: the candidates closest to the constraints are measured for the verdict
            tried = [t for t in self._running()[0].get_trials(deepcopy=False) if "screen" in t.user_attrs
                     and "repeat_of" not in t.user_attrs and t.user_attrs["screen"].get("valid")]
            top = sorted(tried, key=lambda t: sum(max(0.0, c) for c in t.user_attrs.get("constraints", [])
                                                  if math.isfinite(c)))[:tune.settings.top_k]
        configs = [tune.trial_overrides(t.user_attrs["overrides"], tune.cfg.duration) for t in top]
        labels = [t.user_attrs["label"] for t in top]
        configs.append(merge(tune.baseline, [f"duration={tune.cfg.duration:g}"]))
        labels.append("baseline: out-of-box pytorch")
        results = self.measure(configs, [f"final {label}" for label in labels], repeats=tune.settings.repeats)
        finalists = []
        for overrides, label, rows, suggested in zip(configs, labels, results,
                                                     [t.user_attrs["overrides"] for t in top] + [[]]):
            records = [record for record, _ in rows]
            finalists.append(verdicts.Finalist(
                label, overrides, records, [str(path) for _, path in rows],
                [verdicts.figures(r, tune.cost_of) for r in records], baseline=not suggested,
                complexity=complexity(suggested), cores=_cores_used(records)))
        return finalists

    def _running(self) -> tuple[optuna.Study, Progress]:
        assert self.study is not None and self.progress is not None, "the search runs inside _run"
        return self.study, self.progress

    def _save_elapsed(self) -> None:
        study, progress = self._running()
        study.set_user_attr("elapsed_s", progress.elapsed())


def _constrain(trial, figs: dict, settings: TuneSettings) -> None:
    """The decisive measurement's constraint values, for the sampler (c-TPE: feasible when all are <= 0; set
    once per trial). A measurement without figures violates every constraint."""
    values = verdicts.violations(figs, settings)
    for key, value in values.items():
        trial.set_constraint(key, value if figs.get("valid") else 1.0)


def _cores_used(records: list[TrialRecord]) -> int:
    for record in records:
        if record.placed:
            return sum(len(inst.cpus) for inst in record.placed)
    return 0


def _read(path):
    from corescale.record.files import read_result

    return read_result(path)


def _plain(figs: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in figs.items()}

