"""Deployment targets: `corescale deploy BUNDLE --target NAME` hands a measured bundle to a serving engine the
user already runs (docs/deploy.md). Light on purpose, like the backend registry: each target is one entry (what it
does, the Python modules it needs and the extra that installs them, whether it writes files into --out, and the
"module:function" that runs it, imported only when chosen); nothing here imports an engine.

A target's function takes the bundle's folder and the typed DeployOptions and returns the exit code. Every target
reads the bundle through deploy/source.py first (the checks `corescale serve` makes of an untrusted bundle); a
target that writes files gets a new or empty --out and writes it whole (deploy/source.write_folder).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corescale.errors import RegistrationError, UserError

if TYPE_CHECKING:
    from corescale.serve.opened import Trust


@dataclass(frozen=True)
class DeployOptions:
    """What the deploy command line says, typed; each target reads the fields it uses."""

    out: Path | None = None  # targets that write files: a new or empty folder
    host: str = "127.0.0.1"  # targets that serve: where to listen (as `corescale serve`)
    port: int = 8080
    api_key: str | None = None
    trust: Trust | None = None  # --trust-remote-code, --allow-pickle (None: neither)
    key: bytes | None = None  # --verify KEYFILE: the bundle's signature must verify with it
    name: str | None = None  # the application's / the Kubernetes objects' name (default: from the model)
    image: str | None = None  # kubernetes: the image built from the bundle's Dockerfile.example
    namespace: str | None = None  # kubernetes: the objects' namespace (default: none written, kubectl's)
    threads_per_core: int | None = None  # kubernetes: the nodes' (default: the measuring machine's)
    address: str | None = None  # ray: the cluster (HOST:PORT or auto); None: a private local one on loopback
    served_model_names: tuple[str, ...] = ()  # --served-model-name: what the service answers to (serve/names.py)
    protections: dict[str, Any] = field(default_factory=dict)  # serve's bounds given here (serve.service.Options')
    protection_words: tuple[str, ...] = ()  # the same as `corescale serve` words (the given ones, for a pod's line)
    behind_proxy: bool = False  # ray: exposed behind a reverse proxy that bounds connections (docs/deploy.md)
    no_api_key: bool = False  # kubernetes: the pods serve without the key Secret


@dataclass(frozen=True)
class Target:
    """One deployment target."""

    summary: str  # one line: what it makes
    run: str | None  # "module:function(bundle: Path, options: DeployOptions) -> int"; None: not built yet
    requires: tuple[str, ...] = ()  # Python modules it imports (checked before the bundle is read)
    extra: str | None = None  # the corescale extra that installs them
    writes: bool = False  # writes files into --out (then --out is required) rather than serving

    def check(self, name: str) -> None:
        if not name.isidentifier() or not self.summary:
            raise RegistrationError(f"deploy target '{name}': a name and a summary are required")
        if self.run is not None and ":" not in self.run:
            raise RegistrationError(f"deploy target '{name}': run must be 'module:function', got {self.run!r}")


TARGETS: dict[str, Target] = {}


def register(name: str, target: Target) -> Target:
    if name in TARGETS and TARGETS[name] != target:
        raise RegistrationError(f"deploy target '{name}' is registered already")
    target.check(name)
    TARGETS[name] = target
    return target


register("kubernetes", Target(
    "manifests to apply: a Deployment of Guaranteed pods on the layout's whole cores, its Service and an "
    "autoscaler on the measured capacity (docs/deploy.md#kubernetes)",
    "corescale.deploy.kubernetes:deploy", writes=True))
register("ray", Target(
    "a Ray Serve application on the connected Ray cluster, one replica per measured core block (docs/ray.md)",
    "corescale.deploy.ray_serve:serve_on_ray", requires=("ray", "fastapi", "uvicorn", "prometheus_client"),
    extra="ray"))


def target(name: str) -> Target:
    """The registered target of this name, built and with its modules installed; else one line."""
    if name not in TARGETS:
        raise UserError(f"unknown deploy target '{name}'; allowed: {', '.join(sorted(TARGETS))}")
    found = TARGETS[name]
    if found.run is None:
        raise UserError(f"deploy target '{name}' is not built in this corescale version yet")
    missing = [m for m in found.requires if importlib.util.find_spec(m) is None]
    if missing:
        install = f"pip install 'corescale[{found.extra}]'" if found.extra else f"pip install {' '.join(missing)}"
        raise UserError(f"deploy target '{name}' needs {', '.join(missing)}: {install}")
    return found


def runner(found: Target) -> Callable[[Path, DeployOptions], int]:
    """The function a built target names (imports its module)."""
    module, _, function = str(found.run).partition(":")
    return getattr(importlib.import_module(module), function)
