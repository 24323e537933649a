"""The console tables of the commands that read or plan (results, compare, cost, plan, info): each built from the
command's staged values, printed by the command with console.print or print_wide."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from corescale.machine.environment import HostEnvironment
from corescale.report.counts import count_text

RESULT_HEADERS = {"batch_size": "batch", "sequence_length": "seq", "instances": "inst",
                  "cpus_per_instance": "cpus/inst", "threads_per_instance": "threads/inst", "latency_p50_ms": "p50 ms",
                  "latency_p99_ms": "p99 ms", "throughput_samples_per_s": "samples/s", "contaminated": "contam.",
                  "precision": "prec.", "quality_task": "task", "quality_metric": "quality",
                  "quality_value": "value", "quality_verdict": "verdict", "server_max_valid_qps": "max QPS",
                  "server_p50_ms": "p50 ms at it", "server_p99_ms": "p99 ms at it"}
VERDICT_COLOURS = {"slower": "red", "faster": "green"}


def results_table(frame, columns: list[str], title: str) -> Table:
    """`corescale results`: the chosen columns of the store's frame, one row per result."""
    from corescale.analysis.store import describe_value

    table = Table(title=escape(title), header_style="bold")
    for column in columns:
        table.add_column(RESULT_HEADERS.get(column, column), overflow="fold",
                         justify="left" if column == "run" else "right")
    for _, row in frame[columns].iterrows():
        table.add_row(*(escape(_cell(c, row[c], describe_value)) for c in columns))
    return table


def _cell(column: str, value, describe) -> str:
    """Counts as whole numbers; quality figures to 4 decimals (0.99996 is not 1: the gate's bounds sit in the last
    digits)."""
    counted = count_text(column, value)
    if counted is not None:
        return counted
    if column.startswith("quality_") and isinstance(value, float) and value == value:
        return f"{value:.4f}"
    return describe(value)


def comparison_table(rows, title: str) -> Table:
    """`corescale compare`: matched trials' figure (p50, or a QPS search's max QPS) before and after, the change,
    its interval and verdict."""
    table = Table(title=escape(title), header_style="bold")
    for column in ("trial", "figure", "before", "after", "change", "95 % CI", "p", "verdict", "throughput", "sentinel",
                   "interleaved"):
        table.add_column(column, justify="left" if column in ("trial", "verdict") else "right")
    for _, row in rows.iterrows():
        colour = VERDICT_COLOURS.get(row["verdict"], "dim")
        mark = "*" if row.get("sentinel_moved") else ""
        low, high = row.get("sentinel_low"), row.get("sentinel_high")
        sentinel = "-" if low is None or low != low else f"{low:.2f}–{high:.2f}×{mark}"
        digits = 1 if row["figure"] == "max QPS" else 3
        table.add_row(escape(row["trial"]), row["figure"], f"{row['before']:.{digits}f}", f"{row['after']:.{digits}f}",
                      row["change"] + mark, f"{row['ci_low']:.3f}–{row['ci_high']:.3f}", f"{row['p_value']:.2g}",
                      f"[{colour}]{row['verdict']}[/{colour}]", f"{row['throughput_ratio']:.2f}x", sentinel,
                      "yes" if row.get("interleaved") else "no")
    return table


def catalog_table(machines) -> Table:
    """`corescale cost --list-machines`: the machine catalog, a row per kind with its price's date, age and page."""
    from corescale.analysis.catalog import price_age

    table = Table(title="machine catalog (on-demand list prices: re-check before buying)", header_style="bold")
    for column in ("machine", "where", "US$/h", "vCPUs", "cores", "SMT", "US$/core-h", "CPU", "ISA", "GB/s",
                   "date (age)", "source"):
        table.add_column(column, overflow="fold")
    for m in machines:
        table.add_row(escape(m.name), escape(" ".join(p for p in (m.cloud, m.region) if p)), f"{m.price_per_hour:g}",
                      str(m.vcpus), str(m.physical_cores), str(m.smt), f"{m.core_hour:.4f}", escape(m.cpu_text),
                      escape(" ".join(sorted(m.isa)) or "-"), f"{m.bandwidth_gbps:.0f}" if m.bandwidth_gbps else "-",
                      escape(f"{m.date} ({price_age(m.date)}{', history' if m.history else ''})"),
                      escape(m.source.split(" (")[0]))
    return table


def _money(row, slow: str, fast: str | None = None) -> str:
    """A cost cell: one figure, a range (cheap end first), or '-'."""
    from corescale.analysis.cost import money_range

    value = row.get(slow)
    if value is None or value != value:
        return "-"
    return money_range(value, row.get(fast) if fast else None, _projected(row)).lstrip("$")


