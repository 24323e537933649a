"""Which machine to buy: every catalog kind at its cheapest measured layout under a p99 SLO, ranked by US$ per 1M.

Each kind's figure comes from cost.cost_table on that kind (measured where the kind is the machine measured,
else projected: a range where its ISA differs, refused on another architecture). A range is ranked by its
expensive end, the cost it can promise; kinds with no layout that fits or meets the SLO come last, saying why.
The measured machine itself heads the comparison at its own price (analysis/pricing.py says which).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd

from corescale.analysis import cost
from corescale.analysis.catalog import Machine
from corescale.analysis.pricing import Price
from corescale.analysis.projection import measured_of
from corescale.analysis.store import ok_rows

COLUMNS = ("machine", "cloud", "cpu", "arch", "physical_cores", "smt", "price_per_hour", "core_hour", "price_date",
           "price_age", "layout", "basis", "copies", "machine_samples_per_s", "machine_samples_per_s_high",
           "latency_p99_ms", "cost_per_1m_usd", "cost_per_1m_low_usd", "cost_per_1m_tokens_usd", "caution", "flags",
           "reason")
HISTORY = "history"  # the basis of a kind whose price is a past quote: shown, never ranked


def workloads(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The valid results split by what is asked of them (model, sequence length), most results first: a
    ranking compares layouts of one workload, never one model's cost with another's."""
    ok = ok_rows(frame)
    if ok.empty:
        return []
    groups = [(f"{model}, sequence {int(length)}", rows)
              for (model, length), rows in ok.groupby(["model", "sequence_length"], sort=True)]
    return sorted(groups, key=lambda group: -len(group[1]))


def rank(frame: pd.DataFrame, catalog: dict[str, Machine], slo_p99_ms: float | None) -> pd.DataFrame:
    """One row per kind (its cheapest layout meeting the SLO), cheapest first; then the kinds without one."""
    rows = [best_on(frame, kind, slo_p99_ms) for kind in catalog.values()]
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    text = ["layout", "basis", "caution", "flags", "reason"]
    table[text] = table[text].astype(object).fillna("")  # an all-empty column is float64 (NaN)
    history = table["basis"] == HISTORY
    priced = table["cost_per_1m_usd"].notna() & ~table["cost_per_1m_usd"].isin([math.inf]) & ~history
    table = pd.concat([table[priced].sort_values(["cost_per_1m_usd", "physical_cores"], kind="stable"),
                       table[~priced & ~history], table[history]], ignore_index=True)
    ranked = table["cost_per_1m_usd"].notna() & (table["basis"] != HISTORY)
    table.insert(0, "rank", [i + 1 if p else None for i, p in enumerate(ranked)])
    return table


def best_on(frame: pd.DataFrame, kind: Machine, slo_p99_ms: float | None) -> dict:
    """The kind's row: its cheapest layout that meets the SLO, or why there is none."""
    from corescale.analysis.catalog import price_age

    facts = {"machine": kind.name, "cloud": " ".join(p for p in (kind.cloud, kind.region) if p),
             "cpu": kind.cpu_text, "arch": kind.arch, "physical_cores": kind.physical_cores, "smt": kind.smt,
             "price_per_hour": kind.price_per_hour, "core_hour": kind.core_hour, "price_date": kind.date,
             "price_age": price_age(kind.date)}
    table = cost.cost_table(frame, kind, slo_p99_ms)
    best = cost.cheapest(table, slo_p99_ms) if not table.empty else None
    if best is None:
        return {**facts, "basis": why_none(table, slo_p99_ms)[0], "reason": why_none(table, slo_p99_ms)[1],
                "copies": 0}
    found = {**facts, **{k: best[k] for k in COLUMNS if k in best and k not in facts}}
    if kind.history:  # a past quote: its figure is shown for comparison, never offered
        found.update(basis=HISTORY, reason=f"a price quoted in {kind.date} ({kind.source}): history, not on sale")
    return found


def why_none(table: pd.DataFrame, slo_p99_ms: float | None) -> tuple[str, str]:
    """(basis, reason) of a kind with no priced layout: refused, nothing fits, or nothing meets the SLO."""
    if table.empty:
        return cost.REFUSED, "no valid results to price"
    refused = table[table["basis"] == cost.REFUSED]
    if len(refused) == len(table):
        return cost.REFUSED, str(refused["reason"].iloc[0])
    if not (table["copies"] > 0).any():
        return cost.PROJECTED, str(table["reason"].iloc[0])
    fastest = table[table["copies"] > 0]["latency_p99_ms"].min()
    return table["basis"].iloc[0], f"no layout meets p99 <= {slo_p99_ms:g} ms (best {fastest:.0f} ms there)"


