"""Cost per 1M inferences from measured throughput and an hourly price; cheapest layout under a latency SLO.

cost per 1M = $/h ÷ (samples/s × 3600) × 1e6. A price for the machine that was measured gives a measured cost.
A catalog machine of another size or CPU gives a *projection*: the measured layout is copied as many times as it
fits on the target's cores, assuming those cores are as fast as the measured ones and copies do not slow each
other down (linear scaling); latency is assumed unchanged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from importlib import resources

import pandas as pd
import yaml

from corescale.analysis.store import ok_rows
from corescale.errors import UserError
from corescale.userfiles import read_text

FIELDS = ("price_per_hour", "vcpus", "physical_cores")
MEASURED, PROJECTION = "measured", "projection"
MAX_CPUS = 1 << 20  # vCPUs or cores of one catalog machine: more is a typo


@dataclass(frozen=True)
class Machine:
    name: str
    price_per_hour: float
    vcpus: int
    physical_cores: int
    cpu_model: str = ""
    note: str = ""
    measured_here: bool = False  # the price is for the very machine the results were measured on


def load_catalog(path=None) -> dict[str, Machine]:
    """Machines from the packaged catalog, or from a YAML file with the same layout."""
    where = f"machine catalog '{path}'" if path else "the packaged machine catalog"
    text = read_text(path, "machine catalog") if path is not None else (
        resources.files("corescale") / "data" / "machines.yaml").read_text()
    try:
        document = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: an int of too many digits
        raise UserError(f"cannot read {where}: {' '.join(str(exc).split())[:300]}") from None
    entries = document.get("machines") if isinstance(document, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise UserError(f"{where} holds no machines: expected a mapping `machines: {{NAME: {{price_per_hour: "
                        "$/h, vcpus: N, physical_cores: N}}`")
    return {str(name): _machine(str(name), entry, where) for name, entry in entries.items()}


def _machine(name: str, entry, where: str) -> Machine:
    """One catalog entry, checked: a mapping with a finite price > 0 and whole vCPU and core counts >= 1."""
    if not isinstance(entry, dict):
        raise UserError(f"machine '{name}' in {where} must be a mapping of {', '.join(FIELDS)} "
                        f"(got {str(entry)[:80]})")
    wrong = [f"{f}={repr(entry.get(f))[:40]}" for f in FIELDS if not _usable(f, entry.get(f))]
    if wrong:
        raise UserError(f"machine '{name}' in {where} has unusable {', '.join(wrong)}: price_per_hour must be a "
                        f"finite number > 0, vcpus and physical_cores whole numbers from 1 to {MAX_CPUS}")
    if entry["physical_cores"] > entry["vcpus"]:
        raise UserError(f"machine '{name}' in {where} has more physical_cores ({entry['physical_cores']}) than "
                        f"vcpus ({entry['vcpus']})")
    return Machine(name, float(entry["price_per_hour"]), int(entry["vcpus"]), int(entry["physical_cores"]),
                   str(entry.get("cpu_model") or ""), str(entry.get("note") or ""))


def _usable(field: str, value) -> bool:
    if isinstance(value, bool):
        return False
    if field == "price_per_hour":
        try:
            return isinstance(value, (int, float)) and math.isfinite(float(value)) and value > 0
        except OverflowError:  # an int beyond any float
            return False
    return isinstance(value, int) and 1 <= value <= MAX_CPUS


def find_machine(name: str, catalog: dict[str, Machine]) -> Machine:
    if name not in catalog:
        raise UserError(f"unknown machine '{name}'; known: {', '.join(sorted(catalog))} "
                        "(or give --price-per-hour for the machine you measured on)")
    return catalog[name]


def choose_machine(name: str | None, price: float | None, catalog_path=None) -> Machine:
    """--machine NAME (catalog), --price-per-hour P (the measured machine), or both (NAME at price P)."""
    if price is not None and not (math.isfinite(price) and price > 0):
        raise UserError(f"--price-per-hour must be a finite number > 0 (got {price})")
    if name:
        machine = find_machine(name, load_catalog(catalog_path))
        return machine if price is None else replace(machine, price_per_hour=price)
    if price is None:
        raise UserError("give --machine NAME (see --list-machines) or --price-per-hour PRICE")
    return Machine("this machine", price, 0, 0, measured_here=True)


def cost_per_million(price_per_hour: float, samples_per_s: float) -> float:
    """Dollars per one million inferences (samples) at a sustained throughput."""
    if not samples_per_s or samples_per_s <= 0:
        return float("inf")
    return price_per_hour / (samples_per_s * 3600) * 1e6


def _model_numbers(text: str) -> set[str]:
    return {token.lower() for token in re.findall(r"\b\w*\d{3,}\w*\b", text or "") if not token.isdigit()}


def same_cpu(machine: Machine, cpu_model: str | None) -> bool:
    """The catalog CPU's model number (e.g. 8275CL, 7R13) appears in the measured CPU's model name."""
    return bool(_model_numbers(machine.cpu_model) & _model_numbers(cpu_model or ""))


def basis(machine: Machine, row) -> tuple[str, int]:
    """(measured | projection, copies of the measured layout on the machine)."""
    if machine.measured_here or (machine.physical_cores == row.get("host_physical_cores")
                                 and same_cpu(machine, row.get("cpu_model"))):
        return MEASURED, 1
    units = machine.vcpus if row.get("use_logical_cores") else machine.physical_cores
    used = int(row.get("cpus_total") or 0)
    return PROJECTION, (units // used if used else 0)


def assumption(machine: Machine, cpu_model: str | None) -> str:
    return (f"projection to {machine.name} ({machine.physical_cores} cores, {machine.cpu_model or 'CPU unnamed'}): "
            f"assumes its cores are as fast as the measured {cpu_model or 'CPU'} and that copies of the measured "
            "layout fill its cores with no slowdown (linear scaling); latency unchanged")


def layout_label(row) -> str:
    """e.g. '2 × 1 cores · pytorch · batch 1 each · seq 128'."""
    each = " each" if row["instances"] > 1 else ""
    batch = row.get("instance_batch_size") if row.get("instance_batch_size") is not None else row["batch_size"]
    if row.get("scenario") == "server":
        batch, each = f"≤ {row.get('server.max_batch')} (dynamic)", " each"
    return (f"{row['instances']} × {row['cpus_per_instance']} cores · {row['backend']} · "
            f"batch {batch}{each} · seq {row['sequence_length']}")


def cost_table(frame: pd.DataFrame, machine: Machine, slo_p99_ms: float | None = None) -> pd.DataFrame:
    """One row per valid result: basis, copies, throughput on the machine, cost per 1M, SLO verdict."""
    rows = []
    for _, row in ok_rows(frame).iterrows():
        kind, copies = basis(machine, row)
        served = server_figures(row, slo_p99_ms)
        if served is None and row.get("scenario") in ("server", "single_stream"):
            continue  # a LoadGen result with no sustained rate to price (single stream, or INVALID)
        measured, p99, meets = served or (row["throughput_samples_per_s"], row["latency_p99_ms"], None)
        throughput = float(measured or 0) * copies
        if meets is None and slo_p99_ms is not None:
            meets = bool(p99 is not None and p99 <= slo_p99_ms)
        rows.append({
            "layout": layout_label(row), "model": row["model"], "run": row["run"], "basis": kind, "copies": copies,
            "measured_samples_per_s": measured, "machine_samples_per_s": throughput,
            "latency_p99_ms": p99, "cost_per_1m_usd": cost_per_million(machine.price_per_hour, throughput),
            "meets_slo": meets, "contaminated": row.get("contaminated"), "cpu_model": row.get("cpu_model"),
            "scenario": "server" if served else "offline",
        })
    table = pd.DataFrame(rows)
    return table.sort_values("cost_per_1m_usd", kind="stable", ignore_index=True) if rows else table


def cheapest(table: pd.DataFrame, slo_p99_ms: float | None = None):
    """The cheapest row (that meets the SLO, when one is given), or None."""
    if table.empty:
        return None
    usable = table[table["copies"] > 0]
    if slo_p99_ms is not None and has_server(table):  # open-loop verdicts, where there are any
        usable = usable[(usable["scenario"] == "server") & usable["meets_slo"].astype(bool)]
    elif slo_p99_ms is not None:
        usable = usable[usable["latency_p99_ms"] <= slo_p99_ms]
    return None if usable.empty else usable.sort_values("cost_per_1m_usd", kind="stable").iloc[0]


def answer(table: pd.DataFrame, machine: Machine, slo_p99_ms: float | None) -> str:
    """One sentence: the cheapest layout (meeting the SLO), labelled as projection where it is one."""
    best = cheapest(table, slo_p99_ms)
    condition = f" that meets p99 ≤ {slo_p99_ms:g} ms" if slo_p99_ms is not None else ""
    if best is None:
        if table.empty:
            return "no valid results to price"
        fastest = table.sort_values("latency_p99_ms").iloc[0]
        return (f"no measured layout{condition} on {machine.name}; the lowest p99 is "
                f"{fastest['latency_p99_ms']:.1f} ms ({fastest['layout']})" + closed_loop_note(table, slo_p99_ms))
    where = machine.name if best["basis"] == MEASURED else f"{machine.name} (projection: {best['copies']} copies)"
    rate = "QPS (LoadGen server, p99 within its SLO)" if best.get("scenario") == "server" else "samples/s"
    return (f"cheapest measured layout{condition}: {best['layout']} on {where}: "
            f"${best['cost_per_1m_usd']:.4g} per 1M inferences at {best['machine_samples_per_s']:.1f} {rate}, "
            f"p99 {best['latency_p99_ms']:.1f} ms (${machine.price_per_hour:g}/h)"
            + closed_loop_note(table, slo_p99_ms))


CLOSED_LOOP_NOTE = ("; only closed-loop results: their p99 is measured saturated, at a rate an open-loop server "
                    "would queue without bound; for an SLO verdict run scenario=server target_qps=auto "
                    "slo_p99_ms=MS")


def has_server(table: pd.DataFrame) -> bool:
    return "scenario" in table.columns and bool((table["scenario"] == "server").any())


def closed_loop_note(table: pd.DataFrame, slo_p99_ms: float | None) -> str:
    return CLOSED_LOOP_NOTE if slo_p99_ms is not None and not has_server(table) else ""


def server_figures(row, slo_p99_ms: float | None) -> tuple[float, float, bool | None] | None:
    """(sustained QPS, its p99, meets the asked SLO) of a LoadGen server result: the max valid QPS of a search,
    or the target of a VALID fixed-rate run; it meets an SLO no tighter than the one it was measured under."""
    if row.get("scenario") != "server":
        return None
    qps = row.get("server_max_valid_qps")
    if _missing(qps):
        if row.get("server_validity") != "VALID" or row.get("target_qps") in (None, "auto"):
            return None
        qps = float(row["target_qps"])
    measured_slo = row.get("slo_p99_ms")
    p99 = row.get("server_p99_ms")
    meets = None if slo_p99_ms is None else bool(not _missing(measured_slo) and measured_slo <= slo_p99_ms
                                                 and not _missing(p99) and p99 <= slo_p99_ms)
    return float(qps), p99, meets


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)
