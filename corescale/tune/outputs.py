"""The tune's document (tune.json: settings, space, every Optuna trial, the finalists, the verdict) and the
sentences that state the recommendation; the report and the console draw from these."""

from __future__ import annotations

import math
import time
from pathlib import Path

from corescale.record.files import write_json_atomic
from corescale.record.repeats import MIN_REPEATS, NO_INTERVAL, Interval
from corescale.tune import recipe as recipes
from corescale.tune.coverage import coverage
from corescale.tune.document import (
    TUNE_FILE,
    Figure,
    Speedup,
    TunedFinalist,
    TuneDocument,
    TuneObjective,
    TuneTrial,
)
from corescale.tune.plan import Tune
from corescale.tune.spent import spent
from corescale.tune.verdict import PRACTICAL, Finalist, Verdict, closest, decide

BUNDLE = "bundle"
METRICS = ("throughput", "p50_ms", "p99_ms", "cost_per_1m", "cost_per_1m_tokens", "memory_gb", "drift", "quality")


def interval_json(interval: Interval) -> Figure:
    def clean(value):
        return None if value is None or not math.isfinite(value) else value

    return Figure(clean(interval.mean), clean(interval.low), clean(interval.high), interval.n,
                  list(interval.values), interval.usable)


def role(f: Finalist, verdict: Verdict) -> str:
    if f is verdict.winner:  # the out-of-box baseline too, when nothing measured beats it
        return "winner"
    if f.baseline:
        return "baseline"
    if f.peer:
        return "peer"
    if f.label in verdict.tie:
        return "tie"
    if f in verdict.ranked:
        return "runner-up"
    return "withheld (quality)" if f.quality_withheld else "infeasible"


def finalist_json(f: Finalist, verdict: Verdict, settings) -> TunedFinalist:
    return TunedFinalist(label=f.label, role=role(f, verdict), overrides=list(f.overrides), baseline=f.baseline,
                         paths=list(f.paths), cores=f.cores, complexity=f.complexity,
                         feasible=bool(f in verdict.ranked or ((f.baseline or f.peer) and f.feasible(settings))),
                         tied=f.label in verdict.tie, quality_metric=quality_metric(f),
                         **{m: interval_json(f.interval(m)) for m in METRICS})


def quality_metric(f: Finalist) -> str | None:
    """The name of the quality figure shown (the gate's first metric), from any of its records."""
    for record in f.records:
        if record.quality is not None and record.quality.gate:
            return record.quality.gate[0].split(">")[0].split("<")[0]
    return None


def trials_json(study) -> list[TuneTrial]:
    from optuna.trial import TrialState

    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:  # a starting point still queued when the budget ran out: never asked
            continue
        rows.append(TuneTrial.from_dict({
            "number": t.number, "state": t.state.name, "params": t.params, "value": t.value,
            "label": t.user_attrs.get("label"), "overrides": t.user_attrs.get("overrides"),
            "screen": t.user_attrs.get("screen"), "full": t.user_attrs.get("full"),
            "constraints": t.user_attrs.get("constraints"), "reason": t.user_attrs.get("reason"),
            "repeat_of": t.user_attrs.get("repeat_of"), "outcome": t.user_attrs.get("outcome"),
            "started": t.datetime_start.timestamp() if t.datetime_start else None,
            "finished": t.datetime_complete.timestamp() if t.datetime_complete else None}, f"trial {t.number}"))
    return rows


def importances(study) -> dict[str, float]:
    """optuna.importance over the finished trials (empty when there are too few, or one parameter)."""
    import optuna
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if len(done) < 2 or len({k for t in done for k in t.params}) < 1:
        return {}
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except (RuntimeError, ValueError, ZeroDivisionError):
        return {}


def tie_words(verdict: Verdict, metric: str) -> str:
    """A tie in a sentence. Means within PRACTICAL are a statistical tie (the cheaper/simpler first); means further
    apart that the repeats cannot separate are said to be that, with how far apart and over how few repeats (two
    repeats of 480 and 616 QPS against 31 and 62 is p = 0.06: "tie" would misread an 11x gap)."""
    test = f"p = {verdict.tie_p:.2f}, Welch's t on the logarithms of the repeats"
    if verdict.tie_simpler_first:
        return f"statistical tie ({test}) between {' and '.join(verdict.tie)}: the cheaper/simpler first"
    group = [f for f in verdict.ranked if f.label in verdict.tie]
    means = [f.interval(metric).mean for f in group]
    spread = max(means) / min(means) if min(means) > 0 else math.inf
    repeats = min(f.values(metric).size for f in group)
    return (f"not separated by {repeats} repeat(s) each ({test}): {' and '.join(verdict.tie)}, means {spread:.2f}x "
            f"apart: the faster first (more than {PRACTICAL:.0%} apart is not the same in practice; more repeats "
            "may separate them)")


