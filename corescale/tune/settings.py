"""The tune's own words, taken out of the overrides before Hydra sees the rest: the objective (a table, so a
new one is one entry), constraints, the budget, `space.<name>=[...]` and the `tune.*` knobs of the search."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from corescale.backends import OPTIONS
from corescale.errors import UserError
from corescale.overrides import override_key


@dataclass(frozen=True)
class Objective:
    """What a tune optimises: a figure of one measurement, and which way is better."""

    name: str
    metric: str  # a key of Figures (verdict.figures)
    direction: Literal["maximize", "minimize"]
    unit: str
    needs_price: bool = False
    scenario: str = "offline"  # server: every trial (the baseline too) is a LoadGen max-QPS search under the SLO


# objective=NAME -> what it optimises (its figure comes from verdict.figures).
OBJECTIVES: dict[str, Objective] = {
    "throughput": Objective("throughput", "throughput", "maximize", "samples/s"),
    "latency": Objective("latency", "p50_ms", "minimize", "ms p50"),
    "cost": Objective("cost", "cost_per_1m", "minimize", "US$ per 1M", needs_price=True),
    "server_qps": Objective("server_qps", "server_qps", "maximize", "QPS at p99 <= SLO", scenario="server"),
}
# constraint=LIMIT -> (figure it bounds, unit): a measurement over a limit does not count
CONSTRAINTS = {"slo_p99_ms": ("p99_ms", "ms"), "max_memory_gb": ("memory_gb", "GB"), "max_drift": ("drift", "")}
WORDS = ("objective", "budget", "trials", "price_per_hour", "machine", "peer", *CONSTRAINTS)
PRIOR_SOURCES = ("all", "earlier", "lab", "none")  # tune/priors.py SOURCES, in the same order
PRIOR_WORDS = {"true": "all", "false": "none"}
KNOBS = {  # tune.NAME: (default, check, what is allowed)
    "top_k": (3, lambda v: isinstance(v, int) and 1 <= v <= 10, "a whole number from 1 to 10"),
    "repeats": (3, lambda v: isinstance(v, int) and 2 <= v <= 20, "a whole number from 2 to 20"),
    "screen": (None, lambda v: isinstance(v, float) and v > 0, "seconds > 0 (default: a quarter of duration, "
               "at least 1 s)"),
    "eta": (3, lambda v: isinstance(v, int) and 2 <= v <= 10, "a whole number from 2 to 10"),
    # which priors seed the search (tune/priors.py SOURCES): all | earlier (this machine kind's earlier tunes'
    # winners only) | lab (PRIORS only) | none (neither); true and false say all and none
    "priors": ("all", lambda v: v in PRIOR_SOURCES, "all (earlier tunes' winners and the lab priors), earlier, "
               "lab or none (true: all, false: none)"),
}
OWNED = ("layout", "repeats", "repeat_order", "reference", "drift_tolerance", "total_batch_size")
LOAD_MARGIN_S = 5.0  # the least a trial spends outside its window (processes, imports, load, warm-up)
# A budgeted tune keeps at least this share of its budget for the final stage: a longer budget buys more final
# repeats of the searched finalists (until the leader is separated), not only more screens.
FINAL_SHARE = 0.15
MAX_FINAL_REPEATS = 10  # the most repeats the final stage gives a searched finalist when its reserve allows


@dataclass
class TuneSettings:
    objective: Objective
    overrides: list[str]  # what Hydra composes: the user's fixed settings
    space: dict[str, list[str]] = field(default_factory=dict)  # space.NAME=[...] as given
    slo_p99_ms: float | None = None
    max_memory_gb: float | None = None
    max_drift: float | None = None
    budget_s: float | None = None
    trials: int | None = None
    price_per_hour: float | None = None
    machine: str | None = None
    top_k: int = 3
    repeats: int = 3
    screen: float | None = None
    eta: int = 3
    node_types: list[str | None] = field(default_factory=lambda: [None])  # executor=ray: one tune per type
    prices: dict[str, float] = field(default_factory=dict)  # price_per_hour={a:0.34,b:2.04}: per node type
    machines: dict[str, str] = field(default_factory=dict)  # machine={a:NAME,b:NAME}: catalog names per type
    peer: str = "auto"  # the peer baseline measured beside out-of-box: auto | none | a peer backend (tune/peer.py)
    priors: str = "all"  # tune.priors: which priors seed the search (PRIOR_SOURCES)

    def to_json(self) -> dict:
        return {"objective": self.objective.name, "overrides": self.overrides, "space": self.space,
                "slo_p99_ms": self.slo_p99_ms, "max_memory_gb": self.max_memory_gb, "max_drift": self.max_drift,
                "budget_s": self.budget_s, "trials": self.trials, "price_per_hour": self.price_per_hour,
                "machine": self.machine, "top_k": self.top_k, "repeats": self.repeats, "screen": self.screen,
                "eta": self.eta, "node_types": self.node_types, "prices": self.prices, "machines": self.machines,
                "peer": self.peer, "priors": self.priors}

    def identity(self) -> dict:
        """What names the tune (its directory and study): everything but the budget, so a rerun with more
        budget or trials resumes the same study (and the node types, so adding one resumes the others). Priors
        other than all start a study of their own (its first trials differ); all keeps the names of the tunes
        before tune.priors."""
        return {k: v for k, v in self.to_json().items()
                if k not in ("budget_s", "trials", "node_types", "prices", "machines", "peer")
                and not (k == "priors" and v == "all")}

    def for_node_type(self, node_type: str | None) -> "TuneSettings":
        """The settings of one node type's tune: its own price or catalog machine."""
        import dataclasses

        if node_type is None:
            return dataclasses.replace(self, node_types=[None], prices={}, machines={})
        return dataclasses.replace(self, node_types=[node_type], prices={}, machines={},
                                   price_per_hour=self.prices.get(node_type, self.price_per_hour),
                                   machine=self.machines.get(node_type, self.machine))


