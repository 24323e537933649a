"""tune.json as a typed, versioned document: written by tune/outputs.py at the end of a tune, read by the
report, the fleet ranking and the tune command. Reading checks every value (typed.py): a malformed
document is one UserError line naming where."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corescale.errors import UserError
from corescale.record.repeats import Interval
from corescale.typed import Section
from corescale.userfiles import read_json

TUNE_FILE = "tune.json"
SCHEMA_VERSION = 2  # 1: the untyped document of corescale 0.2 before this one (no schema_version), same shape
READS = (1, 2)
LONGER = 3  # the longer budget a tune's coverage speaks of: this many times the configurations it measured


@dataclass(frozen=True)
class Figure(Section):
    """A figure's mean over the repeats, its 95 % interval (None: not measured, or one repeat), each repeat's
    value and whether the interval is usable (Interval.usable: over MIN_REPEATS or more, narrower than the value,
    within the repeats' range; where it is not, what is shown is the repeats' values)."""

    mean: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    values: list[float] = field(default_factory=list)  # absent before 0.3
    usable: bool = False

    def interval(self) -> Interval:
        return Interval(math.nan if self.mean is None else self.mean, self.low, self.high, self.n,
                        tuple(self.values))

    def text(self, digits: int = 2) -> str:
        return "-" if self.mean is None else f"{self.mean:.{digits}f}"

    def interval_text(self, digits: int = 2) -> str:
        """The interval where usable, else the repeats' values (Interval.bounds)."""
        return "-" if self.mean is None else self.interval().bounds(digits)


@dataclass(frozen=True)
class TunedFinalist(Section):
    """One configuration of the final stage (or the out-of-box baseline), measured `tune.repeats` times."""

    label: str
    role: str  # winner | tie | runner-up | infeasible | withheld (quality) | baseline | peer
    overrides: list[str]
    baseline: bool
    paths: list[str]  # its result directories
    cores: int
    complexity: int
    feasible: bool
    tied: bool
    throughput: Figure
    p50_ms: Figure
    p99_ms: Figure
    cost_per_1m: Figure
    memory_gb: Figure
    drift: Figure
    quality: Figure = field(default_factory=Figure)  # the quality gate's first metric (embed: cosine p1)
    quality_metric: str | None = None  # its name
    cost_per_1m_tokens: Figure = field(default_factory=Figure)  # per 1M real tokens (absent before 0.3)

    def figure(self, metric: str) -> Figure:
        """The figure an objective names (TuneObjective.metric)."""
        found = {"throughput": self.throughput, "server_qps": self.throughput, "p50_ms": self.p50_ms,
                 "p99_ms": self.p99_ms, "cost_per_1m": self.cost_per_1m,
                 "cost_per_1m_tokens": self.cost_per_1m_tokens, "memory_gb": self.memory_gb,
                 "drift": self.drift}.get(metric)
        if found is None:
            raise UserError(f"{TUNE_FILE}: the objective's metric '{metric}' is not a figure of its finalists")
        return found


@dataclass(frozen=True)
class TuneTrial(Section):
    """One Optuna trial: its configuration, its screening and full-window figures, and why it ended."""

    number: int
    state: str
    params: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    label: str | None = None
    overrides: list[str] | None = None
    screen: dict[str, Any] | None = None  # verdict.figures() of the screening window, and its result's path
    full: dict[str, Any] | None = None
    constraints: list[float] | None = None
    reason: str | None = None
    repeat_of: int | None = None
    started: float | None = None
    finished: float | None = None
    outcome: str | None = None  # complete | pruned | failed | invalid | withheld (its artifact missed the gate)

    def figure(self, stage: str, metric: str) -> float | None:
        """A figure of its screening (stage "screen") or full window (None where not measured)."""
        window = self.screen if stage == "screen" else self.full
        value = (window or {}).get(metric)
        return None if value is None else float(value)

    def paths(self) -> list[str]:
        return [str(stage["path"]) for stage in (self.screen, self.full) if stage and stage.get("path")]


@dataclass(frozen=True)
class TuneObjective(Section):
    name: str
    metric: str
    direction: str  # maximize | minimize
    unit: str


