"""The tune: an Optuna study (SQLite beside the results, WAL mode) whose every measurement is an ordinary trial
of the one local loop, so results, report and compare see them and a rerun resumes them by key.

1. baseline: out-of-box PyTorch (one instance on all cores, defaults), full window;
   and the peer baseline (tune/peer.py: sentence-transformers' encode() for embed), full window;
2. search: each Optuna trial is screened on a short window; successive halving (Optuna's
   SuccessiveHalvingPruner, rung = the screened figure) promotes the promising to a full window, the rest are
   pruned; a screen that breaks a constraint is pruned at once; the first trials are the priors (tune.priors:
   earlier tunes' winners, PRIORS), then each backend at its fastest and its quality-safe precision at the
   objective's known-good corner (priors.starting, space.starting_points);
3. final: the top k full-window configurations and the baseline are measured `tune.repeats` times, interleaved,
   each in fresh processes (the full-window run counts as the first repeat); verdict.py ranks them.

Killed at any point (SIGKILL included), the same command resumes: finished Optuna trials are in the database,
a trial that was running is asked again with the same parameters and its measurements, when committed, are
found in the store by key instead of being measured again.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING

from corescale.errors import UserError
from corescale.measure.forkserver import ForkServers
from corescale.record.trial import TrialRecord
from corescale.trials.local import Listener, fork_workers
from corescale.trials.sweep import plan_sweep, run_sweep
from corescale.tune import space as spaces
from corescale.tune import study as studies
from corescale.tune import verdict as verdicts
from corescale.tune.plan import Tune, artifact_key, complexity, config_label, merge
from corescale.tune.progress import Progress
from corescale.tune.settings import LOAD_MARGIN_S, MAX_FINAL_REPEATS, budget_text

if TYPE_CHECKING:
    import optuna

CONVERGED = 25  # the sampler proposed only measured configurations this many times in a row: stop searching


class Tuner:
    def __init__(self, tune: Tune, listener_factory=None):
        self.tune = tune
        self.listener_factory = listener_factory or (lambda progress, reserve: Listener())
        self.study: optuna.Study | None = None  # both set while _run runs
        self.progress: Progress | None = None
        self.forkservers: ForkServers | None = None  # one set for the whole tune: workers start in milliseconds
        self.search_end = ""  # why the search stopped, in words (tune.json's search_end; the console prints it)
        self.final_end = ""  # why the final stage stopped before its last repeat, in words

    # one measurement (or a batch of them) through the one trial loop
    def run_trials(self, configs: list[list[str]], labels: list[str], repeats: int = 1,
                kind: str = "full") -> list[list[tuple]]:
        """Each config through the one trial loop ((record, path) per repeat); kind: screen | full | fixed (the
        baseline and the peer), for the ETA's and the final stage's seconds per measurement."""
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
            seconds = {"screen": self.progress.screen_s, "full": self.progress.full_s, "fixed": self.progress.fixed_s}
            seconds[kind].append((time.monotonic() - started) / len(measured))
        return [[(r.record if r.record is not None else _read(r.path), r.path)
                 for r in sorted((r for r in state.rows if r.item is item), key=lambda r: r.repeat)]
                for item in planned]

    def reserve(self) -> float:
        """Seconds the final stage will take (Progress.reserve; none before the tune has started)."""
        return 0.0 if self.progress is None else self.progress.reserve(self.tune)

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
        self.study = study = studies.open_study(tune)
        self.progress = Progress(time.monotonic(), float(study.user_attrs.get("elapsed_s", 0.0)),
                                 tune.settings.budget_s, tune.settings.trials)
        self._save_elapsed()
        full = tune.cfg.duration
        self.run_trials([merge(tune.baseline, [f"duration={full:g}"])], ["baseline: out-of-box pytorch"], kind="fixed")
        if tune.peer:
            self.run_trials([merge(tune.peer, [f"duration={full:g}"])], [tune.peer_label], kind="fixed")
        self.progress.stage = "search"
        seen = studies.tried(study)
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
            again += sum(study.trials[t.number].user_attrs.get("outcome") in studies.FREE
                         for t, _ in batch)  # cost nothing, bounded too
            self._save_elapsed()
            self.progress.best = studies.best_text(study, tune.settings)
        if again >= CONVERGED:
            self.search_end = f"the sampler proposed only measured configurations {CONVERGED} times in a row"
        self.progress.stage = "final"
        finalists = self._final()
        self._save_elapsed()
        searched = f"{len(seen)} of the space's {tune.space.size()} configurations searched: "
        return {"study": study, "finalists": finalists, "optuna": optuna,
                "search_end": searched + self.search_end + self.final_end}

    def _done(self, seen: dict) -> bool:
        """Whether the search stops here; when it does, search_end says why."""
        p = self._running()[1]
        if len(seen) >= self.tune.space.size():
            self.search_end = "every configuration of the space was tried"
            return True
        if p.trials is not None and self._count() >= p.trials:
            self.search_end = f"trials={p.trials} reached (more trials search more)"
            return True
        if p.budget_s is not None and self._count() >= 1:  # a budget that allows the baseline allows one trial
            per = (sum(p.screen_s) / len(p.screen_s)) if p.screen_s else self.tune.screen_s + LOAD_MARGIN_S
            per += p.full_estimate(self.tune) / self.tune.settings.eta  # successive halving promotes ~1 in eta
            if p.elapsed() + per + self.reserve() > p.budget_s:
                self.search_end = (f"the budget ({budget_text(p.budget_s)}) ended it, keeping "
                                   f"{budget_text(self.reserve())} for the final repeats "
                                   f"(budget={budget_text(3 * p.budget_s)} searches more)")
                return True
        return False

    def _count(self) -> int:
        return studies.measured_count(self._running()[0])

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
        missed = studies.missed_artifacts(study)  # quality is judged once per artifact
        for trial, suggested in batch:
            key = json.dumps(suggested)
            trial.set_user_attr("overrides", suggested)
            trial.set_user_attr("label", config_label(suggested))
            if key in seen:
                studies.tell_known(study, trial, seen[key], tune.settings)
            elif artifact_key(suggested) in missed:
                studies.tell_withheld(study, trial, missed[artifact_key(suggested)], tune.settings)
                seen[key] = study.trials[trial.number].user_attrs
            elif (first := spaces.cheaper_first(suggested, studies.tried_overrides(study))) is not None:
                studies.defer(study, trial, *first)  # the cheaper build is asked next; this one costs nothing
            elif any(json.dumps(s) == key for _, s in screens):
                later.append((trial, key))
            elif self._valid(study, trial, suggested, seen):
                trial.set_user_attr("number", trial.number)
                screens.append((trial, suggested))
        measured = self.run_trials([tune.trial_overrides(s, tune.screen_s) for _, s in screens],
                                [f"screen {config_label(s)}" for _, s in screens], kind="screen") if screens else []
        screened = [(trial, suggested, studies.tell_screen(study, trial, rows[0], seen, tune))
                    for (trial, suggested), rows in zip(screens, measured)]
        promoted = [(trial, suggested) for trial, suggested, figs in screened if figs is not None]
        for trial, suggested, figs in screened:  # reported together: the pruner compares each with the others
            if figs is not None and trial.should_prune():
                studies.constrain(trial, figs, tune.settings)
                trial.set_user_attr("outcome", "pruned")
                trial.set_user_attr("value", figs[tune.settings.objective.metric])
                study.tell(trial, state=TrialState.PRUNED)
                seen[json.dumps(suggested)] = study.trials[trial.number].user_attrs
        promoted = [(t, s) for t, s in promoted if json.dumps(s) not in seen]
        fulls = self.run_trials([tune.trial_overrides(s, tune.cfg.duration) for _, s in promoted],
                             [f"full {config_label(s)}" for _, s in promoted]) if promoted else []
        for (trial, suggested), rows in zip(promoted, fulls):
            studies.tell_full(study, trial, rows[0], tune)
            seen[json.dumps(suggested)] = study.trials[trial.number].user_attrs
        for trial, key in later:
            studies.tell_known(study, trial, seen[key], tune.settings)

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

    def _final(self) -> list[verdicts.Finalist]:
        """The top k, the baseline and the peer, `tune.repeats` each, interleaved, fresh processes each."""
        tune = self.tune
        study = self._running()[0]
        top = studies.ranked_complete(study, tune.settings)[:tune.settings.top_k]
        if not top:  # nothing feasible: the candidates closest to the constraints are measured for the verdict
            tried = [t for t in study.get_trials(deepcopy=False) if "screen" in t.user_attrs
                     and "repeat_of" not in t.user_attrs and t.user_attrs["screen"].get("valid")
                     and not _deterministic_miss(t)]
            top = sorted(tried, key=lambda t: sum(max(0.0, c) for c in t.user_attrs.get("constraints", [])
                                                  if math.isfinite(c)))[:tune.settings.top_k]
        configs = [tune.trial_overrides(t.user_attrs["overrides"], tune.cfg.duration) for t in top]
        labels = [t.user_attrs["label"] for t in top]
        configs.append(merge(tune.baseline, [f"duration={tune.cfg.duration:g}"]))
        labels.append("baseline: out-of-box pytorch")
        if tune.peer:
            configs.append(merge(tune.peer, [f"duration={tune.cfg.duration:g}"]))
            labels.append(tune.peer_label)
        repeats = tune.settings.repeats
        budgeted = self._running()[1].budget_s is not None
        most = max(repeats, MAX_FINAL_REPEATS) if budgeted and len(top) >= 2 else repeats
        suggested = [t.user_attrs["overrides"] for t in top] + [None, None]
        finalists: list[verdicts.Finalist] = []
        rows: list[list[tuple]] = [[] for _ in configs]  # each configuration's (record, path) so far
        unsettled = "the leader was not separated"  # why the rounds go on, for the final stage's words
        # a resumed tune's final repeats, committed already, cost nothing; without a budget nothing is counted
        stored = self._stored(configs, most) if budgeted else [0] * len(configs)
        for done in range(min(2, repeats), most + 1):  # one more fresh repeat of each a round (A B C A B C)
            extra = done > repeats  # past tune.repeats: the searched finalists only, a whole round or none
            fitting = self._fitting(rows, [n >= done for n in stored], among=range(len(top)) if extra else None)
            if extra and len(fitting) < len(top):
                self.final_end = (f"; {unsettled} after tune.repeats={repeats} and the budget left no whole round "
                                  "more" if done - 1 == repeats else
                                  f"; the final stage gave the searched finalists {done - 1} repeats (tune.repeats="
                                  f"{repeats}, more from the budget's reserve) and {unsettled}")
                break
            short = not extra and len(fitting) < len(configs)
            # those that fit: one more repeat; those past the budget with nothing yet: what was measured (their full
            # window, found by key). One call each, so an executor with several nodes measures them side by side.
            unmeasured = [] if extra else [i for i, found in enumerate(rows) if i not in fitting and not found]
            for chosen, times in ((fitting, done), (unmeasured, 1)):
                if chosen:
                    measured = self.run_trials([configs[i] for i in chosen], [f"final {labels[i]}" for i in chosen],
                                               repeats=times)
                    for i, got in zip(chosen, measured):
                        rows[i] = got
            finalists = []
            for overrides, label, found, words in zip(configs, labels, rows, suggested):
                records = [record for record, _ in found]
                finalists.append(verdicts.Finalist(
                    label, overrides, records, [str(path) for _, path in found],
                    [verdicts.figures(r, tune.cost_of) for r in records], baseline=label == labels[len(top)],
                    complexity=complexity(words or []), cores=_cores_used(records), peer=label == tune.peer_label))
            if short:
                self.final_end = (f"; the budget ended the final stage in its repeat {done} of {repeats} (no "
                                  "measurement starts that its estimate says would end past the budget)")
                break
            # from tune.repeats on, the searched finalists among themselves: the extra rounds measure only them, so a
            # baseline that 2 noisy repeats leave with an interval of 1-1000 QPS cannot hold the leader unseparated
            judged = finalists if done < repeats else [f for f in finalists if not f.baseline]
            apart = verdicts.separated(judged, tune.settings)
            # separated, but the leader's own interval wider than its value: one more round, where the budget allows
            unsettled = ("the leader's own 95 % interval stayed wider than its value" if apart else
                         "the leader was not separated")
            if done < most and apart and not verdicts.leader_wide(judged, tune.settings):
                if done != repeats:
                    self.final_end = (f"; the final stage stopped after {done} of {repeats} repeats: the leader's "
                                      "95 % interval was clear of every other finalist's" if done < repeats else
                                      f"; the final stage gave the searched finalists {done} repeats (tune.repeats="
                                      f"{repeats}, more from the budget's reserve) until the leader's 95 % interval "
                                      "was clear of every other searched finalist's")
                break
            if extra and done == most:
                self.final_end = (f"; the final stage gave the searched finalists {most} repeats, the most it gives, "
                                  f"and {unsettled}")
        return finalists + self._withheld(study)

    def _fitting(self, rows: list[list[tuple]], stored: list[bool], among: range | None = None) -> list[int]:
        """The configurations (indices into rows, in order; of `among` when given) whose next final measurement
        ends within the budget (all without one), each started after those before it: a configuration's estimate
        is nothing where that measurement is stored already (stored[i]: a resumed tune), else the mean time its
        earlier measurements took (records' elapsed_s; out-of-box PyTorch's can be minutes where a searched one's
        are seconds), else the mean full measurement's (Progress.full_estimate)."""
        progress = self._running()[1]
        indices = list(range(len(rows)) if among is None else among)
        if progress.budget_s is None:
            return indices
        chosen, end = [], progress.elapsed()
        for i in indices:
            took = [record.elapsed_s for record, _ in rows[i] if record.elapsed_s]
            need = 0.0 if stored[i] else sum(took) / len(took) if took else progress.full_estimate(self.tune)
            if stored[i] or end + need <= progress.budget_s:
                chosen.append(i)
                end += need
        return chosen

    def _stored(self, configs: list[list[str]], most: int) -> list[int]:
        """How many of its first `most` repeats each configuration has committed under the results root, on this
        machine and software (what the trial loop would skip by key): a tune resumed after its budget concludes
        from the repeats it measured, not from one each."""
        from corescale.machine import environment
        from corescale.trials.local import Resume

        found = Resume.here(True, False, environment.capture())
        counts = []
        for item in plan_sweep([merge(c, [f"repeats={most}"]) for c in configs], self.tune.topology):
            item.resume_root = self.tune.cfg.results_root
            counts.append(next((r for r in range(most) if found.find(item, r) is None), most))
        return counts

    def _withheld(self, study) -> list[verdicts.Finalist]:
        """The fastest configurations whose outputs missed the quality (or drift) gate, as measured once: the
        same artifact gives the same outputs, so repeats would only spend the budget; shown, never chosen."""
        tune = self.tune
        missed = [t for t in study.get_trials(deepcopy=False) if "repeat_of" not in t.user_attrs
                  and _deterministic_miss(t)]  # a served one without a value: its search skipped (quality first)
        sign = -1 if tune.settings.objective.direction == "maximize" else 1
        finalists = []
        for trial in sorted(missed, key=lambda t: math.inf if t.user_attrs.get("value") is None else
                            sign * t.user_attrs["value"])[:tune.settings.top_k]:
            path = (trial.user_attrs.get("full") or trial.user_attrs["screen"])["path"]
            record = _read(path)
            suggested = trial.user_attrs["overrides"]
            finalists.append(verdicts.Finalist(
                trial.user_attrs["label"], tune.trial_overrides(suggested, tune.cfg.duration), [record], [path],
                [verdicts.figures(record, tune.cost_of)], complexity=complexity(suggested),
                cores=_cores_used([record])))
        return finalists


    def _running(self) -> tuple[optuna.Study, Progress]:
        assert self.study is not None and self.progress is not None, "the search runs inside _run"
        return self.study, self.progress

    def _save_elapsed(self) -> None:
        study, progress = self._running()
        study.set_user_attr("elapsed_s", progress.elapsed())


def _cores_used(records: list[TrialRecord]) -> int:
    for record in records:
        if record.placed:
            return sum(len(inst.cpus) for inst in record.placed)
    return 0


def _read(path):
    from corescale.record.files import read_result

    return read_result(path)


def _deterministic_miss(trial) -> bool:
    """Measured validly, but its outputs missed the quality or drift gate (a fact of the artifact, not noise)."""
    return studies.deterministic_miss(trial.user_attrs)
