"""Where a new tune's search starts, before the sampler draws (docs/tune.md, "Priors"):

1. the winners of earlier tunes of the same machine kind, model and scenario: the tune store is the tune folders
   under the same `output_dir` (`tune-<hash>/tune.json`), matched by `MachineKind` (CPU model, physical cores,
   model, sequence length, offline or server) whatever their other settings (objective, constraints, budget);
2. what won on this ISA and model size in the measurements of docs/results-*.md (`PRIORS`, each with its
   evidence);
3. every backend at its fastest and at its quality-safe precision, at the objective's known-good corner
   (space.starting_points says in which order, and the batcher's corner of a service).

`tune.priors` (SOURCES) says which of 1 and 2 seed the search: all (both, the default), earlier (1 only), lab (2
only), none (neither: only 3, as on a CPU no prior holds for). A point outside this tune's space is left out; a
point that loses is just an early measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.errors import UserError
from corescale.machine.precisions import PRECISIONS
from corescale.tune import space as spaces

if TYPE_CHECKING:
    from corescale.tune.space import Space

FASTEST = "fastest"  # a prior's precision: the backend's fastest on this CPU (its lowest rank; a gate judges it)
MOST = "most"  # a prior's layout: the most instances of one core each
# tune.priors=NAME -> (earlier tunes' winners, PRIORS) it seeds the search with; the backends' corners always follow
SOURCES = {"all": (True, True), "earlier": (True, False), "lab": (False, True), "none": (False, False)}


@dataclass(frozen=True)
class Prior:
    """What won on a CPU with these flags, for a model up to this size, in this scenario and batch range."""

    flags: tuple[str, ...]  # CPU flags it needs, all of them
    absent: tuple[str, ...]  # CPU flags it held without (another prior covers a CPU with them)
    largest_m: float  # model size bound: millions of encoder weights (12 · layers · hidden²)
    scenario: str  # offline | server
    batches: tuple[int, int]  # the offline batch sizes it held for (server: the batches a service forms)
    point: dict[str, str]  # Optuna parameters (space.suggest's names); FASTEST, MOST as above
    evidence: str


PRIORS = (
    Prior(("avx512_vnni",), ("amx_int8",), 30, "offline", (1, 4),
          {"backend": "onnxruntime", "precision": FASTEST, "layout": MOST, "onnxruntime.execution_mode": "parallel",
           "onnxruntime.fusion": "true"},
          "docs/results-2026-12-zen5.md, make run: all-MiniLM-L6-v2 at batch 1 on the Zen 5 (AVX-512 VNNI, no "
          "AMX), ONNX Runtime int8 2 × 1 core with parallel execution and fusion, 7.23× out-of-box"),
    Prior(("avx512_vnni",), ("amx_int8",), 30, "server", (1, 32),
          {"backend": "openvino", "precision": FASTEST, "layout": MOST, "openvino.quantization": "static",
           "openvino.performance_hint": "LATENCY", "batch_size": "2", "server.queue_delay": "fixed",
           "server.max_queue_ms": "5", "pad": "sorted", "allocator": "tcmalloc"},
          "docs/results-2026-12-zen5.md, P6' (2026-12-04): the trained all-MiniLM-L6-v2 at p99 <= 100 ms on the Zen 5 "
          "(AVX-512 VNNI, no AMX), a 40-minute service tune's winner: OpenVINO static int8 2 × 1 core, LATENCY hint, "
          "max batch 2, tcmalloc, 923 QPS judged over 3 repeats beside the earlier prior (static int8, max batch 32, "
          "THROUGHPUT hint, bucketed padding: 492 QPS) and OpenVINO bf16 at max batch 2 (545 QPS); its batches "
          "length-sorted (pad=sorted) since docs/results-2026-12-zen4.md (2026-12-05): 1.30x its QPS in process "
          "(3 alternated rounds), 1.08-1.23x over HTTP (3 pairs)"),
    Prior(("amx_int8",), (), 30, "offline", (1, 4),
          {"backend": "openvino", "precision": FASTEST, "layout": MOST, "openvino.quantization": "weights_asym"},
          "docs/results-2026-12-xeon.md, make run: all-MiniLM-L6-v2 at batch 1 on the Xeon (AMX), OpenVINO int8 "
          "weight compression (weights_asym) 2 × 1 core, 284.6 samples/s"),
    Prior(("amx_int8",), (), 30, "offline", (16, 4096),
          {"backend": "openvino", "precision": FASTEST, "layout": MOST, "openvino.quantization": "static"},
          "docs/results-2026-12-xeon.md, batch 32: OpenVINO static int8 2 × 1 core 461.7 / 523.7 texts/s, first "
          "of five configurations in both passes (weight compression 231.7 / 198.1)"),
    Prior(("amx_int8",), (), 30, "server", (1, 32),
          {"backend": "openvino", "precision": FASTEST, "layout": MOST, "openvino.quantization": "static",
           "batch_size": "16"},
          "docs/results-2026-12-xeon.md, batch 32: static int8 wins where calls hold many queries, as a loaded "
          "service's do"),
)


@dataclass(frozen=True)
class MachineKind:
    """How the tune store is keyed: an earlier tune's winner starts a tune of the same kind."""

    cpu: str
    cores: int
    model: str
    sequence_length: int
    scenario: str

    def to_json(self) -> dict:
        return {"cpu": self.cpu, "cores": self.cores, "model": self.model, "sequence_length": self.sequence_length,
                "scenario": self.scenario}