@dataclass(frozen=True)
class Speedup(Section):
    """The winner's throughput over the out-of-box baseline's, with its 95 % bootstrap interval."""

    ratio: float
    low: float
    high: float
    upper_bound: bool = False  # the denominator's QPS search was bounded before it narrowed: at most this


@dataclass(frozen=True)
class BestSeen(Section):
    """The best screen or full window of one backend at one precision, and how much of that branch was measured."""

    backend: str
    precision: str
    in_space: int  # configurations of the space at this backend and precision
    measured: int  # of them screened
    withheld: int = 0  # measured or pruned because the artifact missed the quality gate
    best: float | None = None  # the objective's best figure seen (screen or full window), feasible only
    label: str | None = None
    unestablished: int = 0  # screened, but its bounded QPS search met no rate: its max is unknown, not 0


@dataclass(frozen=True)
class SearchBounds(Section):
    """How long a tune lets each QPS search run (server.max_search_s) and how far past its budget it may end
    (tune/budget.py): stated in tune.json."""

    full_s: float  # a full window's search (the baseline, the peer, full windows, final repeats)
    screen_s: float  # a screen's search
    slack_s: float | None  # a budgeted tune ends within budget + this (None: no budget)
    source: str  # where the bounds come from, in words

    def line(self) -> str:
        """One console line: 'bounds: ...'."""
        ends = "" if self.slack_s is None else f"; the tune ends within its budget + {self.slack_s:g} s"
        return (f"bounds: each QPS search at most {self.full_s:g} s (a screen's {self.screen_s:g} s), from "
                f"{self.source}{ends}")


@dataclass(frozen=True)
class StageTime(Section):
    """One stage's measurements in a tune: how many, their wall time, and the QPS searches' share of it."""

    stage: str  # baseline | peer | screens | full windows | final repeats
    measurements: int
    seconds: float  # its measurements' own wall time (each result's elapsed_s: its processes' start to their end)
    search_s: float  # of which its QPS search's LoadGen tests (0 offline)


@dataclass(frozen=True)
class Spent(Section):
    """Where a tune's wall time went (tune/spent.py)."""

    elapsed_s: float
    stages: list[StageTime] = field(default_factory=list)
    reused: int = 0  # results found by key outside the tune's folder (an earlier run's), not counted above

    @property
    def measured_s(self) -> float:
        return sum(s.seconds for s in self.stages)

    def line(self) -> str:
        """One console line: 'spent: ...'."""
        searches = sum(s.search_s for s in self.stages)
        parts = [f"{s.stage} {s.measurements} × {s.seconds:.0f} s" + (f" ({s.search_s:.0f} s searching)"
                                                                       if s.search_s else "")
                 for s in self.stages if s.measurements]
        outside, between = self.measured_s - searches, max(self.elapsed_s - self.measured_s, 0)
        return (f"spent: {self.elapsed_s:.0f} s — " + ", ".join(parts)
                + (f"; in the measurements but outside the QPS searches (start, load or build, warm-up, quality, speed "
                   f"sentinel: not bounded by the budget) {outside:.0f} s" if searches else "")
                + f"; between measurements (the sampler, verdicts, commits) {between:.0f} s"
                + (f"; {self.reused} result(s) of earlier runs reused" if self.reused else ""))


@dataclass(frozen=True)
class Coverage(Section):
    measured: int  # distinct configurations screened (withheld ones and repeats not counted)
    space_size: int
    branches: list[BestSeen] = field(default_factory=list)  # every backend × precision of the space
    gain: float | None = None  # the relative gain of a LONGER-times budget, estimated (None: too few screens)
    gain_words: str = ""  # how it was estimated, or why there is none; and when the best was found
    best_at: int | None = None  # the best configuration's position among the screened (1-based, in search order)

    @property
    def fraction(self) -> float:
        return self.measured / self.space_size if self.space_size else 0.0

    def unmeasured(self) -> list[str]:
        """The backend × precision branches no screen reached."""
        return [f"{b.backend} {b.precision}" for b in self.branches if not b.measured and not b.withheld]

    def lines(self, unit: str) -> list[str]:
        """The console's and the report's sentences."""
        out = [f"coverage: {self.measured} of {self.space_size} configurations measured ({self.fraction:.2%}); "
               f"{sum(1 for b in self.branches if b.measured)} of {len(self.branches)} backend × precision "
               "branches reached" + (f" (not reached: {', '.join(self.unmeasured())})" if self.unmeasured() else "")]
        seen = [b for b in self.branches if b.measured or b.withheld]
        if seen:
            out.append("best seen: " + "; ".join(
                f"{b.backend} {b.precision} " + (f"{b.best:.4g} {unit}" if b.best is not None else
                                                  "withheld (quality)" if b.withheld else
                                                  "not established (a bounded QPS search met no rate)"
                                                  if b.unestablished else "none feasible")
                + f" ({b.measured} of {b.in_space})" for b in seen))
        out.append(f"a longer budget: {self.gain_words}")
        return out