def _number(key: str, text: str, cast: Callable = float):
    try:
        value = cast(text)
    except ValueError:
        kind = "a whole number" if cast is int else "a number"
        raise UserError(f"{key}: expected {kind}, got '{text}'") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{key}={text} is not a finite number; give a real number (nan, inf are not allowed)")
    if value <= 0:
        raise UserError(f"{key} must be > 0 (got {text})")
    return value


def parse_budget(text: str) -> float:
    """`300`, `300s`, `5m`, `1h`, `1m30s` -> seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not parts or not any(parts.groups()):
        raise UserError(f"budget: expected a duration such as 300s, 5m or 1h30m, got '{text}'")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not math.isfinite(total) or total <= 0:
        raise UserError(f"budget must be > 0 (got '{text}')")
    return total


def budget_text(seconds: float) -> str:
    """Seconds as budget= takes them (parse_budget's inverse, to the second): '90s', '5m', '1h30m'."""
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds}s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours}h{minutes}m" if hours and minutes else f"{hours}h" if hours else f"{minutes}m"


def parse_list(key: str, text: str) -> list[str]:
    """`[a,b]`, `a,b` or `a` -> ['a', 'b']."""
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        inner = inner[1:-1]
    values = [v.strip().strip("'\"") for v in inner.split(",") if v.strip()]
    if not values:
        raise UserError(f"{key}=[] leaves nothing to search: give at least one value, e.g. {key}=[a,b]")
    return values


def parse_per_type(key: str, text: str) -> tuple[str | None, dict[str, str]]:
    """`V` (every node type) or `{a:V,b:W}` / `a:V,b:W` (per node type) -> (V or None, {type: value})."""
    inner = text.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1]
    if ":" not in inner:
        return text, {}
    pairs = {}
    for part in filter(None, (p.strip() for p in inner.split(","))):
        name, sep, value = part.partition(":")
        if not sep or not name.strip() or not value.strip():
            raise UserError(f"{key}: expected a value or {{type:value,...}} per node type, got '{text}'")
        pairs[name.strip()] = value.strip()
    return None, pairs


def parse(words: list[str]) -> TuneSettings:
    """Splits the command's words: the tune's own settings, and the overrides Hydra composes."""
    found: dict[str, str] = {}
    space: dict[str, list[str]] = {}
    knobs: dict[str, Any] = {}  # tune.NAME=V, each checked by _knob
    node_types: list[str | None] = [None]
    overrides = []
    for word in words:
        key = override_key(word)
        value = word.split("=", 1)[1] if "=" in word else None
        if key.startswith("space."):
            if value is None:
                raise UserError(f"'{word}': write space.NAME=[value,...]")
            space[key.removeprefix("space.")] = parse_list(key, value)
        elif key.startswith("tune."):
            knobs[key.removeprefix("tune.")] = _knob(key, value)
        elif key in WORDS and value is not None and not word.startswith(("+", "~")):
            found[key] = value
        elif key == "executor.node_type" and value is not None and not word.startswith(("+", "~")):
            node_types = list(dict.fromkeys(parse_list(key, value)))
        elif unknown_constraint(word):
            raise UserError(f"unknown constraint '{key}': no such metric; constraints: {', '.join(CONSTRAINTS)}")
        elif key == "reference" and value is not None and value not in OPTIONS:
            overrides.append(word)  # the fp32 model a model file came from: every trial's quality is judged on it
        elif key in OWNED:
            raise UserError(f"tune sets {key} itself; remove {word} (use tune.repeats=N for the final re-measure)"
                            if key == "repeats" else f"tune sets {key} itself; remove {word}")
        else:
            overrides.append(word)
    # a service's SLO names the service: by default its highest rate under the SLO is what is tuned
    name = found.get("objective", "server_qps" if "slo_p99_ms" in found else "throughput")
    if name not in OBJECTIVES:
        raise UserError(f"unknown objective '{name}'; allowed: {', '.join(OBJECTIVES)}")
    settings = TuneSettings(OBJECTIVES[name], overrides, space, **knobs, node_types=node_types)
    for key in CONSTRAINTS:
        if key in found:
            setattr(settings, key, _number(key, found[key]))
    if "price_per_hour" in found:
        single, per_type = parse_per_type("price_per_hour", found["price_per_hour"])
        settings.price_per_hour = None if single is None else _number("price_per_hour", single)
        settings.prices = {t: _number(f"price_per_hour of node type {t}", v) for t, v in per_type.items()}
    if "machine" in found:
        settings.machine, settings.machines = parse_per_type("machine", found["machine"])
    _check_node_types(settings)
    settings.peer = found.get("peer", settings.peer)
    if "budget" in found:
        settings.budget_s = parse_budget(found["budget"])
    if "trials" in found:
        settings.trials = _number("trials", found["trials"], int)
    if settings.budget_s is None and settings.trials is None:
        settings.trials = 20
    if settings.objective.needs_price and settings.price_per_hour is None and not settings.machine and \
            not (settings.prices or settings.machines):
        raise UserError("objective=cost needs a price: give price_per_hour=$/h (this machine) or machine=NAME "
                        "(see corescale cost --list-machines)")
    _check_endpoint(settings)
    if settings.objective.scenario == "server" and settings.slo_p99_ms is None:
        raise UserError("objective=server_qps needs slo_p99_ms=MS: the p99 bound each configuration's highest "
                        "arrival rate is searched under (MLPerf's BERT bound is 130)")
    return settings