def model_size_m(model) -> float | None:
    """Millions of encoder weights (12 · layers · hidden²), None where the sizes are unknown."""
    if not getattr(model, "sizes_known", False):
        return None
    return 12 * model.layers * model.hidden ** 2 / 1e6


def starting(space: Space, isa: dict, size_m: float | None, scenario: str, batch: int, latency: bool,
             earlier: list[dict], lab: bool = True) -> list[tuple[dict, str]]:
    """(Optuna parameters, why) of the first trials: earlier tunes' winners (the caller reads none under
    tune.priors=lab|none), the priors that hold here (lab=False: none, tune.priors=earlier|none), then each
    backend at its fastest and quality-safe precisions (space.starting_points) less those at a backend and
    precision a prior starts at already; each only where it is a point of this space."""
    found = [(p, "an earlier tune's winner on this machine kind") for p in earlier]
    if lab and not latency:
        for prior in PRIORS:
            if all(isa.get(f) for f in prior.flags) and not any(isa.get(f) for f in prior.absent) and \
                    size_m is not None and size_m <= prior.largest_m and prior.scenario == scenario and \
                    (scenario == "server" or prior.batches[0] <= batch <= prior.batches[1]):
                found.append((resolve(prior.point, space), prior.evidence))
    corners = [(p, _corner(p, space)) for p in spaces.starting_points(space, latency)]
    kept: list[tuple[dict, str]] = []
    for point, why in found + corners:
        fitted = fit(point, space)
        # a corner whose backend and precision a prior starts at already: a screen a short budget keeps
        if fitted and fitted not in [k for k, _ in kept] and not (
                (point, why) in corners and _branch(fitted, space) in [_branch(k, space) for k, _ in kept]):
            kept.append((fitted, why))
    return kept


def _branch(point: dict[str, str], space: Space) -> tuple[str, str]:
    """A start's backend and precision (a dimension with one value is not drawn: that value)."""
    backend = point.get("backend", space.backends[0])
    return backend, point.get(f"precision[{backend}]", space.precisions[backend][0])


def _corner(point: dict[str, str], space: Space) -> str:
    """Why a backend's corner starts the search, naming its precision."""
    backend, precision = _branch(point, space)
    branch = "its fastest" if PRECISIONS[precision].reduced else "quality-safe"
    return f"a backend's known-good corner, {precision} ({branch})"


