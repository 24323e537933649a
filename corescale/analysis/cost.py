"""Cost per 1M inferences and per 1M tokens from measured throughput and an hourly price; cheapest layout under
a latency SLO.

cost per 1M = US$/h ÷ (samples/s × 3600) × 1e6 (per 1M tokens: ÷ the real tokens per sample). A price for the
machine that was measured gives a measured cost; a catalog kind of another size or CPU gives a projection
(analysis/projection.py: copies on its physical cores, capped by its memory bandwidth, a range where its ISA
differs, refused on another architecture).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from corescale.analysis.catalog import Machine, find_machine, load_catalog
from corescale.analysis.pricing import is_this, per_million
from corescale.analysis.projection import MEASURED, PROJECTED, REFUSED, Projection, measured_of, project
from corescale.analysis.store import ok_rows
from corescale.errors import UserError
from corescale.machine.precisions import REFERENCE

__all__ = ["MEASURED", "PROJECTED", "REFUSED", "Machine", "find_machine", "load_catalog"]


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
    return per_million(price_per_hour, samples_per_s or 0.0)


def on_machine(machine: Machine, row, measured) -> Projection:
    """The measured layout of `row` on `machine`: measured where it is the machine measured, else projected."""
    if is_this(machine, row.get("cpu_model"), row.get("host_physical_cores")):
        rate = measured.per_instance * int(row.get("instances") or 1)
        return Projection(MEASURED, 1, rate, rate, measured.p99_ms, measured.p99_ms)
    return project(measured, machine)


def assumption(machine: Machine, cpu_model: str | None) -> str:
    return (f"projection to {machine.name} ({machine.physical_cores} physical cores, {machine.cpu_text}): copies of "
            f"the measured layout on its physical cores, capped by its memory bandwidth; each as fast as on the "
            f"measured {cpu_model or 'CPU'} only where the vendor and microarchitecture are the same, else "
            "×0.5–×1 of it; a range where the ISA tier differs; figures to two significant digits")


def layout_label(row) -> str:
    """e.g. '2 × 1 cores · pytorch · batch 1 each · seq 128'."""
    each = " each" if row["instances"] > 1 else ""
    batch = row.get("instance_batch_size") if row.get("instance_batch_size") is not None else row["batch_size"]
    if row.get("scenario") == "server":
        batch, each = f"≤ {row.get('server.max_batch')} (dynamic)", " each"
    precision = f" {row.get('precision')}" if row.get("precision") not in (None, REFERENCE) else ""
    return (f"{row['instances']} × {row['cpus_per_instance']} cores · {row['backend']}{precision} · "
            f"batch {batch}{each} · seq {row['sequence_length']}")


def cost_table(frame: pd.DataFrame, machine: Machine, slo_p99_ms: float | None = None) -> pd.DataFrame:
    """One row per valid result on `machine`: basis (measured, projected, refused), copies, samples/s (a range's
    slow end, and its fast end), p99, US$ per 1M inferences and per 1M tokens (at the slow end: the cost a
    projection can promise, with the fast end beside it), the SLO verdict, the projection's flags."""
    rows = []
    ok = ok_rows(frame)
    efficiency = scaling_efficiency(ok)
    for _, row in ok.iterrows():
        served = server_figures(row, slo_p99_ms)
        if served is None and row.get("scenario") in ("server", "single_stream"):
            continue  # a LoadGen result with no sustained rate to price (single stream, or INVALID)
        measured = replace(measured_of(row), scaling_efficiency=efficiency.get(_scaling_key(row)))
        if served:
            measured = replace(measured, per_instance=served[0] / int(row.get("instances") or 1), p99_ms=served[1])
        found = on_machine(machine, row, measured)
        if served and found.copies > 1 and found.basis == PROJECTED:
            found.flags.append(f"the front is one process: one `corescale serve` front (one event loop) feeds all "
                               f"{found.copies} copies; past a few hundred requests/s it needs several fronts")
        rows.append(cost_row(row, machine, measured, found, served, slo_p99_ms))
    table = pd.DataFrame(rows)
    return table.sort_values("cost_per_1m_usd", kind="stable", ignore_index=True) if rows else table


def cost_row(row, machine: Machine, measured, found: Projection, served, slo_p99_ms: float | None) -> dict:
    fits = found.copies > 0
    tokens = measured.tokens_per_sample
    cost_slow = cost_per_million(machine.price_per_hour, found.low) if fits else math.nan
    cost_fast = cost_per_million(machine.price_per_hour, found.high) if fits else math.nan
    meets = served[2] if served else None
    if slo_p99_ms is not None and fits:
        within = found.p99_high_ms is not None and found.p99_high_ms <= slo_p99_ms
        meets = bool(within and (meets is None or meets))
    return {
        "layout": layout_label(row), "model": row["model"], "run": row["run"], "basis": found.basis,
        "copies": found.copies, "measured_samples_per_s": measured.per_instance * int(row.get("instances") or 1),
        "machine_samples_per_s": found.low if fits else math.nan,
        "machine_samples_per_s_high": found.high if fits else math.nan,
        "latency_p99_ms": found.p99_high_ms if fits else measured.p99_ms, "latency_p99_low_ms": found.p99_low_ms,
        "cost_per_1m_usd": cost_slow, "cost_per_1m_low_usd": cost_fast,
        "cost_per_1m_tokens_usd": cost_slow / tokens if tokens else math.nan, "tokens_per_sample": tokens,
        "meets_slo": meets, "flags": "; ".join(found.flags), "reason": found.reason,
        "contaminated": row.get("contaminated"), "caution": caution(row), "cpu_model": row.get("cpu_model"),
        "scenario": "server" if served else "offline",
    }


