"""One self-contained HTML report over a results root (PNGs embedded as data URIs and written beside it).

Every figure section is built by a function that takes the results table (store.load) and returns a figure,
or None with a note saying which runs would produce it. No external URL appears anywhere in the page.
"""

from __future__ import annotations

import base64
import html
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from matplotlib.figure import Figure

from corescale.analysis import cost
from corescale.analysis.store import Table, describe_value, load, ok_rows
from corescale.errors import UserError
from corescale.record.files import read_result, write_atomic
from corescale.record.sections import HostEnvironment
from corescale.report import charts as report_plots
from corescale.report import plots

STUDY_MACHINES = ("study-48-cores", "study-8-cores")  # the original study's cost comparison


@dataclass
class Chart:
    id: str
    title: str
    caption: str
    build: Callable[[pd.DataFrame, dict], Figure | None]  # (table, context) -> the figure, None: no data
    missing: str  # what to run when the data is not there


@dataclass
class Built:
    path: Path
    charts: list[str] = field(default_factory=list)  # ids of the charts drawn
    missing: list[str] = field(default_factory=list)  # ids left out for lack of data
    skipped: list[str] = field(default_factory=list)  # why a tune or explain document was left out
    pngs: list[Path] = field(default_factory=list)


def _heatmap(frame, context):
    grids = report_plots.heatmap_series(frame)
    return report_plots.heatmap_figure(grids) if grids else None


def _series_chart(series, figure):
    """A chart drawn from one table of rows picked out of the results (None when there are none)."""
    def build(frame, context):
        rows = series(frame)
        return figure(rows) if not rows.empty else None

    return build


_cores = _series_chart(report_plots.cores_series, plots.cores_figure)
_instances = _series_chart(report_plots.instances_series, plots.instances_figure)
_batch = _series_chart(report_plots.batch_split_series, plots.batch_figure)
_backends = _series_chart(report_plots.backends_series, report_plots.backends_figure)


def _roofline(frame, context):
    from corescale.report import roofline

    rows = roofline.roofline_rows(frame)
    return roofline.roofline_figure(rows) if not rows.empty else None


def _machines(frame, context):
    ranked = context["ranking"]
    if not ranked["rank"].notna().any():
        return None
    return report_plots.machine_size_figure(ranked, context["cpu"], context["here"], context["workload"])


def _cost(frame, context):
    tables = {name: table for name, table in context["cost_tables"].items() if not table.empty}
    return report_plots.cost_figure(tables) if tables else None


CHARTS = [
    Chart("heatmap", "Latency by batch size × sequence length",
          "Median latency of one forward call (ms), one panel per backend: the original study's figures 1 and 2.",
          _heatmap, "corescale run -m batch_size=1,8,32 sequence_length=32,128"),
    Chart("cores", "Latency vs cores", "Median latency of one instance on 1..N cores; dashed: ideal 1/cores "
          "scaling; labels: scaling efficiency.", _cores, "corescale study cores"),
    Chart("instances", "Throughput vs instances", "Total throughput of N pinned instances of the same size; "
          "dashed: ideal linear scaling; labels: efficiency.", _instances,
          "corescale study instances cores_per_instance=1"),
    Chart("batch", "Batch split", "One total batch split over N instances sharing the machine: latency of the "
          "slowest instance and total throughput.", _batch, "corescale study batch total_batch_size=8"),
    Chart("backends", "Backends side by side", "The same configuration on each backend measured.", _backends,
          "corescale run -m backend=pytorch,torchscript"),
    Chart("roofline", "Roofline", "Achieved GFLOP/s against arithmetic intensity (log-log); the roofs are the best "
          "measured GEMM and the triad bandwidth on the run's cores; labels: achieved ÷ attainable and the roof that "
          "binds.", _roofline, "any run with calibrate=true (the default)"),
    Chart("cost", "Cost per 1M inferences", "US$ per one million inferences = $/h ÷ (samples/s × 3600) × 1e6; "
          "hatched bars are projections (assumptions below).", _cost, "any successful run"),
    Chart("machines", "Which machine: cost against machine size", "Every catalog kind at its cheapest measured "
          "layout (under the SLO when one is given), projected from the CPU named in the title: copies on its "
          "physical cores, capped by its memory bandwidth; a bar spans the range where its ISA differs; kinds of "
          "another architecture are refused (table below).", _machines, "any successful run"),
]