def headline(tune: Tune, verdict: Verdict) -> list[str]:
    """The recommendation in sentences (or why there is none, and the closest)."""
    objective = tune.settings.objective
    winner = verdict.winner
    if winner is None:
        near = closest(verdict.infeasible, tune.settings)
        if near is None:
            return ["no configuration was measured successfully: see the failed trials in the results"]
        return [f"no configuration meets the constraints; the closest: {near.label} — p99 "
                f"{near.interval('p99_ms').mean:.2f} ms, {near.interval('throughput').mean:.2f} samples/s, "
                f"memory {near.interval('memory_gb').mean:.2f} GB"]
    where = f" on node type {tune.node_type}" if tune.node_type else ""
    lines = [f"recommended{where}: {winner.label} — {objective.name} "
             f"{winner.interval(objective.metric).text(objective.unit, 4 if objective.name == 'cost' else 2)}"
             + quality_words(winner)]
    if verdict.tie:
        lines.append(tie_words(verdict, objective.metric))
    if verdict.speedup is not None and verdict.baseline is not None:
        at_most, at_least, why = bound_words(verdict.baseline)
        spread = ratio_words(verdict.speedup, winner, verdict.baseline)
        lines.append(f"{at_most}{verdict.speedup[0]:.2f}× the out-of-box throughput ({spread}; out-of-box PyTorch "
                     f"{at_least}{verdict.baseline.interval('throughput').mean:.2f} samples/s{why})")
    if verdict.speedup_at_least is not None and verdict.baseline is not None:
        lines.append(f"≥ {verdict.speedup_at_least:.2f}× the out-of-box throughput (out-of-box PyTorch met the SLO "
                     f"at no rate tested, the lowest {verdict.baseline.serves_below:g} QPS: it serves less than "
                     "that)")
    if verdict.peer_speedup is not None and verdict.peer is not None:
        lines.append(peer_words(verdict.peer, verdict.peer_speedup, winner))
    withheld = [f for f in verdict.infeasible if f.quality_withheld]
    if withheld:
        rate = withheld[0].interval("throughput").mean
        at = f"at {rate:.2f} samples/s" if math.isfinite(rate) else "(its QPS search skipped: quality is judged first)"
        lines.append(f"withheld (quality): {len(withheld)} configuration(s) whose outputs miss the gate, e.g. "
                     f"{withheld[0].label} {at}" + quality_words(withheld[0]))
    return lines


def bound_words(denominator: Finalist) -> tuple[str, str, str]:
    """('≤ ', '≥ ', why) before a ratio over `denominator`, before its figure and after it, when its QPS is only
    a lower bound; empty words otherwise."""
    if not denominator.open_ended:
        return "", "", ""
    return "≤ ", "≥ ", ": its QPS search was bounded before it narrowed to its precision"


def peer_words(peer: Finalist, speedup: tuple[float, float, float], winner: Finalist) -> str:
    """'4.10× sentence-transformers encode() (95 % CI 3.60 – 4.70×; 41.2 samples/s, cosine_p1 1.0000 ...)'."""
    at_most, at_least, why = bound_words(peer)
    spread = ratio_words(speedup, winner, peer)
    return (f"{at_most}{speedup[0]:.2f}× {peer.label.removeprefix('peer: ')} ({spread}; the peer "
            f"{at_least}{peer.interval('throughput').mean:.2f} samples/s, out of the box on the same cores, texts and "
            f"batch{why}" + quality_words(peer) + ")")


def ratio_words(speedup: tuple[float, float, float], over: Finalist, under: Finalist) -> str:
    """A ratio's bootstrap interval where a reader can use it (MIN_REPEATS repeats each or more, narrower than the
    ratio), else what the repeats give: 'over 2 and 2 repeats, no usable 95 % interval; the repeats' ratios 406.01 –
    1898.65×' (the least and the most one repeat of `over` over one of `under`)."""
    ratio, low, high = speedup
    a, b = over.values("throughput"), under.values("throughput")
    if min(a.size, b.size) >= MIN_REPEATS and high - low <= ratio:
        return f"95 % CI {low:.2f} – {high:.2f}×"
    return (f"over {a.size} and {b.size} repeats, {NO_INTERVAL}; the repeats' ratios {a.min() / b.max():.2f} – "
            f"{a.max() / b.min():.2f}×")


def quality_words(f: Finalist) -> str:
    """'; quality: cosine_p1 0.9990, recall_at_10 1.0000 vs pytorch fp32' from its first checked record."""
    found = next((r.quality for r in f.records if r.quality is not None), None)
    return f"; quality: {found.summary()} vs {found.reference}" if found else ""


