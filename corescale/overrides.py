"""Hydra override grammar -> BenchmarkConfig, and `-m` sweeps -> one override list per trial."""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

from omegaconf import OmegaConf

from corescale.backends import DEFAULT_BACKEND, OPTIONS
from corescale.config import (
    EXECUTORS,
    RENAMED_OPTIONS,
    SCHEMA_NAME,
    BenchmarkConfig,
    register_hydra_schema,
    validate,
)
from corescale.errors import UserError

# config groups: `backend=onnxruntime` selects a node, `backend.fusion=true` sets one of its options
GROUPS: dict[str, dict[str, type]] = {"backend": OPTIONS, "executor": EXECUTORS}
DEFAULT_SELECTION = {"backend": DEFAULT_BACKEND, "executor": "local"}


def _allowed_keys() -> str:
    names = [f.name for f in dataclasses.fields(BenchmarkConfig)]
    return ", ".join(names)


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _group_settings(group: str) -> str:
    options = GROUPS[group]
    listed = [f"{name}: {', '.join(f.name for f in dataclasses.fields(node) if f.name != 'name')}"
              for name, node in options.items() if len(dataclasses.fields(node)) > 1]
    return f"{group} settings: {'; '.join(listed)}"


def _explain_group(key: str, text: str, selected: dict[str, str]) -> str | None:
    missing = re.search(r"Could not find '(\w+)/([^']*)'", text)
    if missing and missing.group(1) in GROUPS:
        group, value = missing.groups()
        return f"unknown {group} '{value}'; allowed: {', '.join(GROUPS[group])}"
    group = key.split(".", 1)[0]
    if "." in key and group in GROUPS and (text.startswith("Could not override") or "not in" in text):
        return (f"unknown key '{key}' for {group}={selected.get(group, DEFAULT_SELECTION[group])}; "
                f"{_group_settings(group)}")
    return None


def _explain(override: str, exc: Exception, selected: dict[str, str] | None = None) -> str:
    cause = exc.__cause__ or exc
    text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    key = override_key(override)
    grouped = _explain_group(key, text, selected or {})
    if grouped:
        return grouped
    if text.startswith("Could not override") or "not in struct" in text or "Key '" in text and "not" in text:
        return f"unknown key '{key}'; allowed keys: {_allowed_keys()}"
    match = re.search(r"could not be converted to (\w+)", text) or re.search(r"is not a valid (\w+)", text)
    if match:
        value = override.split("=", 1)[1] if "=" in override else ""
        return f"{key}: expected {match.group(1).lower()}, got '{value}'"
    return f"invalid override '{override}': {text}"


def assignment(key: str, value) -> str:
    """`key=value` as an override Hydra parses back to exactly `value`: quoted when it holds characters of the
    override grammar (a path with spaces, brackets or commas), as code that writes overrides must."""
    text = str(value)
    if re.fullmatch(r"[\w./~+:@%-]+", text, re.ASCII):  # Hydra takes no other letters unquoted
        return f"{key}={text}"
    if "'" not in text:
        return f"{key}='{text}'"
    if '"' not in text:
        return f'{key}="{text}"'
    return f"{key}='" + text.replace("'", "\\'") + "'"


GRAMMAR = frozenset(",[]{}()'\"")  # characters whose unquoted meaning Hydra's override grammar defines


def shorthand(overrides: list[str]) -> list[str]:
    """`workload=PATH[:FIELD]` sets workload.source; `workload.lengths=uniform(A,B)` is quoted for Hydra (whose
    grammar would read it as a function call); a value with letters outside ASCII (a path such as
    `output_dir=/home/josé/out`, which Hydra's grammar refuses unquoted) and no character of the grammar is
    quoted, since it can mean nothing else."""
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "workload" and "=" in override:
            override = f"workload.source={value}"
        elif key == "quality.eval":  # the quality section's spelling of quality_eval
            override = f"quality_eval={value}"
        elif key == "workload.lengths" and value[:1] not in ("'", '"') and "(" in value or \
                "=" in override and not value.isascii() and not GRAMMAR & set(value):
            override = assignment(key, value)
        out.append(override)
    return out


