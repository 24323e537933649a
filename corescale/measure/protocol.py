"""What a worker tells its parent: one typed message per event, one JSON line each on the wire.

Written by the trial worker (measure/worker.py) to the launcher (measure/launcher.py), and by the explain worker
(explain/worker.py) to `corescale explain` (explain/run.py). `encode` and `decode` are the only way across: a line
that is not JSON, names an unknown event, or lacks a field or holds one of the wrong type is a ProtocolError.
The parent's words to a worker (`warmup`, `start NS`, `batch N I,J`, `infer N IDS;IDS`, `stop`, `abort`) are
documented in measure/worker.py.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from traceback import format_exc
from typing import Any, ClassVar, Union

from corescale.errors import UserError


class ProtocolError(ValueError):
    """A line from a worker that is not one of the messages below."""


@dataclass(frozen=True)
class Loaded:
    """The backend is loaded; the worker waits for `warmup` (sent once every instance is loaded)."""

    EVENT: ClassVar[str] = "loaded"
    load_seconds: float
    artifact: str | None = None  # the file the backend runs (its info()'s model_path), where it has one


@dataclass(frozen=True)
class Calls:
    """Calls done so far: of the warm-up (Warming), of the timed window (Progress)."""

    done: int


@dataclass(frozen=True)
class Warming(Calls):
    EVENT: ClassVar[str] = "warmup"


@dataclass(frozen=True)
class Progress(Calls):
    EVENT: ClassVar[str] = "progress"


@dataclass(frozen=True)
class Ready:
    """Warm-up is over (stable or not); the worker keeps calling the model until `start NS`."""

    EVENT: ClassVar[str] = "ready"
    warmup_iterations: int
    converged: bool
    call_ns: int  # a warm call's median duration: the start instant leaves room for two
    single_ns: int | None = None  # serving: the fastest warm query at sequence_length


@dataclass(frozen=True)
class Served:
    """One batch the parent sent (serving), answered."""

    EVENT: ClassVar[str] = "served"
    batch: int
    start_ns: int
    end_ns: int
    length: int  # the length the batch was padded to
    real_tokens: int


@dataclass(frozen=True)
class Answered(Served):
    """One batch of token ids sent by `corescale serve` (an `infer` line), answered with its output rows: `shape`
    of the float32 array whose little-endian bytes `rows` holds in base64 (one row per input, in order)."""

    EVENT: ClassVar[str] = "answered"
    shape: list = dataclasses.field(default_factory=list)
    rows: str = ""


@dataclass(frozen=True)
class Result:
    """The instance's report (the record's entry for it); its fields travel flat beside the event's name."""

    EVENT: ClassVar[str] = "result"
    report: dict[str, Any]


@dataclass(frozen=True)
class Profiled:
    """The explain worker's measured latencies and profiled calls; flat on the wire, like Result."""

    EVENT: ClassVar[str] = "profile"
    profile: dict[str, Any]


FAILURE_KINDS = ("user", "error")  # user: bad input (a UserError), shown as one line; error: anything else


@dataclass(frozen=True)
class WorkerFailure:
    """The worker stopped on an exception."""

    EVENT: ClassVar[str] = "error"
    kind: str
    message: str
    traceback: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> WorkerFailure:
        """From the exception being handled (its traceback included)."""
        return cls("user" if isinstance(exc, UserError) else "error", str(exc) or type(exc).__name__,
                   format_exc())


Message = Union[Loaded, Warming, Ready, Progress, Served, Answered, Result, Profiled, WorkerFailure]
MESSAGES: dict[str, type[Message]] = {cls.EVENT: cls for cls in typing.get_args(Message)}
HINTS = {event: typing.get_type_hints(cls) for event, cls in MESSAGES.items()}  # once: it compiles each annotation
FLAT = {Result: "report", Profiled: "profile"}  # messages whose one dict field is spread over the line


def fields(message: Message) -> dict[str, Any]:
    """The message as the dict on the wire: `event` and its fields."""
    flat = FLAT.get(type(message))
    if flat:
        return {"event": message.EVENT, **getattr(message, flat)}
    return {"event": message.EVENT, **{f.name: getattr(message, f.name) for f in dataclasses.fields(message)}}


def encode(message: Message) -> str:
    """One line, newline included."""
    return json.dumps(fields(message), default=str) + "\n"


def decode(line: str | bytes) -> Message:
    try:
        data = json.loads(line)
    except ValueError:
        raise ProtocolError(f"not a JSON message: {_excerpt(line)}") from None
    return from_fields(data)


def from_fields(data: Any) -> Message:
    """The message a decoded JSON value holds."""
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise ProtocolError(f"a message without an event name: {_excerpt(json.dumps(data, default=str))}")
    data = dict(data)
    event = data.pop("event")
    cls = MESSAGES.get(event)
    if cls is None:
        raise ProtocolError(f"unknown event '{event}' (known: {', '.join(MESSAGES)})")
    if cls in FLAT:
        return cls(data)  # type: ignore[call-arg]  # a FLAT message has its one dict field
    _check(cls, data)
    message: Message = cls(**data)
    if isinstance(message, WorkerFailure) and message.kind not in FAILURE_KINDS:
        raise ProtocolError(f"'error' of unknown kind '{message.kind}' (known: {', '.join(FAILURE_KINDS)})")
    return message


def _check(cls: type[Message], data: dict[str, Any]) -> None:
    hints = HINTS[cls.EVENT]
    declared = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(declared))
    if unknown:
        raise ProtocolError(f"'{cls.EVENT}' with unknown fields {', '.join(unknown)}")
    for name, spec in declared.items():
        if name not in data:
            if spec.default is dataclasses.MISSING:
                raise ProtocolError(f"'{cls.EVENT}' without its field {name}")
        elif not _holds(data[name], hints[name]):
            raise ProtocolError(f"'{cls.EVENT}': {name}={data[name]!r} is not of type {_name(hints[name])}")


def _holds(value: Any, hint: Any) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is Union:
        return any(_holds(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _excerpt(line: str | bytes) -> str:
    text = line.decode(errors="replace") if isinstance(line, bytes) else line
    return repr(text[:120])
