"""The fleet plan: how many machines of each catalog kind carry a target load under the SLO, and what they cost
(`corescale cost ROOT --target-qps N --slo-p99-ms S`, docs/cost.md#the-fleet-plan).

Each kind's rate is analysis/ranking.py's: its cheapest measured layout that meets the SLO, measured where the kind
is the machine measured, else projected from the measured per-core capacity (copies of the layout on its physical
cores, capped by its memory bandwidth; a range where its ISA, vendor or microarchitecture differ). A machine is
planned at UTILISATION of that rate at most; the count is the target over that, rounded up, at both ends of a
range (the slow end's count is what the plan can promise). Cost per hour is the count times the kind's list price;
per month, times HOURS_PER_MONTH.

UTILISATION is the headroom every plan assumes, the fleet plan's and the Kubernetes autoscaler's alike
(deploy/kubernetes.py): each machine or pod is loaded to this share of its measured capacity at most, the rest
left for bursts, a lost machine's share until it is replaced, and the measurement's own spread.
"""

from __future__ import annotations

import math

import pandas as pd

from corescale.analysis.catalog import Machine
from corescale.analysis.ranking import HISTORY, rank
from corescale.errors import UserError

UTILISATION = 0.8  # the share of the measured capacity a machine or pod is planned to carry
HOURS_PER_MONTH = 730  # 365 x 24 / 12: the clouds' monthly figure
MAX_MACHINES = 10**6  # past this a plan is not a plan: one line
COLUMNS = ("machine", "cloud", "cpu", "physical_cores", "price_per_hour", "price_date", "price_age", "layout",
           "basis", "machine_samples_per_s", "machine_samples_per_s_high", "latency_p99_ms", "machines",
           "machines_low", "cost_per_hour_usd", "cost_per_hour_low_usd", "cost_per_month_usd",
           "cost_per_month_low_usd", "caution", "flags", "reason")


def check_load(target_qps: float, slo_p99_ms: float | None, utilisation: float) -> None:
    """The numbers a plan is made of, before any results are read: one line each."""
    for name, value in (("--target-qps", target_qps), ("--utilisation", utilisation)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise UserError(f"{name} must be a finite number > 0 (got {value})")
    if utilisation > 1:
        raise UserError(f"--utilisation is a share of each machine's measured capacity: at most 1 (got {utilisation})")
    if slo_p99_ms is None:
        raise UserError("--target-qps needs --slo-p99-ms: a fleet is sized at the rate each machine sustains "
                        "under the latency bound")


def fleet_plan(frame: pd.DataFrame, catalog: dict[str, Machine], target_qps: float, slo_p99_ms: float,
         utilisation: float = UTILISATION) -> pd.DataFrame:
    """One row per offered kind: machines and US$ per hour and month at `target_qps`, cheapest per hour first;
    then the kinds with no layout that meets the SLO (their reason). Past quotes (history) are left out."""
    if not any(not kind.history for kind in catalog.values()):
        raise UserError("the catalog offers no machine kind to plan a fleet of (only past quotes)")
    check_load(target_qps, slo_p99_ms, utilisation)
    offered = {name: kind for name, kind in catalog.items() if not kind.history}
    ranked = rank(frame, offered, slo_p99_ms)
    rows = []
    for _, row in ranked[ranked["basis"] != HISTORY].iterrows():
        found = {k: row.get(k) for k in COLUMNS if k in row}
        slow, fast = row.get("machine_samples_per_s"), row.get("machine_samples_per_s_high")
        if pd.isna(row.get("rank")) or _missing(slow) or not slow > 0:
            rows.append({**found, "machines": None})
            continue
        fast = slow if _missing(fast) else fast
        count, fewest = machines_for(target_qps, slow, utilisation), machines_for(target_qps, fast, utilisation)
        price = float(row["price_per_hour"])
        rows.append({**found, "machines": count, "machines_low": fewest, "cost_per_hour_usd": count * price,
                     "cost_per_hour_low_usd": fewest * price,
                     "cost_per_month_usd": count * price * HOURS_PER_MONTH,
                     "cost_per_month_low_usd": fewest * price * HOURS_PER_MONTH})
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table[["machines", "machines_low"]] = table[["machines", "machines_low"]].astype("Int64")
    planned = table["machines"].notna()
    return pd.concat([table[planned].sort_values(["cost_per_hour_usd", "machines"], kind="stable"),
                      table[~planned]], ignore_index=True)


def machines_for(target_qps: float, per_machine: float, utilisation: float) -> int:
    """Machines that carry `target_qps` with each at `utilisation` of its rate at most (at least one)."""
    count = math.ceil(target_qps / (per_machine * utilisation) - 1e-9)
    if count > MAX_MACHINES:
        raise UserError(f"--target-qps {target_qps:g} needs more than {MAX_MACHINES:,} machines at "
                        f"{per_machine:.3g} inferences/s each: check the number")
    return max(1, count)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fleet_summary(table: pd.DataFrame, target_qps: float, slo_p99_ms: float, utilisation: float) -> list[str]:
    """The answer in sentences: the cheapest fleet, and the headroom and hours assumed."""
    planned = table[table["machines"].notna()]
    lines = []
    if planned.empty:
        lines.append(f"no catalog kind has a layout that meets p99 <= {slo_p99_ms:g} ms: no fleet to plan (see the "
                     "reasons above)")
    else:
        best = planned.iloc[0]
        count = _count(best)
        hourly = money(best["cost_per_hour_usd"], best["cost_per_hour_low_usd"], 2)
        monthly = money(best["cost_per_month_usd"], best["cost_per_month_low_usd"], 0)
        lines.append(f"cheapest fleet for {target_qps:g} inferences/s under p99 <= {slo_p99_ms:g} ms: {count} x "
                     f"{best['machine']} ({best['basis']}, {best['layout']}) at US${hourly}/h, US${monthly}/month "
                     f"(list price of {best['price_date']}, {best['price_age']})")
    lines.append(f"assumed: each machine loaded to {utilisation:.0%} of the rate it sustains under the SLO "
                 f"({1 - utilisation:.0%} headroom for bursts and a lost machine), {HOURS_PER_MONTH} hours a month, "
                 "on-demand list prices; a projected kind's count and cost are ranges (fewest-most: the most is what "
                 "it can promise); no load balancer or other machines")
    return lines


def _count(row) -> str:
    fewest = row.get("machines_low")
    return str(int(row["machines"])) if fewest is None or pd.isna(fewest) or fewest == row["machines"] else \
        f"{int(fewest)}-{int(row['machines'])}"


def money(most: float, fewest: float | None, digits: int) -> str:
    """'1,234.50' or a range '600.00-1,234.50' (the fewest machines' cost first)."""
    if fewest is None or _missing(fewest) or math.isclose(most, fewest):
        return f"{most:,.{digits}f}"
    return f"{fewest:,.{digits}f}-{most:,.{digits}f}"