def check_renamed(overrides: list[str]) -> None:
    """0.1's flat backend options name their new spelling."""
    for override in overrides:
        key = override_key(override)
        if key in RENAMED_OPTIONS:
            owner, option = RENAMED_OPTIONS[key]
            value = override.split("=", 1)[1] if "=" in override else "VALUE"
            raise UserError(f"'{key}' is now an option of the backend group: write backend={owner} "
                            f"backend.{option}={value}")


def parse_overrides(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        raise UserError(f"cannot parse overrides {' '.join(overrides)}: {str(exc).splitlines()[0]}; quote a value "
                        "that holds brackets, commas, quotes or '=' (key='a value [b]')") from None
    for override in parsed:
        refuse_prefixed(override)
    return parsed


PREFIXED = {"ADD": ("+", "adds a key"), "FORCE_ADD": ("++", "adds or sets a key"), "DEL": ("~", "deletes a key")}


def refuse_prefixed(override) -> None:
    """Hydra's `+key=`, `++key=` and `~key` have no meaning here: the schema's keys are fixed and each has a
    default (Hydra would ignore an added key and silently reset a deleted one)."""
    if override.type.name not in PREFIXED:
        return
    prefix, what = PREFIXED[override.type.name]
    key = override.key_or_group
    value = override.input_line.split("=", 1)[1] if "=" in override.input_line else "VALUE"
    known = key.split(".", 1)[0] in {f.name for f in dataclasses.fields(BenchmarkConfig)}
    fix = (f"write {key}={value} to set it, or leave it out for its default" if known else
           f"and '{key}' is not a key either; allowed keys: {_allowed_keys()}")
    raise UserError(f"'{override.input_line}': Hydra's {prefix}key ({what}) is not supported, corescale's keys are "
                    f"fixed and each has a default; {fix}")


_HYDRA = threading.RLock()


def compose(overrides: list[str]) -> BenchmarkConfig:
    """One trial's overrides -> a validated config (unknown keys and wrong types are UserErrors)."""
    overrides = shorthand(overrides)
    check_renamed(overrides)
    parse_overrides(overrides)
    with _HYDRA:  # Hydra's state is global: one compose at a time (node types tune in threads)
        composed = _hydra_compose(overrides)
    data = _resolved(composed)
    assert isinstance(data, dict), "a composed structured config is a mapping"
    return validate(BenchmarkConfig.from_dict({str(k): v for k, v in data.items()}))


def _resolved(composed) -> Any:
    """The composed config as plain values; an interpolation (`${...}`) that cannot be resolved to a value of its
    key's type is one line naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(composed, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "a value"
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"cannot resolve the interpolation in {key}: {message[:200]}; a `${{...}}` refers "
                        "to another key or a resolver; write \\${ for a literal ${") from None


def _hydra_compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize
    from hydra.core.global_hydra import GlobalHydra

    register_hydra_schema()
    GlobalHydra.instance().clear()
    with initialize(version_base=None, config_path=None):
        try:
            return hydra_compose(SCHEMA_NAME, overrides)
        except Exception:  # hydra raises several kinds; find the override at fault
            groups = [o for o in overrides if override_key(o) in GROUPS]  # a group's keys need its selection
            selected = {override_key(o): o.split("=", 1)[-1] for o in groups}
            for override in groups + [o for o in overrides if o not in groups]:
                try:
                    hydra_compose(SCHEMA_NAME, [*(g for g in groups if g != override), override])
                except Exception as exc:
                    raise UserError(_explain(override, exc, selected)) from None
            raise UserError(f"invalid overrides: {' '.join(overrides)}") from None


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Cartesian product of swept values, in Hydra's BasicSweeper order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    batches = BasicSweeper.split_arguments(parse_overrides(shorthand(overrides)), None)
    return [trial for batch in batches for trial in batch]
