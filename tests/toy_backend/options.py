"""Options and facts of `backend=toy`: framework-free, like every backend's options.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corescale.backends import BackendEntry, BackendOptions

ACTIVATIONS = ("tanh", "relu")


@dataclass
class ToyOptions(BackendOptions):
    name: str = "toy"
    activation: str = "tanh"
    refuse: str = "no"  # a reason for load to refuse with, inside the worker (a trial that fails there, for tests)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"activation": ACTIVATIONS}


TOY = BackendEntry(
    options=ToyOptions, backend="toy_backend.backend:ToyBackend", extra=None, requires=("numpy",),
    precisions=("fp32", "fp16"), openmp=False, forkable=True, worker_modules=("toy_backend.backend",), artifacts=(),
    profiler=None, libraries=("numpy",), recorded=(), snippet="toy_backend.recipe:snippet", onednn_linear=False,
    heads=("tokens",))
