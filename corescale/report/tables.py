"""The console tables of the commands that read or plan (results, compare, cost, plan, info): each built from the
command's staged values, printed by the command with console.print or print_wide."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

RESULT_HEADERS = {"batch_size": "batch", "sequence_length": "seq", "instances": "inst",
                  "cpus_per_instance": "cpus/inst", "threads_per_instance": "threads/inst", "latency_p50_ms": "p50 ms",
                  "latency_p99_ms": "p99 ms", "throughput_samples_per_s": "samples/s", "contaminated": "contam.",
                  "precision": "prec.", "quality_task": "task", "quality_metric": "quality",
                  "quality_value": "value", "quality_verdict": "verdict"}
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
    """Quality figures to 4 decimals (0.99996 is not 1: the gate's bounds sit in the last digits)."""
    if column.startswith("quality_") and isinstance(value, float) and value == value:
        return f"{value:.4f}"
    return describe(value)


def comparison_table(rows, title: str) -> Table:
    """`corescale compare`: matched trials' p50 before and after, the change, its interval and verdict."""
    table = Table(title=escape(title), header_style="bold")
    for column in ("trial", "before ms", "after ms", "change", "95 % CI", "p", "verdict", "throughput"):
        table.add_column(column, justify="left" if column in ("trial", "verdict") else "right")
    for _, row in rows.iterrows():
        colour = VERDICT_COLOURS.get(row["verdict"], "dim")
        table.add_row(escape(row["trial"]), f"{row['p50_before_ms']:.3f}", f"{row['p50_after_ms']:.3f}",
                      row["change"], f"{row['ci_low']:.3f}–{row['ci_high']:.3f}", f"{row['p_value']:.2g}",
                      f"[{colour}]{row['verdict']}[/{colour}]", f"{row['throughput_ratio']:.2f}x")
    return table


def catalog_table(machines) -> Table:
    """`corescale cost --list-machines`: the price catalog's machines."""
    table = Table(title="price catalog", header_style="bold")
    for column in ("machine", "$/h", "vCPUs", "cores", "CPU", "note"):
        table.add_column(column)
    for m in machines:
        table.add_row(m.name, f"{m.price_per_hour:g}", str(m.vcpus), str(m.physical_cores), m.cpu_model, m.note)
    return table


def costs_table(costs, machine) -> Table:
    """`corescale cost`: per layout, the machine's throughput and dollars per 1M inferences (analysis/cost.py's
    cost_table)."""
    table = Table(title=f"cost per 1M inferences on {machine.name} at ${machine.price_per_hour:g}/h",
                  header_style="bold")
    for column in ("layout", "basis", "copies", "samples/s", "p99 ms", "$ / 1M", "meets SLO"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for _, row in costs.iterrows():
        slo = "-" if row["meets_slo"] is None else ("yes" if row["meets_slo"] else "[red]no[/red]")
        fits = row["copies"] > 0
        table.add_row(escape(row["layout"]), row["basis"], str(row["copies"]),
                      f"{row['machine_samples_per_s']:.1f}" if fits else "does not fit",
                      f"{row['latency_p99_ms']:.1f}", f"{row['cost_per_1m_usd']:.4g}" if fits else "-", slo)
    return table


def placement_table(document: dict) -> Table:
    """`corescale plan`: each instance's CPUs, NUMA nodes and threads (commands/plan.py's plan document)."""
    table = Table(title="placement", caption=document["topology"], header_style="bold")
    for column in ("instance", "CPUs", "NUMA nodes", "threads"):
        table.add_column(column, justify="right")
    for inst in document["instances"]:
        table.add_row(str(inst["id"]), inst["cpulist"], ",".join(map(str, inst["numa_nodes"])), str(inst["threads"]))
    return table


def host_table(host: dict) -> Table:
    """`corescale info`: the machine as environment.capture() sees it, with its analytic fp32 peak."""
    table = Table(title="corescale info", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    cpu = host["cpu"]
    analytic = host["analytic_peak"]
    rows = [
        ("CPU", f"{cpu['model']} ({cpu['vendor']})"),
        ("ISA", " ".join(flag for flag, present in cpu["isa"].items() if present) or "-"),
        ("topology", host["topology"]["summary"]),
        ("allowed CPUs", host["topology"]["allowed_cpus"]),
        ("cgroup CPU quota", str(host["cgroup_cpu_quota"] or "none")),
        ("memory", f"{(host['memory_bytes'] or 0) / 2**30:.1f} GiB"),
        ("kernel", host["kernel"]),
        ("governor / THP", f"{host['governor'] or 'unreadable'} / {host['transparent_hugepages'] or 'unreadable'}"),
        ("load average", " ".join(f"{x:.2f}" for x in host["load_average"])),
        ("python", host["python"]),
        ("libraries", ", ".join(f"{k} {v}" for k, v in host["libraries"].items())),
        ("env", " ".join(f"{k}={v}" for k, v in host["env"].items()) or "-"),
        ("corescale", f"{host['corescale']['version']} ({host['corescale']['commit'] or 'no git'})"),
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
