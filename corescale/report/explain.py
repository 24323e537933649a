"""`corescale explain` drawn: time by op class per configuration (console tables, one stacked bar per backend) and
the report's section over every saved explanation."""

from __future__ import annotations

import html

import numpy as np
from rich.markup import escape
from rich.table import Table

from corescale.explain.opclasses import ALL_CLASSES, LABELS
from corescale.report.charts import new_figure, png_bytes

OPS_SHOWN = 12


def classes_table(results: list[dict]) -> Table:
    """Op classes side by side: ms and share of each configuration's profiled call."""
    table = Table(title="time per call by op class (ms, share of the profiled call)", header_style="bold")
    table.add_column("op class")
    for r in results:
        table.add_column(escape(r["label"]), justify="right")
    for c in ALL_CLASSES:
        table.add_row(LABELS[c], *(f"{r['classes_ms'][c]:.2f} ({r['shares'][c]:.0%})" for r in results))
    table.add_row("[bold]sum = profiled call[/bold]", *(f"{sum(r['classes_ms'].values()):.2f}" for r in results))
    table.add_row("measured latency (p50, unprofiled)", *(f"{r['latency_ms']:.2f}" for r in results))
    table.add_row("sum ÷ measured", *(f"{r['closure']:.3f} {'ok' if r['within_tolerance'] else '[red]over 5 %[/red]'}"
                                      for r in results))
    table.add_row("GEMM GFLOP/s (analytic FLOPs ÷ GEMM time)", *(_gemm(r) for r in results))
    return table


def _gemm(r: dict) -> str:
    g = r["gemm"]
    if g["gflops"] is None:
        return "-"
    if g["efficiency"] is None:
        return f"{g['gflops']:.1f} (peak not measured)"
    return f"{g['gflops']:.1f} = {g['efficiency']:.0%} of {g['peak_gflops']:.0f} ({g['peak_library']})"


def ops_table(result: dict, classes: tuple[str, ...] = ()) -> Table:
    """The profiled call's ops, longest first: the top ones, or every op of the classes asked for."""
    ops = [op for op in result["ops"] if not classes or op["class"] in classes]
    shown = ops if classes else ops[:OPS_SHOWN]
    title = f"{result['label']}: ops" + (f" of class {', '.join(classes)}" if classes else f" (top {len(shown)})")
    table = Table(title=escape(title), header_style="bold")
    for column in ("op", "layer or input shapes", "class"):
        table.add_column(column, justify="left")
    for column in ("ms", "share"):
        table.add_column(column, justify="right")
    wall = result["profiled_wall_ms"]
    for op in shown:
        where = op.get("name") if op.get("name") not in (None, "", op["op"]) else _shapes(op.get("shapes"))
        table.add_row(escape(op["op"]), escape(str(where)[:60]), op["class"], f"{op['us'] / 1e3:.3f}",
                      f"{op['us'] / 1e3 / wall:.1%}")
    return table


def _shapes(shapes) -> str:
    return " ".join("x".join(map(str, s)) for s in shapes if s) if shapes else ""


def findings_lines(result: dict) -> list[str]:
    lines = []
    for finding in result["findings"]:
        evidence = ", ".join(f"{k}={_fmt(v)}" for k, v in finding["evidence"].items())
        lines.append(f"- {finding['text']}  [{evidence}]")
    return lines or ["- no rule applies: nothing stands out in this profile"]


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def stacked_figure(results: list[dict]):
    """One stacked bar per configuration: ms per call by op class, the measured latency marked."""
    fig = new_figure(max(5.5, 1.6 * len(results) + 3.5), 4.8)
    ax = fig.subplots()
    x = np.arange(len(results))
    bottom = np.zeros(len(results))
    for c in ALL_CLASSES:
        values = np.array([r["classes_ms"][c] for r in results])
        ax.bar(x, values, 0.6, bottom=bottom, label=LABELS[c], hatch="//" if c == "overhead" else None)
        bottom += values
    ax.scatter(x, [r["latency_ms"] for r in results], marker="_", s=900, color="black", zorder=3,
               label="measured latency (unprofiled p50)")
    ax.set_xticks(x, [f"{r['label']}\nbs{r['batch_size']} s{r['sequence_length']}" for r in results], fontsize=8)
    ax.set_ylabel("ms per call")
    ax.set_title(f"Where the time goes: {results[0]['model']}, {results[0]['threads']} thread(s)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return fig


def figure_png(results: list[dict]) -> bytes:
    return png_bytes(stacked_figure(results))


SECTION_NOTE = '<p class="note">Profiling runs (corescale explain): not timing results, never in the tables above.</p>'


def entry_html(entry: dict) -> str:
    """One saved explanation in the report: its stacked bar and its findings. A value of the wrong shape raises
    KeyError, TypeError, ValueError or AttributeError (the caller skips that file with a note)."""
    import base64

    results = entry["configurations"]
    png = base64.b64encode(figure_png(results)).decode()
    items = "".join(f"<li><b>{html.escape(str(r['label']))}</b>: {html.escape(str(f['text']))}</li>"
                    for r in results for f in r["findings"])
    return (f'<figure class="explain"><img alt="time by op class" src="data:image/png;base64,{png}">'
            f"<figcaption>{html.escape(entry['path'])}</figcaption></figure><ul>{items}</ul>")
