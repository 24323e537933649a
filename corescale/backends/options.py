"""The base of every backend's options: a Hydra config-group node (`backend=NAME backend.OPTION=VALUE`).

Each framework's options live beside its backend (`backends/<framework>/options.py`), with the BackendEntry
that declares every other fact about it (precisions, OpenMP, forking, worker modules, artifacts, profiler,
fingerprinted libraries, deployment snippet); this module and those import no framework, so the config can hold
them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from corescale.errors import RegistrationError, UserError
from corescale.machine.precisions import PRECISIONS
from corescale.workload.tasks import HEADS, TASKS

DEFAULT_BACKEND = "pytorch"  # `backend=` when none is given; also the tune's baseline and its drift reference
MODEL_FILES = ("onnx", "openvino-ir")  # the exported model files a backend may load as they are (model=FILE)


class TextSource(Protocol):
    source: str | None  # workload.source: a text file the queries come from (None: random ids)


class CheckedSettings(Protocol):
    """What the options' checks read of the rest of the config (`config.BenchmarkConfig` is one: the options are
    a group of it, so they cannot name it)."""

    precision: str
    tokenize: bool

    @property
    def workload(self) -> TextSource: ...


class LoadSettings(CheckedSettings, Protocol):
    """What a backend's `load` reads of the config (a backend annotates it as the `BenchmarkConfig` it is)."""

    backend: BackendOptions
    batch_size: int
    sequence_length: int
    interop_threads: int
    seed: int
    trust_remote_code: bool
    allow_pickle: bool
    cache_dir: str


@dataclass
class BackendOptions:
    name: str = DEFAULT_BACKEND
    # option -> allowed values, for the options that are a choice
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    # (option, value) -> the precisions it holds for (check() refuses the others; the tune draws it only there)
    PRECISION_BOUND: ClassVar[dict[tuple[str, str], tuple[str, ...]]] = {}
    RENAMED: ClassVar[dict[str, str]] = {}  # corescale 0.1's flat config key -> the option here (old configs read)
    # option -> its values by build time, cheapest first: the tuner builds a value only once the one before it
    # was measured with this backend (expensive builds last: torch.compile's max-autotune takes minutes)
    BUILD_ORDER: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def tune_values(cls) -> dict[str, list[str]]:
        """The tuner's space of these options: every choice of a choice option, both values of a flag."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.CHOICES:
                values[f.name] = list(cls.CHOICES[f.name])
            elif f.name != "name" and f.type in (bool, "bool"):
                values[f.name] = ["false", "true"]
        return values

    def options(self) -> dict[str, Any]:
        """The options without the name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}

    def changed(self) -> dict[str, Any]:
        """Options that differ from their defaults: a new option whose default keeps today's behaviour keeps
        every trial key."""
        defaults = type(self)()
        return {k: v for k, v in self.options().items() if getattr(defaults, k) != v}

    def validate(self) -> None:
        for option, allowed in self.CHOICES.items():
            value = getattr(self, option)
            if value not in allowed:
                raise UserError(f"unknown backend.{option} '{value}' for backend={self.name}; "
                                f"allowed: {', '.join(allowed)}")

    def allocator_companions(self) -> list[Path]:
        """Libraries of the framework to preload beside a preloaded allocator: a library of the framework that
        keeps calling glibc's free() on the allocator's memory aborts the process unless it is preloaded too."""
        return []

    def check(self, cfg: CheckedSettings) -> None:
        """Checks of the options against the rest of the config (precision, the installed framework); called
        by config.validate, before any worker starts."""

    def check_model(self, model) -> None:
        """Checks of the options against the resolved model (a ModelSpec); called before any worker starts."""


# `backend.keep_fp32=`: which parts of an encoder stay in fp32 when the rest is int8 (backends/calibration.py maps
# each to node names of the export)
KEEP_FP32 = ("none", "head", "attention_output", "ffn_output", "first_last")