AGGREGATE_MEAN = ("throughput_samples_per_s", "throughput_tokens_per_s", "latency_p50_ms", "latency_p99_ms",
                  "roofline_bytes_per_call")


def aggregate_repeats(frame: pd.DataFrame) -> pd.DataFrame:
    """The valid results, one row per configuration (trial key): its repeats' mean rates and latencies, the worst
    foreign load and steal, the sentinel's whole range, `repeats` and every run's name (`runs`)."""
    ok = ok_rows(frame)
    if ok.empty or "key" not in ok.columns:
        return ok.assign(repeats=1, runs=ok["run"].map(lambda r: [r]) if "run" in ok else [])
    rows = []
    for _, group in ok.groupby("key", sort=False):
        row = group.iloc[0].to_dict()
        for column in AGGREGATE_MEAN:
            if column in group and group[column].notna().any():
                row[column] = float(group[column].astype(float).mean())
        for column, pick in (("foreign_load", max), ("steal_fraction", max), ("sentinel_high", max),
                             ("sentinel_low", min)):
            values = [float(v) for v in group.get(column, pd.Series(dtype=float)).dropna()]
            row[column] = pick(values) if values else row.get(column)
        for column in ("contaminated", "sentinel_moved"):
            if column in group:
                row[column] = bool(group[column].fillna(False).astype(bool).any())
        row["repeats"], row["runs"] = len(group), list(group["run"])
        rows.append(row)
    return pd.DataFrame(rows)


def _scaling_key(row) -> tuple:
    return tuple(str(row.get(k)) for k in ("model", "backend", "precision", "instance_batch_size", "sequence_length",
                                           "cpus_per_instance", "scenario"))


def scaling_efficiency(ok: pd.DataFrame) -> dict[tuple, float]:
    """Per layout (model, backend, precision, batch, length, cores per instance): the per-instance rate at the
    most instances measured ÷ at one instance (at most 1), where both were measured."""
    found: dict[tuple, float] = {}
    if ok.empty or "instances" not in ok.columns:
        return found
    keys = ok.apply(_scaling_key, axis=1)
    for key in dict.fromkeys(keys):
        rows = ok[keys == key]
        each = rows["throughput_samples_per_s"].astype(float) / rows["instances"].astype(float)
        one, most = each[rows["instances"] == 1], each[rows["instances"] == rows["instances"].max()]
        if rows["instances"].max() > 1 and len(one) and one.mean() > 0:
            found[key] = min(float(most.mean() / one.mean()), 1.0)
    return found


def caution(row) -> str:
    """What makes a measured input doubtful: foreign load, the hypervisor's steal, a sentinel that moved ('')."""
    from corescale.record.sections import STEAL_THRESHOLD

    found = []
    if row.get("contaminated") is True:
        found.append(f"contaminated ({float(row.get('foreign_load') or 0):.0%} foreign load)")
    steal = row.get("steal_fraction")
    if steal is not None and not _missing(steal) and float(steal) > STEAL_THRESHOLD:
        found.append(f"{float(steal):.0%} stolen")
    if row.get("sentinel_moved") is True:
        found.append(f"sentinel moved ({float(row.get('sentinel_low')):.2f}–{float(row.get('sentinel_high')):.2f}×)")
    return "; ".join(found)


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
    projected = best["basis"] != MEASURED
    where = f"{machine.name} (projected: {best['copies']} copies)" if projected else machine.name
    rate = "QPS (LoadGen server, p99 within its SLO)" if best.get("scenario") == "server" else "samples/s"
    doubt = f"; its input is {best['caution']}" if best.get("caution") else ""
    p99 = f"{best['latency_p99_ms']:.2g}" if projected else f"{best['latency_p99_ms']:.1f}"
    return (f"cheapest measured layout{condition}: {best['layout']} on {where}: "
            f"{money_range(best['cost_per_1m_usd'], best['cost_per_1m_low_usd'], projected)} per 1M inferences"
            f"{tokens_text(best, projected)} at {rate_range(best, projected)} {rate}, p99 {p99} ms "
            f"(${machine.price_per_hour:g}/h, {price_dated(machine)}){doubt}" + closed_loop_note(table, slo_p99_ms))


def price_dated(machine: Machine) -> str:
    """'list price of 2025-06, 18 months old' (or 'price given' for the machine measured)."""
    from corescale.analysis.catalog import price_age

    if not machine.date:
        return machine.source or "price given"
    return f"list price of {machine.date}, {price_age(machine.date)}"


def money_range(slow: float, fast: float | None = None, projected: bool = False) -> str:
    """'$0.123' or, for a range, '$0.0456–0.123' (cheapest first); a projection to two significant digits."""
    digits = 2 if projected else 4
    if fast is None or _missing(fast) or math.isclose(slow, fast, rel_tol=1e-9):
        return f"${slow:.{digits}g}"
    return f"${fast:.{min(digits, 3)}g}–{slow:.{min(digits, 3)}g}"


def two_digits(value: float) -> str:
    """A projected figure to two significant digits, without an exponent (1234.5 -> '1200')."""
    rounded = float(f"{value:.2g}")
    return f"{rounded:.0f}" if abs(rounded) >= 10 else f"{rounded:.2g}"


def rate_range(row, projected: bool = False) -> str:
    low, high = row["machine_samples_per_s"], row.get("machine_samples_per_s_high")
    one = two_digits if projected else (lambda v: f"{v:.1f}")
    if high is None or _missing(high) or math.isclose(low, high, rel_tol=1e-9):
        return one(low)
    return f"{one(low)}–{one(high)}"


def tokens_text(row, projected: bool = False) -> str:
    tokens = row.get("cost_per_1m_tokens_usd")
    return "" if tokens is None or _missing(tokens) else f" (${tokens:.{2 if projected else 4}g} per 1M tokens)"


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
