"""The tune's Optuna study (SQLite beside the results, WAL mode): opened or resumed, and its bookkeeping: each
Optuna trial's outcome, figures and constraint values kept in its user attributes and told to the sampler."""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from contextlib import contextmanager

from corescale.machine.lock import folder_lock
from corescale.tune import priors
from corescale.tune import verdict as verdicts
from corescale.tune.plan import Tune, artifact_key
from corescale.tune.settings import TuneSettings

RUNNING = ".running"  # the folder inside a tune's whose flock says the tune runs
# outcomes that measured nothing: they cost nothing and do not count as trials (CONVERGED bounds them)
FREE = ("invalid", "withheld", "deferred")


@contextmanager
def held(tune: Tune):
    """The tune's folder for this process alone while it searches and concludes (an flock on its RUNNING folder,
    not on the tune's folder itself: that one is the results root whose commit lock every trial takes): a second
    tune on it (the same command run twice) is refused with one line naming the first, which its recovery would
    otherwise break (_recover marks every RUNNING Optuna trial failed, the live one's included)."""
    with folder_lock(tune.tune_dir / RUNNING, f"the tune in {tune.tune_dir}",
                     "wait for it to end (the same command then resumes it), or give another output_dir"):
        yield


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
    study = optuna.create_study(storage=storage, study_name=study_name(tune), sampler=sampler, pruner=pruner,
                                direction=tune.settings.objective.direction, load_if_exists=True)
    _recover(study, tune)
    return study


def study_name(tune: Tune) -> str:
    """The tune's folder and its space's dimensions: a rerun on the same space resumes the study; one whose space
    changed (a library installed, a corescale whose dimensions differ) starts another in the same database, as
    Optuna refuses a parameter whose choices changed ("does not support dynamic value space"). Its measurements
    are found by key all the same."""
    dimensions = {k: v for k, v in tune.space.to_json().items() if k != "notes"}
    digest = hashlib.sha256(json.dumps(dimensions, sort_keys=True).encode()).hexdigest()[:8]
    return f"{tune.tune_dir.name}-{digest}"