@dataclass
class Int8Options(BackendOptions):
    """The options of a backend's int8 artifact (docs/tasks.md, "Static int8"): given with another precision, or a
    calibration option with a mode that calibrates nothing, they are refused in one line."""

    quantization: str = ""  # each backend's modes: its CHOICES; its first mode calibrates nothing or is "static"
    per_channel: bool = False  # one weight scale per output channel (else one per tensor)
    keep_fp32: str = "none"  # KEEP_FP32
    calibration_samples: int = 128  # real texts the static mode's activation ranges are taken from
    STATIC: ClassVar[str] = "static"  # the mode that calibrates on real text
    CALIBRATED: ClassVar[tuple[str, ...]] = ("calibration_samples",)  # options that apply to STATIC only
    TUNED: ClassVar[dict[str, list[str]]] = {}  # the tuner's few values of an int8 option (others: its default)

    @classmethod
    def int8_options(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(Int8Options) if f.name != "name") + cls.CALIBRATED

    @classmethod
    def tune_values(cls) -> dict[str, list[str]]:
        values = {k: v for k, v in super().tune_values().items() if k not in cls.int8_options()}
        return {**values, **cls.TUNED}

    def __init_subclass__(cls, **kwargs) -> None:
        """The tuned int8 options are drawn at int8 only (PRECISION_BOUND)."""
        super().__init_subclass__(**kwargs)
        cls.PRECISION_BOUND = {**cls.PRECISION_BOUND, **{(option, value): ("int8",) for option, values in
                                                         cls.TUNED.items() for value in values}}

    def validate(self) -> None:
        super().validate()
        n = self.calibration_samples
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CALIBRATION_SAMPLES:
            raise UserError(f"backend.calibration_samples must be a whole number in [1, {MAX_CALIBRATION_SAMPLES}] "
                            f"(got {n})")

    def check(self, cfg: CheckedSettings) -> None:
        changed = self.changed()
        given = [k for k in self.int8_options() if k in changed]
        if cfg.precision != "int8" and given:
            raise UserError(f"backend.{given[0]} applies to precision=int8 only (got precision={cfg.precision}); "
                            f"leave it at its default ({getattr(type(self)(), given[0])})")
        calibrated = [k for k in self.CALIBRATED if k in changed]
        if self.quantization != self.STATIC and calibrated:
            raise UserError(f"backend.{calibrated[0]} applies to backend.quantization={self.STATIC} only (got "
                            f"{self.quantization}) on backend={self.name}")


Chosen = TypeVar("Chosen", bound="BackendOptions")


def options_as(options: BackendOptions, kind: type[Chosen]) -> Chosen:
    """A config's `backend` group as its backend's own options class (the one its registry entry composes)."""
    if not isinstance(options, kind):
        raise TypeError(f"backend={options.name}'s options are {type(options).__name__}, not {kind.__name__}")
    return options


MAX_CALIBRATION_SAMPLES = 1000  # the built-in corpus's tail holds this many texts past the largest default quality set


def without_options(name: str, class_name: str, module: str) -> type[BackendOptions]:
    """The group node of a backend with no options of its own (yet): only its name. `module` is where the class
    is bound under `class_name`, so it pickles (Ray sends configs to its nodes)."""
    cls = dataclasses.make_dataclass(class_name, [("name", str, dataclasses.field(default=name))],
                                     bases=(BackendOptions,))
    cls.__module__ = module
    return cls


@dataclass(frozen=True)
class Artifact:
    """A file a backend measures that is built before its worker measures and cached between trials. The backend
    names the file it runs as its `model_path` (backends/base.py); a bundle copies it with `collect` and
    `corescale serve` files that copy in its runtime cache with `install`, so the backend's own load opens it as
    built (docs/adding-a-backend.md). An artifact without them cannot be bundled."""

    name: str  # what it is, for messages ("ONNX export")
    cache: str  # its folder under cache_dir (the run checks cache_dir is writable before any worker starts); also
    # its kind in a bundle's manifest
    builder: str  # the module that builds it (imported by the worker only)
    modules: tuple[str, ...]  # what building it imports; a worker whose artifact is already built needs none of them
    collect: str | None = None  # "module:function": (model_path, into) -> steps: copies the files that make the
    # artifact whose file is model_path into the new folder `into`; `steps` (names) is what install needs
    install: str | None = None  # "module:function": (folder, steps, cfg) -> None: files the bundle's copy in
    # `folder` in cfg.cache_dir so the backend's load finds it as built and applies no build step to it again

    @property
    def bundled(self) -> bool:
        return self.collect is not None and self.install is not None


