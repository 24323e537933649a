"""What a worker tells its parent: one typed message per event, one JSON line each on the wire.

Written by the trial worker (measure/worker.py) to the launcher (measure/launcher.py), and by the explain worker
(explain/worker.py) to `corescale explain` (explain/run.py). `encode` and `decode` are the only way across: a line
that is not JSON, names an unknown event, or lacks a field or holds one of the wrong type is a ProtocolError.
The parent's commands to a worker (`Warmup`, `Start`, `Batch`, `Infer`, `Stop`) cross the other way, one text line
each (`say`, `heard`); measure/worker.py says when each comes. A worker's `Job` (its job file) is built by `Job.each`
alone.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from traceback import format_exc
from typing import TYPE_CHECKING, Any, ClassVar, Union

from corescale.errors import UserError

if TYPE_CHECKING:  # a worker imports these itself, timed (measure/imports.py JOB_MODULES)
    from corescale.config import BenchmarkConfig
    from corescale.machine.placement import InstanceSpec
    from corescale.workload.models import ModelSpec


class ProtocolError(ValueError):
    """A line from a worker that is not one of the messages below."""


@dataclass(frozen=True)
class TrialFiles:
    """The trial's files every worker may read (paths), beside its job."""

    queries: str | None = None  # the query set (.npz): served queries, or the closed loop's batches
    quality: str | None = None  # the quality set (.npz), checked by instance 0
    tokenizer: str | None = None  # tokenize=true: the tokenizer's directory


NO_FILES = TrialFiles()


@dataclass(frozen=True)
class Job:
    """What one worker runs: the config, the model, its instance, the CPUs of all the trial's instances (its
    siblings' load is not foreign) and the trial's files. One JSON file, its path the worker's argument."""

    config: BenchmarkConfig
    model: ModelSpec
    instance: InstanceSpec
    trial_cpus: tuple[int, ...]
    files: TrialFiles = NO_FILES

    @classmethod
    def each(cls, cfg: BenchmarkConfig, model: ModelSpec, specs: list[InstanceSpec],
             files: TrialFiles = NO_FILES) -> list[Job]:
        """One job per instance of a trial."""
        cpus = tuple(sorted(c for spec in specs for c in spec.cpus))
        return [cls(cfg, model, spec, cpus, files) for spec in specs]

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "model": dataclasses.asdict(self.model),
                "instance": self.instance.to_json(), "trial_cpus": list(self.trial_cpus),
                **dataclasses.asdict(self.files)}

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_json(), default=str))
        return path

    @classmethod
    def read(cls, path: str | Path) -> Job:
        from corescale.config import BenchmarkConfig
        from corescale.machine.placement import InstanceSpec
        from corescale.workload.models import ModelSpec

        data = json.loads(Path(path).read_text())
        files = TrialFiles(**{f.name: data.get(f.name) for f in dataclasses.fields(TrialFiles)})
        return cls(BenchmarkConfig.from_dict(data["config"]), ModelSpec(**data["model"]),
                   InstanceSpec.from_json(data["instance"]), tuple(data["trial_cpus"]), files)


@dataclass(frozen=True)
class Loaded:
    """The backend is loaded; the worker waits for `warmup` (sent once every instance is loaded)."""

    EVENT: ClassVar[str] = "loaded"
    load_seconds: float
    artifact: str | None = None  # the file the backend runs (its model_path), where it has one


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
    # serving LoadGen's queries: [rows, median ns] of warm calls of real queries drawn from the query set, padded as
    # served (the search's capacity estimate: qps_search.slo_capacity)
    real_calls: list | None = None


@dataclass(frozen=True)
class Checked:
    """Instance 0 of a served trial checked its artifact's quality during its warm-up (measure/quality.py), before
    any LoadGen test: the parent judges it and runs no test when it misses the gate."""

    EVENT: ClassVar[str] = "checked"
    quality: dict


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
class Unanswered:
    """One `infer` batch the worker could not compute (the exception's message): the worker keeps serving, the
    parent fails that batch's requests. `batch` is -1 when the line was too malformed to hold its number."""

    EVENT: ClassVar[str] = "unanswered"
    batch: int
    message: str


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