def document(tune: Tune, study, verdict: Verdict, finalists: list[Finalist], recipe: dict | None,
             search_end: str | None = None) -> TuneDocument:
    objective = tune.settings.objective
    trials = trials_json(study)
    elapsed = study.user_attrs.get("elapsed_s")
    finalist_rows = [finalist_json(f, verdict, tune.settings) for f in verdict.ranked + verdict.infeasible
                     if f is not verdict.baseline]  # out-of-box has its own entry, winner or not
    baseline = None if verdict.baseline is None else finalist_json(verdict.baseline, verdict, tune.settings)
    peer = None if verdict.peer is None else finalist_json(verdict.peer, verdict, tune.settings)
    rows = [*finalist_rows, *(r for r in (baseline, peer) if r is not None)]
    return TuneDocument(
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), tune_dir=str(tune.tune_dir),
        settings=tune.settings.to_json(), space=tune.space.to_json(), space_size=tune.space.size(),
        screen_s=tune.screen_s, duration_s=tune.cfg.duration, physical_cores=tune.physical_cores,
        node_type=tune.node_type, nodes=tune.nodes, machine=None if tune.machine is None else tune.machine.name,
        objective=TuneObjective(objective.name, objective.metric, objective.direction, objective.unit),
        elapsed_s=elapsed, trials=trials, importances=importances(study), finalists=finalist_rows,
        baseline=baseline, peer=peer,
        peer_speedup=None if verdict.peer_speedup is None or verdict.peer is None
        else Speedup(*verdict.peer_speedup, upper_bound=verdict.peer.open_ended),
        peer_note=tune.peer_note or None,
        winner=None if verdict.winner is None else verdict.winner.label,
        tie=list(verdict.tie), tie_p=verdict.tie_p,
        speedup=None if verdict.speedup is None or verdict.baseline is None
        else Speedup(*verdict.speedup, upper_bound=verdict.baseline.open_ended),
        speedup_at_least=verdict.speedup_at_least,
        headline=headline(tune, verdict), recipe=recipe, cost_source=cost_source(tune, verdict),
        search_end=search_end, coverage=coverage(trials, tune.space, objective.metric, objective.direction),
        machine_kind=tune.machine_kind.to_json(), starts=list(study.user_attrs.get("starts", [])),
        priors=tune.settings.priors,
        search_bounds=tune.bounds,
        spent=None if elapsed is None else spent(trials, rows, elapsed, tune.tune_dir), study=study.study_name)


def cost_source(tune: Tune, verdict: Verdict) -> str:
    """Where the cost column's price comes from (the recommended configuration's, when the price is per core)."""
    from pathlib import Path

    from corescale.record.files import read_result

    chosen = verdict.winner or verdict.baseline
    record = read_result(Path(chosen.paths[0])) if chosen is not None and chosen.paths else None
    return tune.cost_source(record)


def write_outputs(tune: Tune, study, verdict: Verdict, finalists: list[Finalist],
                  search_end: str | None = None) -> TuneDocument:
    recipe: dict | None = None
    winner = verdict.winner
    if winner is not None:
        record = next(r for r in winner.records if r.valid_ok)
        summary = "\n".join([f"corescale tune recipe: {winner.label}", *headline(tune, verdict),
                             f"measured on {record.environment.cpu.model or '?'}, "
                             f"{tune.physical_cores} physical cores"
                             + (f" (Ray node type {tune.node_type})" if tune.node_type else "")])
        paths = recipes.write(tune.tune_dir / recipes.RECIPE_DIR, record, winner.overrides, summary)
        recipe = {name: str(path) for name, path in paths.items()}  # and the run line (a list of words)
        recipe["run_line"] = recipes.run_line(winner.overrides)
        recipe["key"] = record.trial_key
        recipe.update(winner_bundle(tune.tune_dir / BUNDLE, record))
        if record.config.endpoint:  # measured as a service: that service's overrides
            recipe["serve_words"] = recipes.serve_words(winner.overrides)
    doc = document(tune, study, verdict, finalists, recipe, search_end)
    write_json_atomic(tune.tune_dir / TUNE_FILE, doc.to_dict())
    return doc


def winner_bundle(directory: Path, record) -> dict[str, str]:
    """The winner's deployment bundle (`corescale serve DIR`), replacing an earlier tune's; when it cannot be
    written (a preset without a tokenizer, an artifact built on another node), why not."""
    from corescale.errors import UserError
    from corescale.serve import bundle

    try:
        return {"bundle": str(bundle.write(directory, record, replace=True))}
    except UserError as exc:
        return {"bundle_skipped": str(exc)}


def write_verdict(tune: Tune, outcome: dict) -> TuneDocument:
    """The verdict over a searched tune's finalists (Tuner.run's outcome), written with its outputs: the
    document."""
    finalists = outcome["finalists"]
    baseline = next((f for f in finalists if f.baseline), None)
    peer = next((f for f in finalists if f.peer), None)
    verdict = decide([f for f in finalists if not (f.baseline or f.peer)], baseline, tune.settings.objective,
                     tune.settings, peer)
    return write_outputs(tune, outcome["study"], verdict, finalists, outcome.get("search_end"))


def used_results(tune: Tune, doc: TuneDocument):
    """The results this tune used, wherever they were measured (earlier tunes and runs under the same
    output_dir are resumed by key): the report's table (a store.Table)."""
    from corescale.analysis import store

    used = {str(Path(p).resolve()) for p in doc.result_paths()}
    table = store.load(tune.cfg.results_root, latest=False)
    keep = table.frame["path"].map(lambda p: str(Path(p).resolve()) in used)
    return store.Table(table.frame[keep].reset_index(drop=True), table.problems, table.unfinished)