@dataclass(frozen=True)
class Profiler:
    """The framework's own per-op profiler, as `corescale explain` uses it."""

    name: str  # what explain records as the profiler
    factory: str  # "module:Class", built lazily in the explain worker as Class(backend, prepared, work_dir);
    # it has .call() (one profiled call) and .finish() -> the calls' op times (see backends/pytorch/profiler.py)


# the ONNX Runtime and OpenVINO backends measure the same export (backends/onnx_export.py)
ONNX_EXPORT = Artifact("ONNX export", cache="onnx", builder="corescale.backends.onnx_export",
                       modules=("torch", "transformers"), collect="corescale.backends.onnx_export:collect",
                       install="corescale.backends.onnx_export:install")

_REQUIRED: Any = object()  # a fact not given: register() names every one missing


@dataclass(frozen=True)
class BackendEntry:
    """Every fact about one backend, declared in its folder (framework-free) and registered by name in
    corescale/backends/__init__.py. docs/adding-a-backend.md explains each."""

    options: type[BackendOptions] = _REQUIRED  # the Hydra group node of `backend=NAME`; its `name` default is NAME
    backend: str = _REQUIRED  # "module:Class" implementing backends/base.py's Backend (imported in the worker only)
    extra: str | None = _REQUIRED  # the optional dependency group that brings the framework (None: a core one)
    requires: tuple[str, ...] = _REQUIRED  # top-level modules that must be importable
    precisions: tuple[str, ...] = _REQUIRED  # what it computes in, each a registered precision
    # (machine/precisions.py; checked in config validation); the tune's choices
    openmp: bool = _REQUIRED  # its kernels run on OpenMP threads, so `openmp=` applies to it
    forkable: bool = _REQUIRED  # its workers may be forked from a fork server (False: the framework starts threads
    # on import)
    worker_modules: tuple[str, ...] = _REQUIRED  # what its worker imports to measure a built artifact (a fork
    # server pre-imports them; `{model}` stands for the model type's module name, e.g. bert)
    artifacts: tuple[Artifact, ...] = _REQUIRED  # files built before measuring (an export), each with its cache
    profiler: Profiler | None = _REQUIRED  # None: explain refuses the backend with one line
    libraries: tuple[str, ...] = _REQUIRED  # distributions whose versions enter the machine/software fingerprint
    recorded: tuple[str, ...] = _REQUIRED  # distributions whose versions are only recorded with each result
    snippet: str = _REQUIRED  # "module:function": (cfg, threads, model_line) -> the Python that loads the measured
    # artifact with the chosen options, written beside the tune's recipe.sh
    onednn_linear: bool = _REQUIRED  # its linears can run as torch's prepacked oneDNN linear: explain measures both
    # on the model's shapes and the findings offer backend.linear=onednn
    heads: tuple[str, ...] = _REQUIRED  # the heads its measured call can compute (workload/tasks.py HEADS: tokens,
    # pooled, logits; inside the graph): it runs every task with one of them, config validation refuses the others
    model_files: tuple[str, ...] = ()  # exported model files it loads as they are (`model=FILE`): "onnx",
    # "openvino-ir" (workload/modelfile.py FORMATS); () = it needs the PyTorch model (a preset or a directory)
    peer_calls: tuple[tuple[str, str], ...] = ()  # (task, the call its users make): a peer baseline of that task,
    # measured beside a tune's out-of-box baseline (tune/peer.py), never searched or recommended
    shape_warm_calls: int = 2  # calls at a new input shape until the next one is warm: `corescale serve`'s instance
    # makes that many at every shape it will answer before it is ready (a JIT backend optimises on its second)
    keeps_compiled: bool = False  # its load keeps what it compiles in `compiled_cache` and imports it next time
    # (`corescale serve` gives it the machine's cache: serve/opened.py)

    def computes(self, task: str) -> bool:
        return TASKS[task].head in self.heads

    def tasks(self) -> tuple[str, ...]:
        """The registered tasks it runs."""
        return tuple(name for name in TASKS if self.computes(name))

    def peer_call(self, task: str) -> str | None:
        """The call this backend measures as the peer baseline of `task` (None: not a peer of it)."""
        return dict(self.peer_calls).get(task)

    def check(self, name: str) -> None:
        """Raises RegistrationError naming every missing or malformed fact."""
        problems = [f"{f.name} missing" for f in dataclasses.fields(self) if getattr(self, f.name) is _REQUIRED]
        if problems:
            raise RegistrationError(f"backend '{name}' is incomplete: {', '.join(problems)} "
                                    "(docs/adding-a-backend.md lists every fact)")
        if not (isinstance(self.options, type) and issubclass(self.options, BackendOptions)
                and dataclasses.is_dataclass(self.options)):
            problems.append("options is not a BackendOptions dataclass")
        elif self.options().name != name:
            problems.append(f"options' name default is '{self.options().name}', not '{name}'")
        named: dict[str, Any] = {"backend": self.backend, "snippet": self.snippet}
        if isinstance(self.profiler, Profiler):
            named["profiler.factory"] = self.profiler.factory
        for artifact in self.artifacts if isinstance(self.artifacts, tuple) else ():
            if isinstance(artifact, Artifact) and (artifact.collect or artifact.install):  # both, or neither
                named.update({f"{artifact.name} collect": artifact.collect,
                              f"{artifact.name} install": artifact.install})
        for fact, value in named.items():
            if not isinstance(value, str) or value.count(":") != 1:
                problems.append(f"{fact} is not 'module:attribute' (got {value!r})")
        for fact in ("requires", "precisions", "worker_modules", "libraries", "recorded", "heads", "model_files"):
            value = getattr(self, fact)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                problems.append(f"{fact} is not a tuple of names (got {value!r})")
        unknown = [p for p in self.precisions if p not in PRECISIONS] if isinstance(self.precisions, tuple) else []
        if not self.precisions or unknown:
            problems.append(f"precisions must be some of {', '.join(PRECISIONS)} (got {self.precisions!r})")
        if isinstance(self.heads, tuple) and (not self.heads or not set(self.heads) <= set(HEADS)):
            problems.append(f"heads must be some of {', '.join(HEADS)} (got {self.heads!r})")
        if isinstance(self.model_files, tuple) and not set(self.model_files) <= set(MODEL_FILES):
            problems.append(f"model_files must be some of {', '.join(MODEL_FILES)} (got {self.model_files!r})")
        if not (isinstance(self.peer_calls, tuple) and all(
                isinstance(p, tuple) and len(p) == 2 and p[0] in TASKS and isinstance(p[1], str)
                for p in self.peer_calls)):
            problems.append(f"peer_calls is not a tuple of (task, call) pairs (got {self.peer_calls!r})")
        for fact in ("openmp", "forkable", "onednn_linear"):
            if not isinstance(getattr(self, fact), bool):
                problems.append(f"{fact} is not True or False")
        if not (isinstance(self.artifacts, tuple) and all(isinstance(a, Artifact) for a in self.artifacts)):
            problems.append("artifacts is not a tuple of Artifact")
        if not (self.profiler is None or isinstance(self.profiler, Profiler)):
            problems.append("profiler is not a Profiler or None")
        if problems:
            raise RegistrationError(f"backend '{name}' is malformed: {'; '.join(problems)}")