def cost_machines(machine: str | None, price: float | None, catalog=None) -> list[cost.Machine]:
    if machine or price is not None:
        return [cost.choose_machine(machine, price, catalog)]
    known = cost.load_catalog(catalog)
    return [known[name] for name in STUDY_MACHINES if name in known]


# --- HTML pieces ------------------------------------------------------------------------------------------------

e = html.escape

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d3557;color:#fff;padding:18px 32px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:2px 0;opacity:.85}nav{padding:8px 32px;background:#e9edf2;font-size:14px}
nav a{margin-right:14px;color:#1d3557}main{padding:8px 32px 40px;max-width:1400px}
section{background:#fff;border-radius:6px;padding:14px 20px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:18px;margin:4px 0 10px}figure{margin:0}figure img{max-width:min(100%,1100px);height:auto}
figcaption{color:#555;font-size:13px;margin-top:6px}.note{color:#7a5b00;background:#fff6d6;padding:8px 12px;
border-radius:4px;font-size:14px}table{border-collapse:collapse;font-size:13px;margin:6px 0}
tr.withheld td{background:#fde8e8}
th,td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#f0f2f5;cursor:pointer;position:sticky;top:0}th[data-order=asc]::after{content:" \\25B2"}
th[data-order=desc]::after{content:" \\25BC"}td.text,th.text{text-align:left}.scroll{overflow:auto;max-height:640px}
.bad{color:#b00020}.warn{color:#9a6700}code{background:#f0f2f5;padding:1px 4px;border-radius:3px}
"""

SORT_JS = """
(function () {
  function cellValue(row, index) {
    var cell = row.cells[index];
    return cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
  }
  document.querySelectorAll("table.sortable th").forEach(function (th) {
    th.addEventListener("click", function () {
      var table = th.closest("table");
      var body = table.tBodies[0];
      var index = Array.prototype.indexOf.call(th.parentNode.children, th);
      var ascending = th.getAttribute("data-order") !== "asc";
      th.parentNode.querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-order"); });
      th.setAttribute("data-order", ascending ? "asc" : "desc");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = cellValue(a, index), y = cellValue(b, index);
        var nx = parseFloat(x), ny = parseFloat(y);
        var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
})();
"""


def html_table(frame: pd.DataFrame, columns: list[tuple[str, str, str]], table_id: str) -> str:
    """A sortable table; columns: (column, header, format) with format '' for text."""
    head = "".join(f'<th class="{"text" if not fmt else ""}">{e(header)}</th>' for _, header, fmt in columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for column, _, fmt in columns:
            value = row.get(column)
            missing = value is None or (pd.api.types.is_scalar(value) and pd.isna(value))
            if fmt and not missing:
                try:
                    cells.append(f'<td data-value="{float(value)!r}">{e(fmt.format(value))}</td>')
                    continue
                except (TypeError, ValueError):
                    pass
            cells.append(f'<td class="text">{e(describe_value(value))}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table class="sortable" id="{e(table_id)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


RESULT_COLUMNS = [("status", "status", ""), ("model", "model", ""), ("backend", "backend", ""),
                  ("precision", "precision", ""), ("batch_size", "batch", "{:.0f}"),
                  ("sequence_length", "seq", "{:.0f}"), ("total_batch_size", "total batch", "{:.0f}"),
                  ("instances", "instances", "{:.0f}"), ("cpus_per_instance", "CPUs/instance", "{:.0f}"),
                  ("threads_per_instance", "threads/instance", "{:.0f}"), ("latency_p50_ms", "p50 ms", "{:.2f}"),
                  ("latency_p90_ms", "p90 ms", "{:.2f}"), ("latency_p99_ms", "p99 ms", "{:.2f}"),
                  ("max_instance_p50_ms", "max instance p50 ms", "{:.2f}"), ("latency_cv", "CV", "{:.1%}"),
                  ("throughput_samples_per_s", "samples/s", "{:.2f}"), ("throughput_tokens_per_s", "tokens/s",
                                                                       "{:.0f}"),
                  ("gflops_per_s", "GFLOP/s", "{:.1f}"), ("percent_of_peak", "% of SGEMM", "{:.0f}"),
                  ("peak_rss_mib", "peak RSS MiB", "{:.0f}"), ("contaminated", "contaminated", ""),
                  ("quality_verdict", "quality", ""),
                  ("reason", "reason", ""), ("run", "run", "")]
COST_COLUMNS = [("layout", "layout", ""), ("model", "model", ""), ("basis", "basis", ""),
                ("copies", "copies", "{:.0f}"), ("machine_samples_per_s", "samples/s on machine", "{:.1f}"),
                ("latency_p99_ms", "p99 ms", "{:.1f}"), ("cost_per_1m_usd", "US$ per 1M", "{:.4g}"),
                ("cost_per_1m_tokens_usd", "US$ per 1M tokens", "{:.4g}"), ("meets_slo", "meets SLO", ""),
                ("flags", "flags", ""), ("reason", "reason", "")]
RANKING_COLUMNS = [("rank", "#", "{:.0f}"), ("machine", "machine", ""), ("cloud", "where", ""), ("cpu", "CPU", ""),
                   ("physical_cores", "cores", "{:.0f}"), ("smt", "SMT", "{:.0f}"),
                   ("price_per_hour", "US$/h", "{:g}"), ("layout", "layout", ""), ("copies", "copies", "{:.0f}"),
                   ("basis", "basis", ""), ("cost_per_1m_usd", "US$ per 1M (slow end)", "{:.4g}"),
                   ("cost_per_1m_low_usd", "US$ per 1M (fast end)", "{:.4g}"),
                   ("cost_per_1m_tokens_usd", "US$ per 1M tokens", "{:.4g}"), ("flags", "flags", ""),
                   ("reason", "reason", "")]


def _figure_html(chart: Chart, png: bytes, file_name: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure class="chart" id="chart-{chart.id}"><img alt="{e(chart.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{e(chart.caption)} '
            f"(also saved as <code>{e(file_name)}</code>)</figcaption></figure>")


def environment_html(frame: pd.DataFrame) -> str:
    """The machine of the latest result, and a warning when results come from several machines."""
    latest = frame.sort_values("finished_at").iloc[-1]
    try:
        env = read_result(latest["path"]).environment
    except UserError:
        env = HostEnvironment()
    cpu, topo = env.cpu, env.topology
    memory = env.memory_bytes
    facts = [
        ("host", env.hostname), ("CPU", f"{cpu.model or '?'} ({cpu.vendor or '?'})"),
        ("ISA", " ".join(k for k, v in cpu.isa.items() if v) or "-"),
        ("topology", topo.summary), ("allowed CPUs", topo.allowed_cpus),
        ("cgroup CPU quota", env.cgroup_cpu_quota or "none"),
        ("memory", f"{memory / 2**30:.1f} GiB" if memory else "-"), ("kernel", env.kernel),
        ("governor / THP", f"{env.governor or 'unreadable'} / {env.transparent_hugepages or '?'}"),
        ("python", env.python),
        ("libraries", ", ".join(f"{k} {v}" for k, v in env.libraries.items())),
        ("environment variables", " ".join(f"{k}={v}" for k, v in env.env.items()) or "-"),
        ("corescale", f"{env.corescale.get('version')} ({env.corescale.get('commit') or 'no git'})"),
        ("captured", env.captured_at),
    ]
    rows = "".join(f'<tr><th class="text">{e(k)}</th><td class="text">{e(str(v))}</td></tr>' for k, v in facts)
    hosts = frame[["host", "cpu_model"]].drop_duplicates()
    warning = ""
    if len(hosts) > 1:
        listed = "; ".join(f"{h} ({c})" for h, c in hosts.itertuples(index=False))
        warning = f'<p class="note">These results come from {len(hosts)} machines: {e(listed)}.</p>'
    return f"{warning}<table>{rows}</table>"


def highlights_html(frame: pd.DataFrame) -> str:
    ok = ok_rows(frame)
    ok = ok[ok["latency_p50_ms"].notna() & ok["throughput_samples_per_s"].notna()]  # closed-loop figures only
    if ok.empty:
        return '<p class="note">No successful closed-loop result yet.</p>'
    items = []
    for model, rows in ok.groupby("model"):
        fast = rows.loc[rows["latency_p50_ms"].idxmin()]
        most = rows.loc[rows["throughput_samples_per_s"].idxmax()]
        items.append(f"<li><b>{e(str(model))}</b>: lowest latency {fast['latency_p50_ms']:.2f} ms p50 with "
                     f"{e(cost.layout_label(fast))}; highest throughput {most['throughput_samples_per_s']:.2f} "
                     f"samples/s with {e(cost.layout_label(most))}</li>")
    return f"<ul>{''.join(items)}</ul>"


def cost_html(context: dict) -> str:
    parts = []
    for machine in context["machines"]:
        table = context["cost_tables"][machine.name]
        price = f"${machine.price_per_hour:g}/h"
        if machine.physical_cores:  # under linear scaling the price per core decides the projected cost
            price += f", ${machine.price_per_hour / machine.physical_cores:.3f} per core-hour"
        parts.append(f"<h3>{e(machine.name)} ({e(price)})</h3>")
        if not table.empty and (table["basis"] != cost.MEASURED).any():
            parts.append(f'<p class="note">{e(cost.assumption(machine, table["cpu_model"].iloc[0]))}</p>')
        parts.append(f"<p>{e(cost.answer(table, machine, context['slo']))}</p>")
        if not table.empty:
            parts.append(html_table(table, COST_COLUMNS, f"cost-{machine.name}"))
    return "".join(parts)


def machine_context(frame, slo: float | None) -> dict:
    """The catalog ranked on these results (analysis/ranking.py) and this machine's own measured point."""
    from corescale.analysis import pricing, ranking

    catalog = cost.load_catalog()
    groups = ranking.workloads(frame)
    workload, ok = groups[0] if groups else ("no valid results", ok_rows(frame))
    here = ranking.this_machine(ok, lambda row: pricing.price_here(row, catalog), slo) if not ok.empty else None
    if here is not None:
        here["cores"] = int(ok["host_physical_cores"].iloc[0] or 1)
    cpus = sorted({str(c) for c in ok["cpu_model"].dropna()}) if not ok.empty else []
    return {"ranking": ranking.rank(ok, catalog, slo), "here": here, "cpu": " + ".join(cpus) or "CPU unnamed",
            "workload": workload, "workloads": [name for name, _ in groups]}


def ranking_html(context: dict) -> str:
    from corescale.analysis import ranking

    others = [name for name in context["workloads"] if name != context["workload"]]
    notes = [f"workload: {context['workload']}" + (f" (the one with the most results; also measured: "
                                                    f"{', '.join(others)}: corescale cost ROOT ranks each)"
                                                    if others else "")]
    lines = "".join(f"<li>{e(line)}</li>" for line in
                    [*notes, *ranking.summary(context["ranking"], context["here"], context["slo"])])
    return f"<ul>{lines}</ul>" + html_table(context["ranking"], RANKING_COLUMNS, "machines")


# --- building ---------------------------------------------------------------------------------------------------

def build(root, out: Path | None = None, machine: str | None = None, price: float | None = None,
          slo: float | None = None, where: list[str] | None = None, latest: bool = True,
          table: Table | None = None) -> Built:
    """Writes the report (and one PNG per chart beside it); returns what was drawn and what was missing."""
    table = table or load(root, latest=latest, where=where)
    frame = table.frame
    if frame.empty:
        raise UserError(f"no results under '{root}' match the filters")
    out = Path(out) if out else Path(root) / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    machines = cost_machines(machine, price)
    context = {"machines": machines, "slo": slo,
               "cost_tables": {m.name: cost.cost_table(frame, m, slo) for m in machines}, **machine_context(frame, slo)}
    built = Built(out)
    sections = []
    for chart in CHARTS:
        figure = chart.build(frame, context)
        if figure is None:
            built.missing.append(chart.id)
            body = (f'<p class="note">Not enough data for this chart. Runs that produce it: '
                    f"<code>{e(chart.missing)}</code></p>")
        else:
            png = report_plots.png_bytes(figure)
            png_path = out.with_name(f"{out.stem}-{chart.id}.png")
            write_atomic(png_path, png, "figure")
            built.charts.append(chart.id)
            built.pngs.append(png_path)
            body = _figure_html(chart, png, png_path.name)
        if chart.id == "cost":
            body += cost_html(context)
        if chart.id == "machines":
            body += ranking_html(context)
        sections.append((chart.id, chart.title, body))
    sections.extend(_explain_sections(root, built.skipped))
    from corescale.report import tune as tune_report

    try:
        sections[:0] = tune_report.sections(root, frame)  # a tune's directory: its section first
    except UserError as exc:  # a malformed tune.json: the rest of the report still stands
        built.skipped.append(str(exc))
    curves = report_plots.load_curves(frame)
    if curves:  # only where server searches were run (no "missing" note otherwise)
        chart = Chart("load_curve", "Load curve (server scenario)", "Latency from LoadGen's scheduled issue time "
                      "vs offered Poisson load; red x: the step missed the p99 SLO.",
                      lambda _frame, _context: report_plots.load_curve_figure(curves), "")
        png = report_plots.png_bytes(report_plots.load_curve_figure(curves))
        png_path = out.with_name(f"{out.stem}-load_curve.png")
        write_atomic(png_path, png, "figure")
        built.charts.append(chart.id)
        built.pngs.append(png_path)
        sections.append((chart.id, chart.title, _figure_html(chart, png, png_path.name)))
    from corescale.report import quality as quality_report

    judged = quality_report.section(frame)
    if judged is not None:  # only where some result checked its task's quality
        sections.append(judged)
    sections.append(("environment", "Environment", environment_html(frame)))
    sections.append(("results", f"All results ({len(frame)})", html_table(frame, RESULT_COLUMNS, "results-table")))
    if table.problems or built.skipped:
        items = "".join(f"<li>{e(reason)}</li>" for reason in [*(r for _, r in table.problems), *built.skipped])
        sections.append(("problems", "Skipped files", f"<ul>{items}</ul>"))
    write_atomic(out, _page(root, frame, sections), "report")
    return built


def _explain_sections(root, skipped: list[str]) -> list[tuple[str, str, str]]:
    """`corescale explain` runs saved under the root: a stacked bar per backend (profiling runs, apart); a file
    that cannot be drawn is added to `skipped` with why."""
    from corescale.explain.analysis import load_saved
    from corescale.report.explain import SECTION_NOTE, entry_html

    saved, unreadable = load_saved(root)
    skipped.extend(unreadable)
    parts = []
    for entry in saved:
        try:
            parts.append(entry_html(entry))
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:  # valid JSON, wrong shape
            skipped.append(f"malformed explain file '{entry['path']}': {type(exc).__name__}: {str(exc)[:160]}")
    return [("explain", "Where the time goes (corescale explain)", SECTION_NOTE + "".join(parts))] if parts else []


def _page(root, frame: pd.DataFrame, sections: list[tuple[str, str, str]]) -> str:
    ok = len(ok_rows(frame))
    nav = "".join(f'<a href="#{e(sid)}">{e(title)}</a>' for sid, title, _ in sections)
    body = "".join(f'<section id="{e(sid)}"><h2>{e(title)}</h2>{content}</section>' for sid, title, content in sections)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>corescale report: {e(str(root))}</title><style>{CSS}</style></head><body>"
            f"<header><h1>corescale report</h1><p>{e(str(root))} · {len(frame)} result(s), {ok} valid · "
            f"generated {e(stamp)}</p></header><nav>{nav}</nav><main>"
            f'<section id="highlights"><h2>Highlights</h2>{highlights_html(frame)}</section>{body}</main>'
            f"<script>{SORT_JS}</script></body></html>")


