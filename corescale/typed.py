"""JSON -> frozen dataclasses, checked against their annotations: a value of the wrong type read back from a
file is one UserError line naming where it is (`server.steps[2].queries: expected int, got 'x'`), never a
traceback further on. Supports None, bool, int, float, str, Any, X | Y, list[X], tuple[X, ...], dict[str, X]
and nested dataclasses. Keys a dataclass does not declare go to its `extra` field when it has one (read and
written back as they were), else they are dropped."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

from corescale.errors import UserError

EXTRA = "extra"  # the field that keeps the keys a section does not name
T = TypeVar("T")
S = TypeVar("S", bound="Section")


@dataclasses.dataclass(frozen=True)
class Section:
    """A typed part of a JSON document (subclasses are frozen dataclasses): `from_dict` checks every value,
    `to_dict` writes the same shape back."""

    @classmethod
    def from_dict(cls: type[S], data: Any, where: str = "") -> S:
        return checked(cls, data, where or cls.__name__)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != EXTRA}
        out.update(getattr(self, EXTRA, {}))
        return out


def plain(value: Any) -> Any:
    """A value as JSON holds it: sections as their dicts, tuples as lists."""
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def checked(cls: type[T], data: Any, where: str) -> T:
    """An instance of dataclass `cls` from its JSON object `data` (`where` names it in errors)."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected an object, got {_shown(data)}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in _fields(cls):
        if f.name == EXTRA:
            names = {g.name for g in _fields(cls)}
            values[EXTRA] = {k: v for k, v in data.items() if k not in names}
        elif f.name in data:
            values[f.name] = _value(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise UserError(f"{where}: '{f.name}' is missing")
    return cls(**values)


def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    return dataclasses.fields(cls)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _value(kind: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _value(option, value, where)
            except UserError as exc:
                problems.append(str(exc))
        raise UserError(problems[0] if len(problems) == 1 else f"{where}: unexpected {_shown(value)}")
    if kind is type(None):
        if value is not None:
            raise UserError(f"{where}: expected null, got {_shown(value)}")
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {_shown(value)}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {_shown(value)}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: expected a number, got {_shown(value)}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: expected a string, got {_shown(value)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {_shown(value)}")
        item = args[0] if args else Any
        items = [_value(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected an object, got {_shown(value)}")
        item = args[1] if len(args) == 2 else Any
        return {str(k): _value(item, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return checked(kind, value, where)
    raise TypeError(f"{where}: unsupported annotation {kind!r}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