def this_machine(frame: pd.DataFrame, price_of: Callable[[Any], Price], slo_p99_ms: float | None) -> dict | None:
    """The measured machine's own cheapest layout under the SLO at its price (price_of(row): pricing.price_here),
    or None."""
    rows: list[dict[str, Any]] = []
    for _, row in ok_rows(frame).iterrows():
        price = price_of(row)
        measured = measured_of(row)
        rate = measured.per_instance * int(row.get("instances") or 1)
        p99 = measured.p99_ms
        if not rate or (slo_p99_ms is not None and (p99 is None or p99 > slo_p99_ms)):
            continue
        inferences, tokens = price.per_million(rate, measured.tokens_per_sample)
        rows.append({"layout": cost.layout_label(row), "samples_per_s": rate, "latency_p99_ms": p99,
                     "cost_per_1m_usd": inferences, "cost_per_1m_tokens_usd": tokens, "price": price})
    return min(rows, key=lambda r: float(r["cost_per_1m_usd"])) if rows else None


SMALL, LARGE = 8, 48  # physical cores: the original study's two machines


def summary(table: pd.DataFrame, here: dict | None, slo_p99_ms: float | None) -> list[str]:
    """The answer in sentences: the cheapest kind, this machine measured, small against large kinds."""
    condition = f" under p99 <= {slo_p99_ms:g} ms" if slo_p99_ms is not None else ""
    priced = table[table["rank"].notna()]
    lines = []
    if priced.empty:
        lines.append(f"no catalog kind has a priced layout{condition}: see the reasons above")
    else:
        best = priced.iloc[0]
        projected = best["basis"] != cost.MEASURED
        doubt = f"; its input is {best['caution']}" if best.get("caution") else ""
        lines.append(f"cheapest{condition}: {best['machine']} ({best['cpu']}, {best['physical_cores']} core(s), "
                     f"{best['cloud']}, price of {best['price_date']}) at "
                     f"{cost.money_range(best['cost_per_1m_usd'], best['cost_per_1m_low_usd'], projected)}"
                     f" per 1M inferences{cost.tokens_text(best, projected)}, {best['basis']}, with {best['copies']} "
                     f"cop{'y' if best['copies'] == 1 else 'ies'} of {best['layout']}{doubt}")
        lines += size_lines(priced)
    if here is not None:  # this machine first: the one figure measured, not projected
        tokens = here["cost_per_1m_tokens_usd"]
        lines.insert(0, f"this machine, measured: US${here['cost_per_1m_usd']:.4g} per 1M inferences"
                     f"{f' (US${tokens:.4g} per 1M tokens)' if tokens else ''} at {here['samples_per_s']:.1f} "
                     f"samples/s with {here['layout']}; price: {here['price'].source}")
    from corescale.analysis.catalog import price_age

    offered = table[table["basis"] != HISTORY] if "price_date" in table else table.iloc[0:0]
    dates = sorted({str(d) for d in offered["price_date"].dropna() if str(d)}) if "price_date" in table else []
    ages = f" (from {dates[0]} to {dates[-1]}; {price_age(dates[0])} at most)" if dates else ""
    lines.append(f"prices are list prices with the date and page of each row{ages} (corescale cost "
                 "--list-machines): re-check them before buying; a projection is a range where the model cannot "
                 "know (another vendor, microarchitecture or architecture), rounded to two digits (docs/cost.md)")
    return lines


def size_lines(priced: pd.DataFrame) -> list[str]:
    """The seed's comparison: the cheapest small kind (<= 8 cores) against the cheapest large one (>= 48). When
    both are projections of one measured rate, their ratio is the two kinds' core-hour prices, said as that."""
    small = priced[priced["physical_cores"] <= SMALL]
    large = priced[priced["physical_cores"] >= LARGE]
    if small.empty or large.empty:
        return []
    a, b = small.iloc[0], large.iloc[0]
    ratio = b["cost_per_1m_usd"] / a["cost_per_1m_usd"]
    if a["basis"] != cost.MEASURED and b["basis"] != cost.MEASURED:
        return [f"small against large: both are projections of the same measured per-core rate, so their ratio "
                f"({ratio:.2g}x) is only that of their core-hour prices ({b['machine']} US${b['core_hour']:.2g}, "
                f"{a['machine']} US${a['core_hour']:.2g}); measure both to compare them (the original study "
                "measured 6x)"]
    return [f"small against large: {a['machine']} ({a['physical_cores']} core(s)) US${a['cost_per_1m_usd']:.4g} per "
            f"1M, {b['machine']} ({b['physical_cores']} cores) US${b['cost_per_1m_usd']:.4g}: large ÷ small = "
            f"{ratio:.2f}x per inference (the original study: 6x)"]