def _recover(study, tune: Tune) -> None:
    """A trial left RUNNING by a killed tune (none runs now: `held`): asked again with the same parameters (its
    committed measurements are found in the store), the stale one marked failed.
    New study: the priors (tune.priors), then each backend's fastest and quality-safe corners first."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            study.enqueue_trial(trial.params, user_attrs={"resumed_from": trial.number})
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    if not trials:
        study.set_user_attr("settings", tune.settings.to_json())
        study.set_user_attr("space", tune.space.to_json())
        kind = tune.machine_kind
        read_earlier, lab = priors.SOURCES[tune.settings.priors]  # tune.priors: which priors seed the search
        earlier = priors.earlier_winners(tune.cfg.results_root, tune.tune_dir, kind) if read_earlier else []
        batch = int(tune.space.batch_sizes[0]) if len(tune.space.batch_sizes) == 1 else tune.cfg.batch_size
        starts = priors.starting(tune.space, tune.isa, tune.model_size_m, tune.settings.objective.scenario, batch,
                                 tune.settings.objective.name == "latency", earlier, lab)
        study.set_user_attr("starts", [f"{json.dumps(point, sort_keys=True)}: {why}" for point, why in starts])
        for point, _ in starts:
            study.enqueue_trial(point, skip_if_exists=True)



def measured_count(study) -> int:
    """Trials measured (a configuration asked again costs nothing and does not count: CONVERGED bounds it)."""
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False) if "repeat_of" not in t.user_attrs
               and t.user_attrs.get("outcome") not in FREE and (
        t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL and "reason" in
                                                               t.user_attrs)))


def tried(study) -> dict[str, dict]:
    """Configurations already tried in this study, by their overrides (a sampler may ask one again)."""
    return {json.dumps(t.user_attrs["overrides"]): t.user_attrs for t in study.get_trials(deepcopy=False)
            if "outcome" in t.user_attrs}


def tell_known(study, trial, earlier: dict, settings: TuneSettings) -> None:
    """Asked again: its outcome is known, nothing is measured."""
    from optuna.trial import TrialState

    for name in ("outcome", "value", "constraints", "screen", "full", "reason"):
        if name in earlier:
            trial.set_user_attr(name, earlier[name])
    trial.set_user_attr("repeat_of", earlier.get("repeat_of", earlier.get("number")))
    for name, value in zip(verdicts.violations({}, settings), earlier.get("constraints") or []):
        trial.set_constraint(name, value)
    value = earlier.get("value")
    if earlier["outcome"] == "complete" and value is not None:
        study.tell(trial, value)
    else:
        study.tell(trial, state=TrialState.PRUNED if earlier["outcome"] == "pruned" else TrialState.FAIL)


def missed_artifacts(study) -> dict[str, dict]:
    """The artifacts (plan.artifact_key) whose outputs missed the quality or drift gate, each with the trial that
    judged it first: a fact of the artifact, the same in every layout, thread count, batch and allocator."""
    found: dict[str, dict] = {}
    for t in study.get_trials(deepcopy=False):
        if "repeat_of" in t.user_attrs or "overrides" not in t.user_attrs or not deterministic_miss(t.user_attrs):
            continue
        found.setdefault(artifact_key(t.user_attrs["overrides"]), t.user_attrs)
    return found


def tell_withheld(study, trial, judged: dict, settings: TuneSettings) -> None:
    """A configuration whose artifact missed the quality gate in an earlier trial: pruned at once, nothing
    measured (its constraints violated, so the sampler learns the subtree is out)."""
    from optuna.trial import TrialState

    trial.set_user_attr("outcome", "withheld")
    trial.set_user_attr("number", trial.number)
    trial.set_user_attr("reason", f"its artifact missed the quality gate in trial {judged.get('number')} "
                                  f"({judged.get('label')}): not measured again")
    trial.set_user_attr("withheld_by", judged.get("number"))
    constrain(trial, {}, settings)
    if judged.get("value") is not None:
        trial.report(judged["value"], 1)
    study.tell(trial, state=TrialState.PRUNED)


def tried_overrides(study) -> list[list[str]]:
    """The overrides of every configuration tried so far (measured, or found invalid or withheld)."""
    return [t.user_attrs["overrides"] for t in study.get_trials(deepcopy=False)
            if "overrides" in t.user_attrs and t.user_attrs.get("outcome") not in (None, "deferred")]


def defer(study, trial, option: str, cheaper: str) -> None:
    """An expensive build asked before the cheaper one was measured: not measured now; the same parameters with
    the cheaper value are asked next (expensive builds last)."""
    from optuna.trial import TrialState

    trial.set_user_attr("outcome", "deferred")
    trial.set_user_attr("reason", f"backend.{option}={cheaper} builds faster and was not measured yet: it is "
                                  "measured first")
    params = {name: (cheaper if name.split("[")[0].endswith(f".{option}") else value)
              for name, value in trial.params.items()}
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(params, skip_if_exists=True)


def deterministic_miss(attrs: dict) -> bool:
    """Measured validly, but its outputs missed the quality or drift gate (a fact of the artifact, not noise)."""
    figs = attrs.get("full") or attrs.get("screen") or {}
    return bool(figs.get("valid")) and not (figs.get("quality_ok", True) and figs.get("drift_ok", True))


def tell_screen(study, trial, row: tuple, seen: dict, tune: Tune) -> dict | None:
    """Records the screen; its figures when it may be promoted (valid, feasible: reported at rung 1)."""
    from optuna.trial import TrialState

    record, path = row
    figs = verdicts.figures(record, tune.cost_of)
    trial.set_user_attr("screen", {**plain(figs), "path": str(path), "duration": tune.screen_s})
    trial.set_user_attr("constraints", list(verdicts.violations(figs, tune.settings).values()))
    metric = tune.settings.objective.metric
    key = json.dumps(trial.user_attrs["overrides"])
    if not figs.get("valid") or figs.get(metric) is None:
        constrain(trial, figs, tune.settings)
        trial.set_user_attr("reason", record.reason or figs.get("unestablished") or "no figures")
        trial.set_user_attr("outcome", "failed")  # failed: the sampler learns nothing from it (unknown, not 0)
        study.tell(trial, state=TrialState.FAIL)
    elif not verdicts.feasible(figs, tune.settings):
        constrain(trial, figs, tune.settings)
        trial.set_user_attr("outcome", "pruned")
        trial.set_user_attr("value", figs[metric])
        study.tell(trial, state=TrialState.PRUNED)
    else:
        trial.report(figs[metric], 1)
        return figs
    seen[key] = study.trials[trial.number].user_attrs
    return None


def tell_full(study, trial, row: tuple, tune: Tune) -> None:
    """Records the full window: the trial's value (complete), or failed without figures."""
    from optuna.trial import TrialState

    record, path = row
    metric = tune.settings.objective.metric
    full = verdicts.figures(record, tune.cost_of)
    trial.set_user_attr("full", {**plain(full), "path": str(path), "duration": tune.cfg.duration})
    constrain(trial, full, tune.settings)
    if full.get("valid") and full.get(metric) is not None:
        trial.set_user_attr("constraints", list(verdicts.violations(full, tune.settings).values()))
        trial.set_user_attr("outcome", "complete")
        trial.set_user_attr("value", full[metric])
        study.tell(trial, full[metric])
    else:
        trial.set_user_attr("reason", record.reason or full.get("unestablished") or "no figures")
        trial.set_user_attr("outcome", "failed")
        study.tell(trial, state=TrialState.FAIL)


def ranked_complete(study, settings: TuneSettings) -> list:
    """The complete, feasible trials (not repeats), best first."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE
            and "repeat_of" not in t.user_attrs and all(c <= 0 for c in t.user_attrs.get("constraints", [1]))]
    sign = -1 if settings.objective.direction == "maximize" else 1
    return sorted(done, key=lambda t: sign * t.value)


def best_text(study, settings: TuneSettings) -> str:
    best = ranked_complete(study, settings)
    if not best:
        return "best: none feasible yet"
    t = best[0]
    return f"best {t.user_attrs['value']:.4g} {settings.objective.unit} ({t.user_attrs['label']})"


def constrain(trial, figs: dict, settings: TuneSettings) -> None:
    """The decisive measurement's constraint values, for the sampler (c-TPE: feasible when all are <= 0; set
    once per trial). A measurement without figures violates every constraint."""
    values = verdicts.violations(figs, settings)
    for key, value in values.items():
        trial.set_constraint(key, value if figs.get("valid") else 1.0)



def plain(figs: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in figs.items()}