def _projected(row) -> bool:
    from corescale.analysis.cost import MEASURED

    return row.get("basis") != MEASURED


def _rate(row) -> str:
    from corescale.analysis.cost import rate_range

    value = row.get("machine_samples_per_s")
    return "-" if value is None or value != value else rate_range(row, _projected(row))


def _p99(row, digits: int) -> str:
    from corescale.analysis.cost import two_digits

    value = row.get("latency_p99_ms")
    if value is None or value != value:
        return "-"
    return two_digits(value) if _projected(row) else f"{value:.{digits}f}"


def _notes(row) -> str:
    """A row's caution (a contaminated, stolen or moved input) first, then its reason or flags."""
    return " · ".join(str(part) for part in (row.get("caution"), row.get("reason") or row.get("flags")) if part)


def costs_table(costs, machine) -> Table:
    """`corescale cost --machine`: per layout, the machine's throughput and US$ per 1M inferences and tokens
    (analysis/cost.py's cost_table); ranges where the ISA differs, the reason where there is no figure."""
    from corescale.analysis.cost import price_dated

    table = Table(title=escape(f"cost per 1M on {machine.name} at ${machine.price_per_hour:g}/h "
                               f"({price_dated(machine)})"), header_style="bold")
    for column in ("layout", "basis", "copies", "samples/s", "p99 ms", "US$/1M inf.", "US$/1M tok.", "meets SLO",
                   "flags"):
        table.add_column(column, justify="left" if column in ("layout", "flags") else "right", overflow="fold")
    for _, row in costs.iterrows():
        slo = "-" if row["meets_slo"] is None else ("yes" if row["meets_slo"] else "[red]no[/red]")
        fits = row["copies"] > 0
        table.add_row(escape(row["layout"]), row["basis"], str(row["copies"]), _rate(row) if fits else "none",
                      _p99(row, 1), _money(row, "cost_per_1m_usd", "cost_per_1m_low_usd"),
                      _money(row, "cost_per_1m_tokens_usd"), slo, escape(_notes(row)))
    return table


def cost_ranking_table(ranked, slo_p99_ms: float | None, cpu_model: str, workload: str) -> Table:
    """`corescale cost ROOT`: catalog kinds by US$ per 1M inferences (analysis/ranking.py's rank)."""
    condition = f" under p99 <= {slo_p99_ms:g} ms" if slo_p99_ms is not None else ""
    table = Table(title=escape(f"which machine for {workload}: catalog kinds by US$ per 1M inferences{condition}"),
                  caption=escape(f"measured on {cpu_model}; projected = copies of a measured layout on the kind's "
                                 "physical cores, capped by its memory; a range where the ISA, vendor, "
                                 "microarchitecture or architecture differs (two significant digits); history = a "
                                 "past quote, not ranked"),
                  header_style="bold")
    for column in ("#", "machine", "CPU", "cores", "US$/h", "price of", "US$/core-h", "layout", "copies", "basis",
                   "samples/s", "p99 ms", "US$/1M inf.", "US$/1M tok.", "caution · flags / reason"):
        table.add_column(column, justify="left" if column in ("machine", "CPU", "layout", "basis",
                                                                   "flags / reason") else "right", overflow="fold")
    for _, row in ranked.iterrows():
        rank = "-" if row["rank"] != row["rank"] or row["rank"] is None else str(int(row["rank"]))
        table.add_row(rank, escape(row["machine"]), escape(row["cpu"]), f"{row['physical_cores']} (SMT {row['smt']})",
                      f"{row['price_per_hour']:g}", escape(f"{row['price_date']} ({row['price_age']})"),
                      f"{row['core_hour']:.4f}", escape(str(row["layout"] or "-")),
                      str(row["copies"]), row["basis"], _rate(row), _p99(row, 0),
                      _money(row, "cost_per_1m_usd", "cost_per_1m_low_usd"), _money(row, "cost_per_1m_tokens_usd"),
                      escape(_notes(row)))
    return table


