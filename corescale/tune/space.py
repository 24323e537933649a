"""The search space: what is installed and what this CPU supports, narrowed by the user's fixed overrides and
`space.<name>=[...]`; `suggest` draws one configuration from an Optuna trial as the overrides of a trial.

Conditional dimensions get their own parameter names (`precision[onnxruntime]`, `threads[2]`,
`onnxruntime.fusion`): each then has one fixed set of choices, which Optuna's samplers require, and the
multivariate TPE's group decomposition models each branch on the trials that took it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from corescale.backends import BACKENDS, DEFAULT_BACKEND, OPTIONS, check_available
from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.http_keys import MANAGED
from corescale.machine.precisions import PRECISIONS
from corescale.overrides import override_key

THROUGHPUT_BATCHES = ("1", "2", "4", "8", "16")
SERVER_BATCHES = ("1", "2", "4", "8", "16", "32")  # server.max_batch: a bound the queue fills only under load
DIMENSIONS = ("backend", "precision", "layout", "threads", "batch_size", "allocator", "openmp")
# objective=server_qps: the dynamic batcher's knobs (measure/batching.py), searched with the deployment; each
# matters only when a call may take more than one query (server.max_batch > 1), so it is drawn only then.
# pad: max takes the oldest queries, sorted the oldest one and the waiting ones nearest its length, both padded to
# the batch's longest (sorted wasted 6-10 % of each call on padding against max's 28 %, served 1.3x the QPS in process:
# docs/results-2026-12-zen4.md); bucket pads to a length bucket's edge (fewer shapes: a graph compiled per shape
# reuses them). server.max_batch_tokens: null = no token budget. server.max_padding: a call stops at the first
# waiting query that would make more than that share of it padding (max batch 8, sorted: 657 against 421-425 QPS,
# its calls 7 % padding against 48 %; max batch 2: 661-671 against 651-664), null = no cap.
SERVING = {"server.queue_delay": ("fixed", "adaptive"), "server.max_queue_ms": ("2", "5"),
           "server.max_batch_tokens": ("null", "2048"), "server.max_padding": ("null", "0.15"),
           "pad": ("max", "sorted", "bucket")}
# endpoint=managed: the service's front processes (serve --fronts), each feeding an equal share of the instances;
# a parameter per instance count (`server.fronts[4]`: 1, 2, 4), so each has one fixed set of choices
FRONTS = "server.fronts"


@dataclass
class Space:
    backends: list[str]
    precisions: dict[str, list[str]]  # per backend
    options: dict[str, dict[str, list[str]]]  # per backend: option -> values
    layouts: list[str]  # "NxC": N instances of C cores
    threads: dict[int, list[str]]  # per cores per instance; "" = one per core (the default)
    batch_sizes: list[str]
    allocators: list[str]
    openmp: list[str]  # for the OpenMP backends only
    notes: list[str] = field(default_factory=list)  # what was left out and why
    batch_key: str = "batch_size"  # server.max_batch for objective=server_qps: the dynamic batch's bound
    serving: dict[str, list[str]] = field(default_factory=dict)  # objective=server_qps: SERVING, narrowed
    fronts: dict[int, list[str]] = field(default_factory=dict)  # endpoint=managed: per instance count; {}: one

    def fronts_of(self, layout: str) -> list[str]:
        """The front counts a layout's service may run (serve --fronts): one where the space has no fronts."""
        return self.fronts.get(_instances(layout), ["1"])

    def size(self) -> int:
        return sum(self.size_of(b, p) for b in self.backends for p in self.precisions[b])

    def size_of(self, backend: str, precision: str) -> int:
        """The configurations of one backend at one precision (its options, layouts, batching, libraries)."""
        per_layout = sum(len(self.threads[_cores(layout)]) * len(self.fronts_of(layout)) for layout in self.layouts)
        per_backend = (math.prod(len(option_values(backend, o, v, precision)) or 1
                                 for o, v in self.options[backend].items())
                       * (len(self.openmp) if BACKENDS[backend].openmp else 1))
        knobs = math.prod(len(v) for v in self.serving.values())  # drawn only where a call batches
        batches = sum(knobs if int(b) > 1 else 1 for b in self.batch_sizes)
        return per_backend * per_layout * batches * len(self.allocators)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _cores(layout: str) -> int:
    return int(layout.split("x")[1])


