"""What a worker imports before it loads its backend: its own modules and the ones its backend declares
(`worker_modules` in the backend's registry entry), each timed. A fork server imports the same list once and the workers
forked from it inherit them; the instance report says which took how long, and where.

Imported by the worker and the fork server before any framework: nothing here imports one at module level.
"""

from __future__ import annotations

import importlib
import sys
import time

JOB_MODULES = ("corescale.config", "corescale.machine.placement", "corescale.workload.models")  # to read its job
# what every worker uses, whatever its backend
WORKER_MODULES = ("numpy", "corescale.backends", "corescale.machine.environment",
                  "corescale.measure.timing", "corescale.measure.contamination", "corescale.workload.inputs",
                  "corescale.workload.samples")
PREIMPORTED: dict[str, float] = {}  # set in a fork server: what it imported before forking this process, in s


def declared(backend: str) -> tuple[str, ...]:
    """What backend `backend` declares its worker imports to measure a built artifact (`{model}`: the model type's
    module name, e.g. bert)."""
    from corescale.backends import entry

    return entry(backend).worker_modules


def modules_for(backend: str, model_type: str) -> list[str]:
    """The worker's own modules, then its backend's."""
    model = model_type.replace("-", "_")
    return list(dict.fromkeys([*WORKER_MODULES, *(name.format(model=model) for name in declared(backend))]))


def timed_imports(modules: list[str]) -> dict[str, float]:
    """Imports each module, in order; module -> seconds it took here (0 when it was imported already). A module
    that fails is left out: what uses it imports it again and reports the error itself."""
    seconds = {}
    for name in modules:
        began = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception:  # see above
            continue
        seconds[name] = time.perf_counter() - began
    return seconds


def frameworks_loaded() -> list[str]:
    """The frameworks (top-level modules some backend declares) this process holds now."""
    from corescale.backends import BACKENDS

    tops = {name.split(".")[0] for backend in BACKENDS for name in declared(backend)}
    return sorted(name for name in tops - {"corescale"} if name in sys.modules)


def report(own: dict[str, float]) -> dict:
    """The instance report's `imports`: this process's import times, the fork server's (when it was forked from
    one) and the frameworks it held once its backend was loaded."""
    return {"seconds": own, "fork_server_seconds": dict(PREIMPORTED) or None, "frameworks": frameworks_loaded()}
