"""The one small protocol every framework implements: load -> prepare inputs -> forward -> outputs."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from corescale.errors import UserError
from corescale.machine.instance_env import unbind_calling_thread  # noqa: F401 - what the backends call


class Backend(Protocol):
    name: str
    timings: dict[str, float]  # seconds spent converting/exporting/compiling, by stage, outside inference

    def load(self, spec, cfg, threads: int, inputs: dict[str, np.ndarray]) -> None:
        """Build the model for `threads` intra-op threads; may run `inputs` once to trace/compile."""

    def prepare(self, inputs: dict[str, np.ndarray]) -> Any:
        """Framework-native inputs, built once before timing."""

    def forward(self, prepared: Any) -> Any:
        """One inference call; the only thing timed."""

    def to_numpy(self, output: Any) -> np.ndarray:
        """Last hidden state as float32 [batch, sequence, hidden]."""

    def info(self) -> dict[str, Any]:
        """Framework name, version and what it reports about its threads."""


def require_precision(backend: str, precision: str) -> None:
    """The precisions the backend's registry entry declares (config validation checks them before any worker
    starts; this guards a backend loaded without it, from the Python API)."""
    from corescale.backends import entry

    supported = entry(backend).precisions
    if precision not in supported:
        raise UserError(f"backend {backend} supports precision {', '.join(supported)} (got {precision})")


class TimedStages:
    """Mixin: records how long each non-inference stage took."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