def _instances(layout: str) -> int:
    return int(layout.split("x")[0])


def layout_overrides(layout: str) -> list[str]:
    instances, cores = layout.split("x")
    return [f"instances={instances}", f"cores_per_instance={cores}"]


def powers(limit: int) -> list[int]:
    values = [2**k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []
    return sorted({*values, limit})


def candidate_layouts(physical_cores: int) -> list[str]:
    """N instances × C cores with C and N from 1, 2, 4, ... and the largest that fit (all cores used or not:
    fewer can win where memory bandwidth binds)."""
    return [f"{n}x{c}" for c in powers(physical_cores) for n in powers(physical_cores // c)]


def _installed(backend: str) -> bool:
    try:
        check_available(backend)
    except UserError:
        return False
    return True


def _library_found(library) -> bool:
    from corescale.machine.instance_env import find_library

    try:
        find_library(library)
    except UserError:
        return False
    return True


def derive(cfg: BenchmarkConfig, overrides: list[str], narrow: dict[str, list[str]], physical_cores: int,
           isa: dict, latency: bool, batch_key: str = "batch_size", model=None) -> Space:
    """The space of this machine and install, narrowed by the user's fixed overrides and space.* lists."""
    from corescale.machine.instance_env import ALLOCATORS, INTEL_OPENMP

    given = {override_key(o) for o in overrides}
    notes = []
    peers = [b for b in OPTIONS if BACKENDS[b].peer_calls]  # measured beside the tune (peer=), not searched
    backends = [b for b in OPTIONS if _installed(b) and b not in peers]
    notes += [f"backend {b}: not installed" for b in OPTIONS if b not in backends and b not in peers]
    if model is not None:  # a model file runs only on the backends that load its format
        kind = (model.model_file or {}).get("format")
        unfit = [b for b in backends if kind is not None and kind not in BACKENDS[b].model_files]
        backends = [b for b in backends if b not in unfit]
        notes += [f"backend {b}: does not load {kind} model files" for b in unfit]
    task = model.task if model is not None else cfg.task  # a backend without a place for the head: not searched
    if task is not None:
        headless = [b for b in backends if not BACKENDS[b].computes(task)]
        backends = [b for b in backends if b not in headless]
        notes += [f"backend {b}: does not compute task={task}" for b in headless]
    # the precisions each backend computes in (its registry entry) that the tuner may offer on this CPU (the
    # precision's entry: bf16 only where the CPU has its instructions)
    unoffered = [p for p in PRECISIONS if not PRECISIONS[p].offered(isa)]
    notes += [f"precision {p}: this CPU has none of its instructions ({_flags(PRECISIONS[p].computes)})"
              for p in unoffered]
    precisions = {b: [p for p in BACKENDS[b].precisions if p not in unoffered] for b in backends}
    quantized = getattr(model, "quantization", None)
    if quantized:  # a model file quantized already computes in its graph's precision only
        precisions = {b: [p for p in found if p == quantized["precision"]] for b, found in precisions.items()}
        notes.append(f"precision: the model file's graph computes in {quantized['precision']} only")
    options = {b: OPTIONS[b].tune_values() for b in backends}
    layouts = candidate_layouts(physical_cores)
    threads = {c: [""] + [str(t) for t in powers(c) if t != c] for c in powers(physical_cores)}
    serving: dict[str, list[str]] = {}
    if batch_key != "batch_size":  # the server scenario batches dynamically, up to the searched bound
        batch_sizes = [str(cfg.server.max_batch)] if batch_key in given else list(SERVER_BATCHES)
        serving = {key: [config_text(cfg, key)] if key in given else list(values) for key, values in SERVING.items()}
        tokens = cfg.sequence_length  # a token budget must hold one query of the measured length
        serving["server.max_batch_tokens"] = [v for v in serving["server.max_batch_tokens"]
                                              if v == "null" or int(v) >= tokens] or ["null"]
    else:
        batch_sizes = [str(cfg.batch_size)] if latency or "batch_size" in given else list(THROUGHPUT_BATCHES)
    fronts = front_counts(layouts, cfg.server.fronts if FRONTS in given else None) if cfg.endpoint == MANAGED else {}
    allocators = ["default"] + [a for a, lib in ALLOCATORS.items() if _library_found(lib)]
    openmp = ["default"] + (["intel"] if _library_found(INTEL_OPENMP) else [])
    space = Space(backends, precisions, options, layouts, threads, batch_sizes, allocators, openmp, notes, batch_key,
                  serving, fronts)
    _fix(space, cfg, given)
    _narrow(space, narrow)
    _check_not_empty(space)
    return space


def front_counts(layouts: list[str], given: int | None) -> dict[int, list[str]]:
    """Per instance count, the front counts that share its instances evenly (1, 2, 4, ... dividing it; the
    count the user gave, where it divides them)."""
    counts = {_instances(layout) for layout in layouts}
    return {n: [str(f) for f in powers(n) if n % f == 0 and (given is None or f == given)] for n in sorted(counts)}


def _fix(space: Space, cfg: BenchmarkConfig, given: set[str]) -> None:
    """A dimension the user set with a plain override is fixed at that value."""
    if "backend" in given:
        space.backends = [cfg.backend.name]
    for key in given:
        if key.startswith("backend."):
            option = key.split(".", 1)[1]
            for b in space.backends:
                if option in space.options[b]:
                    space.options[b][option] = [text(getattr(cfg.backend, option))]
    if "precision" in given:
        space.precisions = {b: [p for p in v if p == cfg.precision] for b, v in space.precisions.items()}
    if given & {"instances", "cores_per_instance"}:
        per = cfg.cores_per_instance
        space.layouts = [lay for lay in space.layouts if _instances(lay) == cfg.instances or
                         "instances" not in given]
        space.layouts = [lay for lay in space.layouts if per is None or _cores(lay) == per]
        if not space.layouts and per is not None:
            space.layouts = [f"{cfg.instances}x{per}"]
            space.threads.setdefault(per, [""])
    threads = cfg.threads
    if "threads" in given and threads is not None:
        space.threads = {c: [str(threads) if threads != c else ""] if threads <= c else [] for c in space.threads}
    if "allocator" in given:
        space.allocators = [cfg.allocator]
    if "openmp" in given:
        space.openmp = [cfg.openmp]
        space.backends = [b for b in space.backends if BACKENDS[b].openmp or cfg.openmp == "default"]


def text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_text(cfg: BenchmarkConfig, key: str) -> str:
    """A serving knob's value in the config, as an override writes it (None: null, 2.0: 2)."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return "null" if value is None else f"{value:g}" if isinstance(value, float) else text(value)


def _narrow(space: Space, narrow: dict[str, list[str]]) -> None:
    for name, values in narrow.items():
        if name == "backend":
            space.backends = _subset(name, values, space.backends)
        elif name == "precision":
            allowed = sorted({p for v in space.precisions.values() for p in v})
            keep = _subset(name, values, allowed)
            space.precisions = {b: [p for p in v if p in keep] for b, v in space.precisions.items()}
        elif name == "layout":
            space.layouts = _subset(name, values, space.layouts)
        elif name in ("instances", "cores_per_instance"):
            index = 0 if name == "instances" else 1
            allowed = sorted({lay.split("x")[index] for lay in space.layouts}, key=int)
            keep = _subset(name, values, allowed)
            space.layouts = [lay for lay in space.layouts if lay.split("x")[index] in keep]
        elif name == "threads":  # "cores": one thread per core of the instance (the default)
            allowed = ["cores", *sorted({t for v in space.threads.values() for t in v if t}, key=int)]
            keep = _subset(name, values, allowed)
            space.threads = {c: [t for t in v if (t or "cores") in keep or (not t and str(c) in keep)]
                             for c, v in space.threads.items()}
        elif name == "batch_size":
            _whole_numbers(name, values)
            space.batch_sizes = [str(int(v)) for v in values]
        elif name in ("allocator", "openmp"):
            setattr(space, _plural(name), _subset(name, values, getattr(space, _plural(name))))
        elif name.startswith("backend."):
            _narrow_option(space, name.split(".", 1)[1], values)
        elif name in space.serving:
            space.serving[name] = _subset(name, values, space.serving[name])
        elif name == FRONTS and space.fronts:
            _whole_numbers(name, values)
            keep = _subset(name, [str(int(v)) for v in values], sorted({f for v in space.fronts.values() for f in v},
                                                                       key=int))
            space.fronts = {n: [f for f in v if f in keep] for n, v in space.fronts.items()}
        else:
            raise UserError(f"unknown search dimension 'space.{name}'; dimensions: "
                            f"{', '.join(f'space.{d}' for d in (*DIMENSIONS, 'instances', 'cores_per_instance'))}"
                            ", space.backend.OPTION" + "".join(f", space.{k}" for k in space.serving)
                            + (f", space.{FRONTS}" if space.fronts else ""))


def _plural(name: str) -> str:
    return {"allocator": "allocators", "openmp": "openmp"}[name]


def _narrow_option(space: Space, option: str, values: list[str]) -> None:
    having = [b for b in space.backends if option in space.options[b]]
    if not having:
        known = sorted({o for b in space.backends for o in space.options[b]})
        raise UserError(f"space.backend.{option}: no backend in the space has option '{option}'; options: "
                        f"{', '.join(known) or 'none'}")
    for b in having:
        space.options[b][option] = _subset(f"backend.{option}", [v.lower() if v.lower() in ("true", "false")
                                                                  else v for v in values], space.options[b][option])


def _whole_numbers(name: str, values: list[str]) -> None:
    for v in values:
        if not v.isdigit() or int(v) < 1:
            raise UserError(f"space.{name}: '{v}' is not a whole number >= 1")


def _subset(name: str, values: list[str], allowed: list[str]) -> list[str]:
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UserError(f"space.{name}: {', '.join(bad)} not possible here; possible: {', '.join(allowed) or 'none'}")
    return [v for v in allowed if v in values]


def _check_not_empty(space: Space) -> None:
    space.backends = [b for b in space.backends if space.precisions.get(b)]
    space.layouts = [lay for lay in space.layouts if space.threads.get(_cores(lay)) and space.fronts_of(lay)]
    empty = [name for name, values in (("backend (with a precision it supports)", space.backends),
                                       ("layout", space.layouts), ("batch_size", space.batch_sizes),
                                       ("allocator", space.allocators)) if not values]
    empty += [f"{b}.{o}" for b in space.backends for o, v in space.options[b].items() if not v]
    if empty or space.size() == 0:
        raise UserError(f"the search space is empty: no {', '.join(empty) or 'combination'} is left by the "
                        "overrides and space.* lists (space.backend and precision must share a supported pair)")


def _flags(computes: dict[str, tuple[str, ...]]) -> str:
    """A precision's native CPU flags in words: "x86_64: AVX512_BF16/AMX_BF16; aarch64: BF16"."""
    return "; ".join(f"{arch}: {'/'.join(f.upper() for f in flags)}" for arch, flags in computes.items())


def option_values(backend: str, option: str, values: list[str], precision: str) -> list[str]:
    """The values of a backend option that hold at this precision (its options' PRECISION_BOUND)."""
    bound = OPTIONS[backend].PRECISION_BOUND
    return [v for v in values if precision in bound.get((option, v), (precision,))]


def suggest(trial, space: Space) -> list[str]:
    """One configuration drawn from an Optuna trial (dimensions with one value are not parameters)."""
    def pick(name, values):
        return values[0] if len(values) == 1 else trial.suggest_categorical(name, values)

    backend = pick("backend", space.backends)
    precision = pick(f"precision[{backend}]", space.precisions[backend])
    overrides = [f"backend={backend}", f"precision={precision}"]
    for option, values in space.options[backend].items():
        usable = option_values(backend, option, values, precision)  # a narrower list is a parameter of its own
        name = f"{backend}.{option}" if usable == values else f"{backend}.{option}[{precision}]"
        if usable:
            overrides.append(f"backend.{option}={pick(name, usable)}")
    layout = pick("layout", space.layouts)
    overrides += layout_overrides(layout)
    threads = pick(f"threads[{_cores(layout)}]", space.threads[_cores(layout)])
    if threads:
        overrides.append(f"threads={threads}")
    if (fronts := space.fronts_of(layout)) != ["1"]:
        overrides.append(f"{FRONTS}={pick(f'{FRONTS}[{_instances(layout)}]', fronts)}")
    batch = pick("batch_size", space.batch_sizes)
    overrides.append(f"{space.batch_key}={batch}")
    if int(batch) > 1:  # a queue delay, token budget or padding only matters where a call takes several queries
        overrides += [f"{key}={pick(key, values)}" for key, values in space.serving.items()]
    overrides.append(f"allocator={pick('allocator', space.allocators)}")
    if BACKENDS[backend].openmp:
        overrides.append(f"openmp={pick('openmp', space.openmp)}")
    return overrides


# objective=server_qps: the batcher's corner every first trial takes (each only where the space holds it: the
# fit of a start leaves the rest at the config's defaults, max batch 8 and a 2 ms wait, padded to the longest). A
# call that takes two queries halves a loaded instance's calls; the Zen 5's 40-minute service tune won at max batch
# 2 (923 QPS, 1.9x max batch 32), and on the Zen 4 max batch 2 served as much as 8 with capped padding (661-671
# against 657 QPS) while a call of 2 stays far inside any SLO on a slow core; the fixed wait fills it at a moderate
# rate; its batches length-sorted (pad=sorted: 1.30x pad=max in process, docs/results-2026-12-zen4.md).
SERVED_CORNER = {"server.queue_delay": "fixed", "pad": "sorted"}
SERVED_WAIT = "server.max_queue_ms"  # the longest wait the space holds (SERVING: 5 ms)


def starting_points(space: Space, latency: bool) -> list[dict]:
    """The first trials when no prior holds (priors.starting puts earlier winners and PRIORS before them): every
    backend at its fastest precision and at its quality-safe one (fp32, the reference the gate judges the others
    on), at the objective's known-good corner of the rest of the space, in the order a short budget (a 5-minute
    tune screens about six) gets the most from on a CPU nobody measured:

    the backends that run an exported graph (an artifact: ONNX Runtime, OpenVINO) lead (they led on each CPU in
    docs/results-*.md), fastest and quality-safe screens alternating, the safe screen after a backend's fastest
    being the next backend's, and the last leader's the PyTorch family's first (PyTorch fp32: on an AVX2 CPU the fp32
    backends lie within ~20 % of each other, docs/results-2026-12-zen3.md), then the safe branches not yet taken,
    the PyTorch family's fastest last (its int8 is one dynamic quantization, judged alike three times). With ONNX
    Runtime, OpenVINO and PyTorch: ORT int8, OpenVINO fp32, OpenVINO int8, PyTorch fp32, ORT fp32, PyTorch int8. A
    reduced precision may fail the quality gate (on an AVX2 Zen 3, the first three screens of a 5-minute tune were
    int8 corners all withheld and PyTorch fp32 was never reached): each fp32 screen is an answer that passes it.

    A backend's fastest precision is its lowest rank (machine/precisions.py), its quality-safe one the lowest-ranked
    unreduced one. The layout: for throughput (cost, server QPS) the most instances of one core each (the study's
    finding at small batches), for latency one instance on every core; for server QPS the batcher's corner
    (SERVED_CORNER: the smallest max batch above 1, the fixed wait, the longest wait, length-sorted batches), each
    from what the space holds. The other dimensions are the configuration's defaults (priors.fit); the sampler
    takes over from there; a corner that loses (or fails its gate) is just an early measurement."""
    def cores(layout: str) -> int:
        n, c = (int(x) for x in layout.split("x"))
        return n * c

    layouts = space.layouts
    if latency:
        layout = max(layouts, key=lambda lay: (_cores(lay), -_instances(lay)))
    else:
        layout = max(layouts, key=lambda lay: (cores(lay), _instances(lay)))
    served = served_corner(space)
    points = []
    for backend, precision in start_order(space):
        point = {"backend": backend} if len(space.backends) > 1 else {}
        if len(space.precisions[backend]) > 1:
            point[f"precision[{backend}]"] = precision
        if len(layouts) > 1:
            point["layout"] = layout
        if point and {**point, **served} not in points:  # nothing but the batcher to choose: the sampler's draw
            points.append({**point, **served})
    return points


def start_order(space: Space) -> list[tuple[str, str]]:
    """(backend, precision) of the first trials, in order (starting_points says why)."""
    def fastest(backend: str) -> str:
        return min(space.precisions[backend], key=lambda p: PRECISIONS[p].rank)

    def safe(backend: str) -> str | None:
        kept = [p for p in space.precisions[backend] if not PRECISIONS[p].reduced]
        return min(kept, key=lambda p: PRECISIONS[p].rank) if kept else None

    artifacts = [b for b in space.backends if BACKENDS[b].artifacts]
    others = [b for b in space.backends if not BACKENDS[b].artifacts]
    leaders, rest = (artifacts, others) if artifacts else (others, [])
    chain = leaders + rest[:1]
    order: list[tuple[str, str | None]] = []
    for i, backend in enumerate(leaders):
        order += [(backend, fastest(backend)), (chain[(i + 1) % len(chain)], safe(chain[(i + 1) % len(chain)]))]
    order += [(b, safe(b)) for b in chain + rest[1:]] + [(b, fastest(b)) for b in rest]
    found: list[tuple[str, str]] = []
    for backend, precision in order:
        if precision is not None and (backend, precision) not in found:
            found.append((backend, precision))
    return found


def served_corner(space: Space) -> dict[str, str]:
    """objective=server_qps: the batcher's knobs of a loaded service (SERVED_CORNER), each a parameter the space
    draws (a dimension with one value is not one); {} offline or where no call may take two queries."""
    if space.batch_key == "batch_size":
        return {}
    batched = [b for b in space.batch_sizes if int(b) > 1]
    if not batched:
        return {}
    corner = {"batch_size": min(batched, key=int)} if len(space.batch_sizes) > 1 else {}
    for key, value in SERVED_CORNER.items():
        if value in space.serving.get(key, []) and len(space.serving[key]) > 1:
            corner[key] = value
    waits = space.serving.get(SERVED_WAIT, [])
    if len(waits) > 1:
        corner[SERVED_WAIT] = max(waits, key=float)
    return corner


def cheaper_first(suggested: list[str], measured: list[list[str]]) -> tuple[str, str] | None:
    """(option, the value to build first) when `suggested` builds an option's value (BackendOptions.BUILD_ORDER)
    before the value one step cheaper was measured with its backend; None when it may be measured now."""
    values = {override_key(o): o.split("=", 1)[1] for o in suggested}
    backend = values.get("backend", DEFAULT_BACKEND)
    for option, order in OPTIONS[backend].BUILD_ORDER.items():
        value = values.get(f"backend.{option}")
        if value not in order or order.index(value) == 0:
            continue
        cheaper = order[order.index(value) - 1]
        if not any(f"backend={backend}" in words and f"backend.{option}={cheaper}" in words for words in measured):
            return option, cheaper
    return None


BASELINE_DROPS = ("backend", "precision", "instances", "cores_per_instance", "threads", "allocator", "openmp")


def baseline_overrides(overrides: list[str], backend: str = DEFAULT_BACKEND) -> list[str]:
    """Out-of-box PyTorch (a model file: the backend that loads it): the user's workload settings, every
    deployment choice at its default (one instance on all cores, fp32, the default allocator and OpenMP)."""
    kept = [o for o in overrides if override_key(o).split(".")[0] not in BASELINE_DROPS]
    return [*kept, f"backend={backend}"]