def resolve(point: dict[str, str], space: Space) -> dict[str, str]:
    """A prior's parameters in this space's names: its precision (named, or the fastest), its most-instances
    layout."""
    out = dict(point)
    backend = point.get("backend", "")
    precision = out.pop("precision", None)
    if precision == FASTEST and backend in space.precisions and space.precisions[backend]:
        out[f"precision[{backend}]"] = min(space.precisions[backend], key=lambda p: PRECISIONS[p].rank)
    elif precision is not None and precision != FASTEST:  # named (fit() leaves it out where the space lacks it)
        out[f"precision[{backend}]"] = precision
    if out.get("layout") == MOST:
        ones = [lay for lay in space.layouts if lay.endswith("x1")] or space.layouts
        out["layout"] = max(ones, key=lambda lay: int(lay.split("x")[0]))
    return out


class _Probe:
    """A stand-in for an Optuna trial: each suggestion is the point's value (it must be a choice), else the
    configuration's default (unnamed: filled)."""

    def __init__(self, point: dict[str, str]):
        self.point, self.used, self.filled = point, set[str](), dict[str, str]()

    def suggest_categorical(self, name: str, choices: list[str]) -> str:
        if name in self.point:
            if self.point[name] not in choices:
                raise ValueError(name)
            self.used.add(name)
            return self.point[name]
        self.filled[name] = _default(name, choices)
        return self.filled[name]


def _default(name: str, choices: list[str]) -> str:
    """A dimension a start does not name: the configuration's default where the space holds it, else the first
    choice. Left to the sampler, the Zen 5's served prior was screened with keep_fp32=ffn_output and a token budget
    it was never measured with, and a 5-minute tune kept that (601 against 818 QPS judged, P6' seed 3)."""
    from corescale.backends import OPTIONS
    from corescale.config import BenchmarkConfig

    base = name.split("[")[0]
    backend, _, option = base.partition(".")
    value = None
    if backend in OPTIONS and option:
        value = spaces.text(getattr(OPTIONS[backend](), option, None))
    elif base.startswith("server.") or base == "pad":
        value = spaces.config_text(BenchmarkConfig(), base)
    elif base in ("allocator", "openmp"):
        value = "default"
    return value if value in choices else choices[0]


def fit(point: dict[str, str], space: Space) -> dict[str, str] | None:
    """`point` as parameters this space draws, every one of them: those it names, the rest at the configuration's
    defaults (a dimension with one value is not drawn: the point must agree with it); None when it is not a point
    of this space."""
    probe = _Probe(point)
    try:
        words = spaces.suggest(probe, space)
    except (ValueError, KeyError, UserError):
        return None
    backend = next(w.split("=", 1)[1] for w in words if w.startswith("backend="))
    for name, value in point.items():
        if name in probe.used:
            continue
        if name in ("backend", "layout", "batch_size") or name.startswith("precision["):
            if not _fixed(name, value, space):
                return None
        elif not name.startswith(f"{backend}."):
            return None  # another backend's option: the point is that backend's
    return {**{name: value for name, value in point.items() if name in probe.used}, **probe.filled}


def _fixed(name: str, value: str, space: Space) -> bool:
    """A parameter the space does not draw because it has one value, which is the point's."""
    if name == "backend":
        return space.backends == [value]
    if name == "layout":
        return space.layouts == [value]
    if name == "batch_size":
        return space.batch_sizes == [value]
    return space.precisions.get(name[len("precision["):-1]) == [value]


def earlier_winners(results_root: Path, own: Path, kind: MachineKind) -> list[dict]:
    """The Optuna parameters of the winners of the earlier tunes of this machine kind under `results_root`."""
    from corescale.tune.document import read

    found = []
    for path in sorted(results_root.glob("tune-*/tune.json")):
        if path.parent == own:
            continue
        try:
            doc = read(path.parent)
        except UserError:
            continue  # a malformed or future document: not a prior
        if doc is None or doc.machine_kind != kind.to_json() or doc.winner is None:
            continue
        trial = next((t for t in doc.trials if t.label == doc.winner and t.repeat_of is None and t.params), None)
        if trial is not None:
            found.append({k: str(v) for k, v in trial.params.items()})
    return found
