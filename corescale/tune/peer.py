"""The tune's peer baseline (`peer=auto|none|NAME`): the library a user would call instead of corescale, out of
the box (sentence-transformers' `encode()` for embed, `CrossEncoder.predict()` for rerank), measured beside
out-of-box PyTorch: one instance on all cores, the same texts and batch, `tune.repeats` fresh processes in the
final stage. It is measured, never searched or recommended: it is not a deployment corescale makes.

auto (default): the first registered backend that declares a peer call for the model's task, when it is
installed, loads the model (a directory) and the tune times real text (`workload=` and `tokenize=true`), offline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corescale.backends import BACKENDS, check_available, entry
from corescale.errors import UserError
from corescale.tune.space import baseline_overrides

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class Peer:
    overrides: list[str] = field(default_factory=list)  # empty: no peer measured
    label: str = ""  # "peer: sentence-transformers encode()"
    note: str = ""  # why none is measured (auto)


def choose(setting: str, cfg: BenchmarkConfig, model, base: list[str], scenario: str) -> Peer:
    """The peer of this tune; an explicit one that cannot run here is one line (the caller checks it runs)."""
    if setting == NONE:
        return Peer(note="peer=none")
    if setting != AUTO:
        found = entry(setting)
        if found.peer_call(model.task) is None:
            peers = [n for n, e in BACKENDS.items() if e.peer_call(model.task)]
            raise UserError(f"peer={setting} is not a peer baseline of task={model.task}; allowed: "
                            f"{', '.join([AUTO, NONE, *peers])}")
        check_available(setting)
        return _peer(setting, model.task, base)
    for name, e in BACKENDS.items():
        if e.peer_call(model.task) is None:
            continue
        why = _unfit(name, cfg, model, scenario)
        if why:
            return Peer(note=f"peer {name}: {why}")
        return _peer(name, model.task, base)
    return Peer(note=f"no peer baseline for task={model.task}")


def _peer(name: str, task: str, base: list[str]) -> Peer:
    return Peer(baseline_overrides(base, name), f"peer: {entry(name).peer_call(task)}")


def _unfit(name: str, cfg: BenchmarkConfig, model, scenario: str) -> str:
    """Why backend `name` cannot be auto's peer here ('' when it can)."""
    try:
        check_available(name)
        entry(name).options().check_model(model)
    except UserError as exc:
        return str(exc)
    if scenario != "offline" or not (cfg.tokenize and cfg.workload.source):
        return "it times real text in the offline loop: give workload=builtin tokenize=true"
    return ""