@dataclass(frozen=True)
class Warmup:
    """Every instance is loaded: warm up under the load the window will see."""

    WORD: ClassVar[str] = "warmup"


@dataclass(frozen=True)
class Start:
    """Every instance is ready: the timed window (or serving) starts at this instant (time.perf_counter_ns)."""

    WORD: ClassVar[str] = "start"
    ns: int


@dataclass(frozen=True)
class Batch:
    """LoadGen's queries, by index into the trial's query set: answered with `Served`."""

    WORD: ClassVar[str] = "batch"
    number: int
    queries: tuple[int, ...]


@dataclass(frozen=True)
class Infer:
    """`corescale serve`'s rows: each row's token ids, and its token type ids where it has them (a pair);
    answered with `Answered`, the output rows."""

    WORD: ClassVar[str] = "infer"
    number: int
    ids: list[list[int]]
    types: list[list[int] | None]


@dataclass(frozen=True)
class Stop:
    """Serving is over: the instance sends its `Result` and ends."""

    WORD: ClassVar[str] = "stop"


Command = Union[Warmup, Start, Batch, Infer, Stop]
COMMANDS: dict[str, type[Command]] = {cls.WORD: cls for cls in typing.get_args(Command)}


def say(command: Command) -> str:
    """The parent's one line to a worker, newline included: the word, then its fields separated by spaces (a
    batch's indices by commas; an infer's rows by semicolons, each row's ids by commas, `/` before its type ids)."""
    if isinstance(command, Start):
        return f"start {command.ns}\n"
    if isinstance(command, Batch):
        return f"batch {command.number} {','.join(map(str, command.queries))}\n"
    if isinstance(command, Infer):
        rows = (",".join(map(str, ids)) + ("" if types is None else "/" + ",".join(map(str, types)))
                for ids, types in zip(command.ids, command.types))
        return f"infer {command.number} {';'.join(rows)}\n"
    return f"{command.WORD}\n"


def heard(line: str) -> Command | None:
    """The command a worker's input line holds; None at end of input."""
    words = line.split()
    if not words:
        return None
    cls = COMMANDS.get(words[0])
    try:
        if cls is Start:
            return Start(int(words[1]))
        if cls is Batch:
            return Batch(int(words[1]), tuple(int(i) for i in words[2].split(",")))
        if cls is Infer:  # a row may be empty (no ids): its field then is empty too
            _, number, field = line.rstrip("\r\n").split(" ", 2)
            rows = [row.partition("/") for row in field.split(";")]
            return Infer(int(number), [ints(ids) for ids, _, _ in rows],
                         [ints(types) if types else None for _, _, types in rows])
    except (IndexError, ValueError):  # (a missing field: too few values to unpack is a ValueError)
        raise ProtocolError(f"a malformed '{words[0]}' command: {_excerpt(line)}") from None
    if words == [Warmup.WORD]:
        return Warmup()
    if words == [Stop.WORD]:
        return Stop()
    raise ProtocolError(f"not a command: {_excerpt(line)} (known: {', '.join(COMMANDS)})")


def ints(text: str) -> list[int]:
    """`1,2,3` as its numbers; an empty text as no numbers."""
    return [int(i) for i in text.split(",")] if text else []


def infer_number(line: str) -> int:
    """The batch number of an `infer` line too malformed to read (-1 when it has none)."""
    words = line.split()
    return int(words[1]) if len(words) > 1 and words[0] == Infer.WORD and words[1].lstrip("-").isdigit() else -1


Message = Union[Loaded, Warming, Ready, Checked, Progress, Served, Answered, Unanswered, Result, Profiled,
                WorkerFailure]
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
