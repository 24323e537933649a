"""The base of every backend's options: a Hydra config-group node (`backend=NAME backend.OPTION=VALUE`).

Each framework's options live beside its backend (`backends/<framework>/options.py`); this module and those
import no framework, so the config can hold them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from corescale.errors import UserError


@dataclass
class BackendOptions:
    name: str = "pytorch"
    # option -> allowed values, for the options that are a choice
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    # what its worker imports (timed, in order; a fork server imports them once) before it loads the backend
    worker_modules: ClassVar[tuple[str, ...]] = ()

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

    def check(self, cfg) -> None:
        """Checks of the options against the rest of the config (precision, the installed framework); called
        by config.validate, before any worker starts."""


def without_options(name: str, class_name: str, module: str, **facts) -> type[BackendOptions]:
    """The group node of a backend with no options of its own (yet): only its name (and `facts`, class
    attributes). `module` is where the class is bound under `class_name`, so it pickles (Ray sends configs to its
    nodes)."""
    cls = dataclasses.make_dataclass(class_name, [("name", str, dataclasses.field(default=name))],
                                     bases=(BackendOptions,), namespace=facts)
    cls.__module__ = module
    return cls
