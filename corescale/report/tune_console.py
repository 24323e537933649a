"""The tune's terminal output: its heading, a line per measurement with bars that carry the tune's stage, its
recommendation table and, for several node types, their ranking (the HTML section is report/tune.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from corescale.record.repeats import SPREAD
from corescale.report.console import ConsoleListener, SweepProgress, console, errors, print_path

if TYPE_CHECKING:
    from corescale.tune.document import TuneDocument


class TuneListener(ConsoleListener):
    """One line per measurement; the bars carry the tune's stage, best so far and ETA. The Tuner makes one per
    batch: TuneListener(progress, reserve) (functools.partial gives it bars and prefix)."""

    def __init__(self, progress, reserve: float, bars: bool = True, prefix: str = ""):
        super().__init__("trial", progress=bars, tables=False)
        self.tune_progress, self.reserve = progress, reserve
        self.prefix = prefix  # before every line (the node type, when several tune side by side)

    def _where(self, item, state) -> tuple[int, str]:
        number, label = super()._where(item, state)
        return number, self.prefix + label

    def starting(self, item, state) -> None:
        self._close()  # on Ray, trials start side by side: the bars follow the latest
        status = self.tune_progress.text(self.reserve) if self.tune_progress else ""
        console.print(f"[bold]{escape(self.prefix + item.label)}[/bold]", soft_wrap=True)
        total = self.tune_progress.trials or 0 if self.tune_progress else 0
        done = self.tune_progress.done if self.tune_progress else 0
        self.bars = SweepProgress(item.trial.cfg, self.progress, min(done, total or done), total or done + 1,
                                  status).__enter__()


def print_heading(tune, prefix: str = "") -> None:
    """What is tuned where, the tune's folder and the space's notes, before its first measurement."""
    settings = tune.settings
    where = f" on node type {tune.node_type} ({tune.nodes} node(s), {tune.physical_cores} cores each)" \
        if tune.on_ray else ""
    console.print(f"[bold]corescale tune[/bold]{escape(where)}: objective {settings.objective.name}, "
                  f"{tune.space.size()} configurations in the space, screening {tune.screen_s:g} s / full "
                  f"{tune.cfg.duration:g} s windows", soft_wrap=True)
    print_path("tune", tune.tune_dir)
    for note in tune.space.notes:
        errors.print(f"{escape(prefix)}note: {escape(note)}", soft_wrap=True)


def print_shared(pairs: list[tuple[str, str]]) -> None:
    """Node types that share a host's CPUs (fleet.sharing), tuned one after the other."""
    for a, b in pairs:
        errors.print(escape(f"note: node types {a} and {b} have nodes on the same CPUs of one host: tuned one "
                            "after the other"), soft_wrap=True)


def _number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def recommendation_table(doc: TuneDocument) -> Table:
    """The finalists and the baseline of one tune (tune.json's), means over repeats with their intervals."""
    source = doc.cost_source or ("no price: run again, or give price_per_hour=" if doc.rows else "")
    table = Table(title="tune: recommendation (means over repeats, 95 % CI where usable, else the repeats)",
                  header_style="bold",
                  caption=escape(f"US$ per 1M inferences / per 1M real tokens: {source}"))
    named = next((f.quality_metric for f in doc.rows if f.quality_metric), None)
    check = named or "drift"
    for column in ("", "configuration", "samples/s", SPREAD, "p50 ms", "p99 ms", "US$/1M", "US$/1M tok",
                   check, "memory GB", "meets"):
        table.add_column(column, justify="left" if column in ("", "configuration") else "right")
    for f in doc.rows:
        checked = f.quality.text(4) if named else f.drift.text(3)
        table.add_row(escape(f.role), escape(f.label), f.throughput.text(), f.throughput.interval_text(),
                      f.p50_ms.text(), f.p99_ms.text(), f.cost_per_1m.text(4), f.cost_per_1m_tokens.text(5), checked,
                      f.memory_gb.text(),
                      "yes" if f.feasible else "no")
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