def fleet_table(planned, target_qps: float, slo_p99_ms: float, cpu_model: str, workload: str) -> Table:
    """`corescale cost ROOT --target-qps N`: per catalog kind, the machines that carry N under the SLO and their
    cost per hour and month (analysis/fleet.py's fleet_plan)."""
    import pandas as pd

    from corescale.analysis.fleet import money

    table = Table(title=escape(f"fleet for {target_qps:g} inferences/s of {workload} under p99 <= {slo_p99_ms:g} ms"),
                  caption=escape(f"measured on {cpu_model}; a projected kind's figures are ranges (two significant "
                                 "digits): its count at the slow end is what it can promise"), header_style="bold")
    for column in ("machine", "CPU", "cores", "US$/h each", "price of", "layout", "basis", "samples/s each",
                   "p99 ms", "machines", "US$/h", "US$/month", "caution · flags / reason"):
        table.add_column(column, justify="left" if column in ("machine", "CPU", "layout", "basis") else "right",
                         overflow="fold")
    for _, row in planned.iterrows():
        count, fewest = row.get("machines"), row.get("machines_low")
        if count is None or pd.isna(count):
            machines = hourly = monthly = "-"
        else:
            machines = str(int(count)) if pd.isna(fewest) or fewest == count else f"{int(fewest)}–{int(count)}"
            hourly = money(row["cost_per_hour_usd"], row.get("cost_per_hour_low_usd"), 2)
            monthly = money(row["cost_per_month_usd"], row.get("cost_per_month_low_usd"), 0)
        table.add_row(escape(row["machine"]), escape(str(row["cpu"])), str(row["physical_cores"]),
                      f"{row['price_per_hour']:g}", escape(f"{row['price_date']} ({row['price_age']})"),
                      escape(str(row["layout"] or "-")), str(row["basis"]), _rate(row), _p99(row, 0), machines,
                      hourly, monthly, escape(_notes(row)))
    return table


def placement_table(document: dict) -> Table:
    """`corescale plan`: each instance's CPUs, NUMA nodes and threads (commands/plan.py's plan document)."""
    table = Table(title="placement", caption=document["topology"], header_style="bold")
    for column in ("instance", "CPUs", "NUMA nodes", "threads"):
        table.add_column(column, justify="right")
    for inst in document["instances"]:
        table.add_row(str(inst["id"]), inst["cpulist"], ",".join(map(str, inst["numa_nodes"])), str(inst["threads"]))
    return table


def host_table(host: HostEnvironment, analytic: dict | None) -> Table:
    """`corescale info`: the machine as environment.capture() sees it, with its analytic fp32 peak."""
    table = Table(title="corescale info", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    cpu = host.cpu
    rows = [
        ("CPU", f"{cpu.model} ({cpu.vendor})"),
        ("ISA", " ".join(flag for flag, present in cpu.isa.items() if present) or "-"),
        ("topology", str(host.topology.summary)),
        ("allowed CPUs", str(host.topology.allowed_cpus)),
        ("cgroup CPU quota", str(host.cgroup_cpu_quota or "none")),
        ("memory", f"{(host.memory_bytes or 0) / 2**30:.1f} GiB"),
        ("kernel", str(host.kernel)),
        ("governor / THP", f"{host.governor or 'unreadable'} / {host.transparent_hugepages or 'unreadable'}"),
        ("load average", " ".join(f"{x:.2f}" for x in host.load_average)),
        ("python", str(host.python)),
        ("libraries", ", ".join(f"{k} {v}" for k, v in host.libraries.items())),
        ("env", " ".join(f"{k}={v}" for k, v in host.env.items()) or "-"),
        ("corescale", f"{host.corescale.get('version')} ({host.corescale.get('commit') or 'no git'})"),
        ("analytic fp32 peak", f"{analytic['gflops']:.0f} GFLOP/s ({analytic['lanes']} lanes at {analytic['mhz']:.0f} "
                               f"MHz; assumes {analytic['assumes']})" if analytic else "clock unreadable"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def peak_table(rows: list[dict]) -> Table:
    """`corescale info --peak`: per (precision, threads), every library's GFLOP/s, the winner and the triad."""
    names = list(dict.fromkeys(name for row in rows for name in [*row.get("libraries", {}), *row.get("errors", {})]))
    table = Table(title="GEMM peak (GFLOP/s, best of several calls at the size shown)", header_style="bold")
    for column in ("precision", "threads", "size", *names, "peak", "triad GB/s"):
        table.add_column(column, justify="right")
    for row in rows:
        cells = [f"{row['libraries'][n]:.1f}" if n in row.get("libraries", {}) else "n/a" for n in names]
        best = f"{row['gflops']:.1f} ({row['library']})" if row.get("gflops") else "none measured"
        triad = (row.get("bandwidth") or {}).get("gbps")  # the roofline's memory roof (machine/bandwidth.py)
        table.add_row(row["precision"], str(row["threads"]), str(row.get("size", "")), *cells, best,
                      f"{triad:.1f}" if triad else "n/a")
    return table
