"""Backend registry: each backend's entry (every fact about it, declared in its folder's options.py) by name.
Light on purpose: nothing here imports a framework (or the config, which reads this registry).

Adding a backend: its folder plus one `register` line below (docs/adding-a-backend.md). Backends outside the
package register themselves from modules named in CORESCALE_BACKENDS (comma-separated, importable in every
process: the CLI's and each worker's, which inherit the variable), each calling `register(name, entry)`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corescale.backends.onnxruntime.options import ONNXRUNTIME
from corescale.backends.openvino.options import OPENVINO
from corescale.backends.options import DEFAULT_BACKEND, Artifact, BackendEntry, BackendOptions, LoadSettings, Profiler
from corescale.backends.pytorch.options import PYTORCH, TORCH_COMPILE, TORCHSCRIPT
from corescale.backends.sentence_transformers.options import SENTENCE_TRANSFORMERS
from corescale.backends.tensorflow.options import TENSORFLOW, TENSORFLOW_GRAPH, TENSORFLOW_XLA
from corescale.errors import RegistrationError, UserError
from corescale.machine.precisions import REFERENCE

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DEFAULT_BACKEND", "Artifact", "BackendEntry", "BackendOptions", "Profiler", "RegistrationError",
           "BACKENDS", "OPTIONS", "register", "entry", "named", "attribute", "check_available", "create_backend",
           "runs_model", "quality_reference", "onednn_linear_at", "Backend", "framework_report", "bundled_artifact"]
PLUGINS_ENV = "CORESCALE_BACKENDS"
BACKENDS: dict[str, BackendEntry] = {}
OPTIONS: dict[str, type[BackendOptions]] = {}  # name -> the Hydra group node of `backend=NAME`


def register(name: str, entry: BackendEntry) -> BackendEntry:
    """Adds a backend; an incomplete or malformed entry, or a name taken, raises RegistrationError."""
    if not isinstance(entry, BackendEntry):
        raise RegistrationError(f"backend '{name}': register() takes a BackendEntry (got {type(entry).__name__})")
    if name in BACKENDS and BACKENDS[name] != entry:
        raise RegistrationError(f"backend '{name}' is registered already ({BACKENDS[name].backend})")
    entry.check(name)
    BACKENDS[name] = entry
    OPTIONS[name] = entry.options
    return entry


register("pytorch", PYTORCH)
register("torchscript", TORCHSCRIPT)
register("torch_compile", TORCH_COMPILE)
register("onnxruntime", ONNXRUNTIME)
register("openvino", OPENVINO)
register("tensorflow", TENSORFLOW)
register("tensorflow_graph", TENSORFLOW_GRAPH)
register("tensorflow_xla", TENSORFLOW_XLA)
register("sentence_transformers", SENTENCE_TRANSFORMERS)


def entry(name: str) -> BackendEntry:
    """The registered backend of this name, or one line naming the registered ones."""
    if name not in BACKENDS:
        raise UserError(f"unknown backend '{name}'; allowed: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]


def named(fact: str) -> list[str]:
    """The backends whose boolean fact (openmp, forkable, onednn_linear) holds, in registry order."""
    return [name for name, e in BACKENDS.items() if getattr(e, fact)]


def attribute(path: str):
    """The object a "module:attribute" fact names (imports the module: call it where the framework may load)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def bundled_artifact(name: str, kind: str | None = None) -> Artifact:
    """The artifact a bundle of backend `name` carries (of `kind`, its cache folder, as a manifest names it): one
    line when the backend has none with bundle hooks (Artifact.collect, .install)."""
    found = [a for a in entry(name).artifacts if a.bundled and kind in (None, a.cache)]
    if not found:
        what = f"an artifact of kind '{kind}'" if kind else "its artifact"
        raise UserError(f"backend {name} cannot bundle {what}: its entry declares no collect and install hooks for "
                        "it (docs/adding-a-backend.md)")
    return found[0]


