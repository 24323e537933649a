"""The tune's terminal output: its recommendation table and, for several node types, their ranking (the HTML
section is report/tune.py)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table


def _number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def recommendation_table(doc: dict) -> Table:
    """The finalists and the baseline of one tune (tune.json's), means over repeats with their intervals."""
    table = Table(title="tune: recommendation (means over repeats, 95 % CI)", header_style="bold")
    for column in ("", "configuration", "samples/s", "95 % CI", "p50 ms", "p99 ms", "US$/1M", "drift",
                   "memory GB", "meets"):
        table.add_column(column, justify="left" if column in ("", "configuration") else "right")

    def mean(block, digits=2):
        return _number(block.get("mean") if block else None, digits)

    def ci(block):
        return "-" if not block or block.get("low") is None else f"{block['low']:.2f} – {block['high']:.2f}"

    rows = [*doc["finalists"], *([doc["baseline"]] if doc["baseline"] else [])]
    for f in rows:
        table.add_row(f["role"], escape(f["label"]), mean(f["throughput"]), ci(f["throughput"]), mean(f["p50_ms"]),
                      mean(f["p99_ms"]), mean(f["cost_per_1m"], 4), mean(f["drift"], 3), mean(f["memory_gb"]),
                      "yes" if f["feasible"] else "no")
    return table


def ranking_table(ranking: dict) -> Table:
    """Node types by cost per 1M inferences, each at its recommended deployment (tune/fleet.py's ranking)."""
    table = Table(title="tune: node types by cost per 1M inferences (each at its recommended deployment)",
                  header_style="bold")
    for column in ("rank", "node type", "nodes", "cores", "US$/h", "recommended", "samples/s", "p99 ms",
                   "US$/1M", "× cheapest"):
        table.add_column(column, justify="left" if column in ("node type", "recommended") else "right")
    for e in ranking["node_types"]:
        table.add_row(str(e["rank"]), escape(str(e["node_type"])), str(e["nodes"]), str(e["physical_cores"]),
                      _number(e["price_per_hour"], 3), escape(e["winner"] or "none feasible"),
                      _number(e["throughput"]), _number(e["p99_ms"]), _number(e["cost_per_1m"], 4),
                      _number(e["vs_cheapest"]))
    return table
