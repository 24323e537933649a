"""Options and facts of `backend=toy`: framework-free, like every backend's options.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corescale.backends import Artifact, BackendEntry, BackendOptions

ACTIVATIONS = ("tanh", "relu")
# backend.weights=file: the weights built once into cache_dir/toy/KEY/weights.npz, loaded from there, bundled and
# served through these hooks alone (a new artifact kind needs no edit in serve/)
TOY_FILE = Artifact("toy weights", cache="toy", builder="toy_backend.backend", modules=(),
                    collect="toy_backend.artifact:collect", install="toy_backend.artifact:install")


@dataclass
class ToyOptions(BackendOptions):
    name: str = "toy"
    activation: str = "tanh"
    refuse: str = "no"  # a reason for load to refuse with, inside the worker (a trial that fails there, for tests)
    weights: str = "memory"  # or "file": its artifact (TOY_FILE); a string, so the tune does not search it
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"activation": ACTIVATIONS}


TOY = BackendEntry(
    options=ToyOptions, backend="toy_backend.backend:ToyBackend", extra=None, requires=("numpy",),
    precisions=("fp32", "fp16"), openmp=False, forkable=True, worker_modules=("toy_backend.backend",),
    artifacts=(TOY_FILE,),
    profiler=None, libraries=("numpy",), recorded=(), snippet="toy_backend.recipe:snippet", onednn_linear=False,
    heads=("tokens",))