def _check_endpoint(settings: TuneSettings) -> None:
    """A tune over HTTP starts each trial's own service (endpoint=managed) and searches its QPS."""
    from corescale.http_keys import MANAGED

    given = {override_key(o): o.split("=", 1)[1] for o in settings.overrides if "=" in o}
    if "endpoint" not in given:
        return
    if given["endpoint"] != MANAGED:
        raise UserError(f"endpoint={given['endpoint']}: a tune changes the layout it measures, which a running server "
                        "does not let it do: give endpoint=managed (each trial starts `corescale serve` on its layout)")
    if settings.objective.scenario != "server":
        raise UserError("endpoint=managed measures each layout's service under LoadGen's load: give "
                        "objective=server_qps slo_p99_ms=MS")


def _check_node_types(settings: TuneSettings) -> None:
    """Per-type prices name tuned types; several types are ranked by cost per 1M, so each needs a price."""
    types = [t for t in settings.node_types if t is not None]
    for name in [*settings.prices, *settings.machines]:
        if name not in types:
            raise UserError(f"price_per_hour/machine name node type '{name}', which is not tuned; tuned: "
                            f"{', '.join(types) or 'none (give executor=ray executor.node_type=a,b)'}")
    if len(types) > 1:
        unpriced = [t for t in types if t not in settings.prices and t not in settings.machines
                    and settings.price_per_hour is None and settings.machine is None]
        if unpriced:
            raise UserError(f"executor.node_type={','.join(types)}: the node types are ranked by cost per 1M "
                            f"inferences, so each needs a price; missing for {', '.join(unpriced)}: give "
                            f"price_per_hour={{{','.join(f'{t}:USD_PER_HOUR' for t in types)}}} or "
                            f"machine={{{','.join(f'{t}:NAME' for t in types)}}} (corescale cost --list-machines)")


def scenario_overrides(settings: TuneSettings) -> list[str]:
    """What every trial of this objective measures in (the server scenario's QPS search under the SLO)."""
    if settings.objective.scenario != "server":
        return []
    return ["scenario=server", "target_qps=auto", f"slo_p99_ms={settings.slo_p99_ms:g}"]


def _knob(key: str, value: str | None):
    name = key.removeprefix("tune.")
    if name not in KNOBS:
        raise UserError(f"unknown setting '{key}'; tune settings: {', '.join(f'tune.{k}' for k in KNOBS)}")
    default, check, allowed = KNOBS[name]
    if name == "priors":
        word = (value or "").strip().lower()
        parsed_word = PRIOR_WORDS.get(word, word)
        if not check(parsed_word):
            raise UserError(f"{key}={value}: allowed {allowed}")
        return parsed_word
    try:
        parsed = float(value or "") if name == "screen" else int(value or "")
    except ValueError:
        parsed = None
    if parsed is None or not check(parsed) or (isinstance(parsed, float) and not math.isfinite(parsed)):
        raise UserError(f"{key}={value}: allowed {allowed}")
    return parsed


def unknown_constraint(word: str) -> str | None:
    """A word that looks like a constraint on a metric that does not exist (`max_foo=`, `slo_*=`, `min_*=`)."""
    import dataclasses

    from corescale.config import BenchmarkConfig

    key = override_key(word)
    config_keys = {f.name for f in dataclasses.fields(BenchmarkConfig)}
    if re.fullmatch(r"(max|min|slo)_\w+", key) and key not in CONSTRAINTS and key not in config_keys:
        return key
    return None
