"""What the backends share: the precision guard and the timed stages (the protocol, `Backend`, is declared with
the registry in backends/__init__.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

from corescale.backends import Backend  # noqa: F401 - the protocol, declared with the registry
from corescale.errors import UserError
from corescale.machine.instance_env import unbind_calling_thread  # noqa: F401 - what the backends call


def require_precision(backend: str, precision: str) -> None:
    """The precisions the backend's registry entry declares (config validation checks them before any worker
    starts; this guards a backend loaded without it, from the Python API)."""
    from corescale.backends import entry

    supported = entry(backend).precisions
    if precision not in supported:
        raise UserError(f"backend {backend} supports precision {', '.join(supported)} (got {precision})")


class TimedStages:
    """Mixin: records how long each non-inference stage took."""

    model_path: Path | None = None  # set by load() where the backend opens a built artifact

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