@dataclass(frozen=True)
class TuneDocument(Section):
    created_at: str
    tune_dir: str
    settings: dict[str, Any]  # TuneSettings.describe()
    space: dict[str, Any]  # Space.describe()
    space_size: int
    screen_s: float
    duration_s: float
    physical_cores: int
    objective: TuneObjective
    trials: list[TuneTrial]
    finalists: list[TunedFinalist]
    baseline: TunedFinalist | None
    headline: list[str]
    schema_version: int = SCHEMA_VERSION
    node_type: str | None = None
    nodes: int = 1
    machine: str | None = None
    elapsed_s: float | None = None
    importances: dict[str, float] = field(default_factory=dict)
    winner: str | None = None
    tie: list[str] = field(default_factory=list)
    tie_p: float | None = None
    speedup: Speedup | None = None
    speedup_at_least: float | None = None  # where the baseline met the SLO at no rate: winner ÷ its lowest miss
    recipe: dict[str, Any] | None = None  # file name -> path, the run line (words) and the winner's key
    cost_source: str | None = None  # where the cost figures' price comes from (analysis/pricing.py)
    peer: TunedFinalist | None = None  # the peer baseline (tune/peer.py), measured like the baseline, never ranked
    peer_speedup: Speedup | None = None  # the recommendation's throughput over the peer's, 95 % bootstrap CI
    peer_note: str | None = None  # why no peer was measured
    search_end: str | None = None  # how much of the space was searched and why the search stopped
    coverage: Coverage | None = None  # how good the answer is (tune/coverage.py)
    machine_kind: dict[str, Any] | None = None  # priors.MachineKind: what a later tune's priors match it by
    starts: list[str] = field(default_factory=list)  # the first trials and why (tune/priors.py)
    priors: str | None = None  # tune.priors: which priors seeded them (all | earlier | lab | none; None: before it)
    search_bounds: SearchBounds | None = None  # the QPS searches' wall-time bounds and the budget's slack
    spent: Spent | None = None  # where the tune's wall time went (tune/spent.py)
    study: str | None = None  # the Optuna study's name in study.db (tune/study.py: study_name)

    @property
    def winning(self) -> TunedFinalist | None:
        """The recommended configuration (the out-of-box baseline when nothing measured beats it)."""
        for f in [*self.finalists, *([self.baseline] if self.baseline else [])]:
            if f.role == "winner":
                return f
        return None

    @property
    def rows(self) -> list[TunedFinalist]:
        """The finalists, then the baseline and the peer: the recommendation table's rows."""
        return [*self.finalists, *([self.baseline] if self.baseline else []), *([self.peer] if self.peer else [])]

    def result_paths(self) -> set[str]:
        """Every result directory the tune used (finalists, baseline, every trial's windows)."""
        return {p for f in self.rows for p in f.paths} | {p for t in self.trials for p in t.paths()}


def read(tune_dir: Path) -> TuneDocument | None:
    """The tune document of a directory; None when it holds none."""
    path = Path(tune_dir) / TUNE_FILE
    if not path.is_file():
        return None
    data = read_json(path, "tune document")
    if not isinstance(data, dict):
        raise UserError(f"'{path}' is not a tune document (expected an object)")
    version = data.get("schema_version", 1)
    if version not in READS:
        raise UserError(f"'{path}': schema_version {version!r} (this corescale reads {', '.join(map(str, READS))})")
    try:
        return TuneDocument.from_dict({**data, "schema_version": SCHEMA_VERSION}, TUNE_FILE)
    except UserError as exc:
        raise UserError(f"malformed tune document '{path}': {exc}") from None