def check_available(name: str) -> BackendEntry:
    """Fails with the extra to install when the backend's framework is missing (no framework import)."""
    found = entry(name)
    missing = [m for m in found.requires if importlib.util.find_spec(m) is None]
    if missing:
        install = f"pip install 'corescale[{found.extra}]'" if found.extra else f"pip install {' '.join(missing)}"
        raise UserError(f"backend '{name}' needs {', '.join(missing)}: install it with {install}")
    return found


def runs_model(name: str, model, role: str = "backend") -> None:
    """One line when backend `name` (as `role`: backend or reference) cannot run `model`: a model file needs a
    backend that loads its format."""
    formats = entry(name).model_files
    kind = (model.model_file or {}).get("format")
    if kind is not None and kind not in formats:
        able = [n for n, e in BACKENDS.items() if kind in e.model_files]
        why = f"loads {', '.join(formats)} files only" if formats else \
            "needs the PyTorch model (a preset or a directory)"
        raise UserError(f"{role}={name} cannot run model file '{model.name}' ({kind}): a model file runs on "
                        f"{' and '.join(able) or 'no registered backend'} only; {role}={name} {why}")


def quality_reference(model) -> str:
    """The backend whose fp32 outputs judge a task's quality: the default backend (the PyTorch model), or for a
    model file, where there is no PyTorch model, the first backend that loads the file itself."""
    kind = (model.model_file or {}).get("format")
    if kind is None or model.reference is not None:  # reference=DIR: the PyTorch model the file came from
        return DEFAULT_BACKEND
    return next(n for n, e in BACKENDS.items() if kind in e.model_files and REFERENCE in e.precisions)


def onednn_linear_at(name: str, precision: str) -> bool:
    """Whether backend `name`'s linears can run as torch's prepacked oneDNN linear at this precision: its entry's
    onednn_linear, at the precisions its options bind backend.linear=onednn to."""
    found = BACKENDS.get(name)
    bound = OPTIONS[name].PRECISION_BOUND.get(("linear", "onednn"), ()) if found else ()
    return found is not None and found.onednn_linear and precision in bound


class Backend(Protocol):
    """The one small protocol every framework implements: load -> prepare inputs -> forward -> outputs (its
    shared parts: backends/base.py)."""

    name: str
    timings: dict[str, float]  # seconds spent converting/exporting/compiling, by stage, outside inference
    model_path: Path | None  # the file load() opened, built by one of the entry's artifacts (None: none): the
    # worker reports it, and a bundle copies it through that artifact's collect hook

    def load(self, spec, cfg: LoadSettings, threads: int, inputs: dict[str, np.ndarray]) -> None:
        """Build the model for `threads` intra-op threads; may run `inputs` once to trace/compile."""

    def prepare(self, inputs: dict[str, np.ndarray]) -> Any:
        """Framework-native inputs, built once before timing."""

    def forward(self, prepared: Any) -> Any:
        """One inference call; the only thing timed."""

    def to_numpy(self, output: Any) -> np.ndarray:
        """Last hidden state as float32 [batch, sequence, hidden]."""

    def info(self) -> dict[str, Any]:
        """Framework name, version and what it reports about its threads."""


def create_backend(name: str) -> Backend:
    return attribute(check_available(name).backend)()


def framework_report(backend: Backend) -> dict[str, Any]:
    """What an instance's record says of its backend: its info(), and the artifact it ran as `model_path`."""
    path = backend.model_path
    return {**backend.info(), **({"model_path": str(path)} if path is not None else {})}


def _load_plugins() -> None:
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as exc:  # the user's variable: one line, exit 2 (a malformed entry: RegistrationError)
            raise UserError(f"{PLUGINS_ENV} names '{module}', which cannot be imported ({exc}); set it to "
                            "importable modules that register backends, comma-separated, or unset it") from exc


_load_plugins()
