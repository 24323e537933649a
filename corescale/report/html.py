"""One self-contained HTML report over a results root (PNGs embedded as data URIs and written beside it).

Sections come in the order a reader asks (ORDER): the answer (a tune's recommendation, or the best configurations
measured), quality, cost, why (explain, roofline), then the rest (how the tuner searched, the recipe, scaling,
instances, batch split, backends side by side, load curves, the environment and the raw table). Only sections with
data are drawn: every figure section is built by a function that takes the results table (store.load) and returns
a figure, or None; the views that were not measured are one line at the end, each with the command that measures
it. No external URL appears anywhere in the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from matplotlib.figure import Figure

from corescale.analysis import cost
from corescale.analysis.store import Table, load, ok_rows
from corescale.errors import UserError
from corescale.record.files import write_atomic
from corescale.report import charts as report_plots
from corescale.report import plots
from corescale.report.page import e, environment_html, figure_html, html_table, render

VENDOR_GROUPS = {"intel": "Intel", "amd": "AMD", "graviton": "Arm", "axion": "Arm", "cobalt": "Arm"}
# Where each section goes (by id): answer, quality, cost, why, then the rest; an id not listed goes before
# "not-measured".
ORDER = ["answer", "quality", "cost", "machines", "shared_host", "explain", "roofline", "tuner", "recipe", "heatmap",
         "cores", "instances", "batch", "backends", "load_curve", "not-measured", "environment", "results", "problems"]


@dataclass
class Chart:
    id: str
    title: str
    caption: str
    build: Callable[[pd.DataFrame, dict], Figure | None]  # (table, context) -> the figure, None: no data
    missing: str  # the command that measures it when the data is not there ({model}: the results' model)
    view: str = ""  # how the not-measured line names it (default: the title)


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
    return roofline.roofline_figure(rows, context["recommended"]) if not rows.empty else None


def _cost(frame, context):
    tables = {name: table for name, table in context["cost_tables"].items() if not table.empty}
    return report_plots.cost_figure(tables) if tables else None


def _machines(frame, context):
    ranked = context["ranking"]
    if not ranked["rank"].notna().any():
        return None
    return report_plots.machine_size_figure(ranked, context["cpu_models"], context["here"], context["workload"])


CHARTS = [
    Chart("cost", "Cost per 1M inferences", "US$ per one million inferences = $/h ÷ (samples/s × 3600) × 1e6, one "
          "bar per configuration (its repeats averaged) on this machine first, then the cheapest current kind of "
          "each vendor. Bars differ for two reasons only: the configuration's measured samples/s (one layout "
          "against another), and the machine's price per core-hour and size (one machine against another); a "
          "projection's bar is its slow end (hatched; the range and why it is one are in the table below).",
          _cost, "corescale run model={model}"),
    Chart("machines", "Which machine: cost against machine size", "Every current catalog kind at its cheapest "
          "measured configuration (under the SLO when one is given), projected from the CPU named in the title: "
          "copies on its physical cores, capped by its memory bandwidth; a vertical bar spans the range the "
          "projection cannot narrow (another ISA tier, vendor, microarchitecture or architecture: ×0.5–×1); the "
          "2021 study's quotes are history, in the table only.", _machines, "corescale run model={model}",
          "machines by cost"),
    Chart("roofline", "Roofline", "Achieved GFLOP/s against arithmetic intensity (log-log); the roofs are the best "
          "measured GEMM and the triad bandwidth on the run's cores (named in the legend); colour: backend, "
          "marker: precision; labelled: the best run of each backend (and the recommended one) with achieved ÷ "
          "attainable and the roof that binds — every run is in the results table.", _roofline,
          "corescale run model={model} calibrate=true"),
    Chart("heatmap", "Latency by batch size × sequence length",
          "Median latency of one forward call (ms), one panel per backend: the original study's figures 1 and 2.",
          _heatmap, "corescale run -m model={model} batch_size=1,8,32 sequence_length=32,128", "batch × sequence"),
    Chart("cores", "Latency vs cores", "Median latency of one instance on 1..N cores; dashed: ideal 1/cores "
          "scaling; labels: scaling efficiency.", _cores, "corescale study cores model={model}", "cores scaling"),
    Chart("instances", "Throughput vs instances", "Total throughput of N pinned instances of the same size; "
          "dashed: ideal linear scaling; labels: efficiency.", _instances,
          "corescale study instances model={model} cores_per_instance=1", "instances"),
    Chart("batch", "Batch split", "One total batch split over N instances sharing the machine: latency of the "
          "slowest instance and total throughput.", _batch, "corescale study batch model={model} total_batch_size=8",
          "batch split"),
    Chart("backends", "Backends side by side", "The same configuration on each backend measured.", _backends,
          "corescale run -m model={model} backend=pytorch,onnxruntime,openvino", "backends side by side"),
]


# drawn where trials read the sentinel (never counted as missing)
SHARED_HOST = Chart(
    "shared_host", "Shared host: steal and the speed sentinel over time", "Per trial, in the order measured: the "
    "speed sentinel's readings before and after it (a fixed GEMM and triad on its CPUs) as a ratio to its "
    "reference (the run's first reading), the bands its tolerances (the GEMM 25 % slower, the triad twice as "
    "slow); a red x marks a trial whose sentinel moved; bars: the hypervisor's steal over the timed window (right "
    "axis). A figure measured while the CPU's speed moved is not "
    "comparable with one measured before.", lambda *_: None, "")


def cost_machines(machine: str | None, price: float | None, frame: pd.DataFrame | None = None,
                  ranked: pd.DataFrame | None = None, catalog=None) -> list[cost.Machine]:
    """The machines the cost section prices: the one asked for; else this machine (at its price: pricing.py) and
    the cheapest current kind of each vendor in the ranking (Intel, AMD, Arm)."""
    from corescale.analysis import pricing
    from corescale.analysis.catalog import vendor_of

    if machine or price is not None:
        return [cost.choose_machine(machine, price, catalog)]
    known = cost.load_catalog(catalog)
    ok = ok_rows(frame) if frame is not None else pd.DataFrame()
    machines = []
    if not ok.empty:
        row = ok.iloc[0]
        found = pricing.price_here(row, known)
        machines.append(cost.Machine(f"this machine ({row.get('cpu_model') or 'CPU unnamed'})", found.per_hour, 0, 0,
                                     measured_here=True, source=found.source))
    seen: set[str] = set()
    for name in [] if ranked is None else ranked[ranked["rank"].notna()]["machine"]:
        group = VENDOR_GROUPS.get(vendor_of(known[name].cpu_model), "")
        if group and group not in seen:
            seen.add(group)
            machines.append(known[name])
    return machines


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
                  ("steal_fraction", "steal", "{:.1%}"), ("sentinel_high", "sentinel (worst ÷ first)", "{:.2f}"),
                  ("quality_verdict", "quality", ""),
                  ("reason", "reason", ""), ("run", "run", "")]
COST_COLUMNS = [("mark", "", ""), ("layout", "configuration", ""), ("model", "model", ""),
                ("repeats", "repeats", "{:.0f}"), ("basis", "basis", ""), ("copies", "copies", "{:.0f}"),
                ("samples_text", "samples/s on machine", ""), ("p99_text", "p99 ms", ""),
                ("cost_text", "US$ per 1M", ""), ("cost_per_1m_tokens_usd", "US$ per 1M tokens", "{:.2g}"),
                ("meets_slo", "meets SLO", ""), ("caution", "caution", ""), ("flags", "flags", ""),
                ("reason", "reason", "")]
RANKING_COLUMNS = [("rank", "#", "{:.0f}"), ("machine", "machine", ""), ("cloud", "where", ""), ("cpu", "CPU", ""),
                   ("physical_cores", "cores", "{:.0f}"), ("smt", "SMT", "{:.0f}"),
                   ("price_per_hour", "US$/h", "{:g}"), ("price_date", "price of", ""), ("price_age", "age", ""),
                   ("layout", "layout", ""), ("copies", "copies", "{:.0f}"),
                   ("basis", "basis", ""), ("cost_per_1m_usd", "US$ per 1M (slow end)", "{:.2g}"),
                   ("cost_per_1m_low_usd", "US$ per 1M (fast end)", "{:.2g}"),
                   ("cost_per_1m_tokens_usd", "US$ per 1M tokens", "{:.2g}"), ("caution", "caution", ""),
                   ("flags", "flags", ""), ("reason", "reason", "")]


# --- sections ---------------------------------------------------------------------------------------------------

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
            parts.append(html_table(marked(table, context["recommended"], context["slo"]), COST_COLUMNS,
                                    f"cost-{machine.name}"))
    return "".join(parts)


def marked(table: pd.DataFrame, recommended: frozenset[str], slo: float | None) -> pd.DataFrame:
    """The cost table as shown: the recommended configuration (the tune's winner, else the cheapest here) marked,
    its figures as text (a projection's to two digits, a range cheap end first)."""
    best = cost.cheapest(table, slo)
    tuned = table["runs"].map(lambda runs: bool(set(runs) & recommended)) if "runs" in table and recommended \
        else pd.Series(False, index=table.index)
    marks = ["★ recommended" if tuned.iloc[i] else "" for i in range(len(table))]
    if not tuned.any() and best is not None:
        marks[int(table.index[table["layout"] == best["layout"]][0])] = "★ cheapest"
    projected = table["basis"] != cost.MEASURED
    return table.assign(
        mark=marks,
        cost_text=[cost.money_range(r["cost_per_1m_usd"], r["cost_per_1m_low_usd"], p) if r["copies"] > 0 else "-"
                   for (_, r), p in zip(table.iterrows(), projected)],
        samples_text=[cost.rate_range(r, p) if r["copies"] > 0 else "-"
                      for (_, r), p in zip(table.iterrows(), projected)],
        p99_text=["-" if r["latency_p99_ms"] != r["latency_p99_ms"] else cost.two_digits(r["latency_p99_ms"]) if p
                  else f"{r['latency_p99_ms']:.1f}" for (_, r), p in zip(table.iterrows(), projected)])


def cost_table_of(configurations: pd.DataFrame, machine: cost.Machine, slo: float | None) -> pd.DataFrame:
    """cost.cost_table over the aggregated configurations, each row with its repeats and run names."""
    table = cost.cost_table(configurations, machine, slo)
    if table.empty or "repeats" not in configurations:
        return table
    by_run = configurations.set_index("run")
    return table.assign(repeats=[int(by_run.loc[r, "repeats"]) for r in table["run"]],
                        runs=[list(by_run.loc[r, "runs"]) for r in table["run"]])


def not_measured_html(missing: list[tuple[str, str]]) -> str:
    """One line: each view these results cannot draw, with the command that measures it."""
    views = "; ".join(f"{e(view)}: <code>{e(command)}</code>" for view, command in missing)
    return f'<p class="note" id="not-measured-line">Not measured in these results — {views}.</p>'


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
    return {"ranking": ranking.rank(ok, catalog, slo), "here": here, "cpu_models": " + ".join(cpus) or "CPU unnamed",
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


EXTRA_HTML = {"cost": cost_html, "machines": ranking_html}  # the tables below a chart


def _ordered(sections: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    rest = ORDER.index("not-measured")
    return sorted(sections, key=lambda s: ORDER.index(s[0]) if s[0] in ORDER else rest - 0.5)  # stable


# --- building ---------------------------------------------------------------------------------------------------

def build(root, out: Path | None = None, machine: str | None = None, price: float | None = None,
          slo: float | None = None, where: list[str] | None = None, latest: bool = True,
          table: Table | None = None) -> Built:
    """Writes the report (and one PNG per chart beside it); returns what was drawn and what was missing."""
    from corescale.report import tune as tune_report
    from corescale.tune import document

    table = table or load(root, latest=latest, where=where)
    frame = table.frame
    if frame.empty:
        raise UserError(f"no results under '{root}' match the filters")
    out = Path(out) if out else Path(root) / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    configurations = cost.aggregate_repeats(frame)  # one row per configuration, its repeats averaged
    machine_facts = machine_context(configurations, slo)
    machines = cost_machines(machine, price, frame, machine_facts["ranking"])
    built = Built(out)
    try:
        doc = document.read(root)
    except UserError as exc:  # a malformed tune.json: the rest of the report still stands
        built.skipped.append(str(exc))
        doc = None
    winner = doc.winning if doc else None
    cpu = report_plots.cpu_caption(ok_rows(frame) if not ok_rows(frame).empty else frame)
    context = {"machines": machines, "slo": slo, "cpu": cpu,
               "cost_tables": {m.name: cost_table_of(configurations, m, slo) for m in machines},
               "recommended": frozenset(Path(p).name for p in winner.paths) if winner else frozenset(),
               **machine_facts}
    missing: list[tuple[str, str]] = []  # (view, the command that measures it)
    sections = tune_report.sections(doc, root, frame, cpu, missing) if doc else [
        ("answer", "The answer: the best configurations measured", highlights_html(frame))]
    model = tune_report.model_word(frame)
    for chart in CHARTS:
        figure = chart.build(frame, context)
        if figure is None:
            built.missing.append(chart.id)
            missing.append((chart.view or chart.title, chart.missing.format(model=model)))
            continue
        body = _drawn(chart, report_plots.sign(figure, cpu), out, built, cpu)
        extra = EXTRA_HTML.get(chart.id)
        sections.append((chart.id, chart.title, body + (extra(context) if extra else "")))
    sections.extend(_explain_sections(root, built.skipped, cpu))
    sentinel = report_plots.sentinel_figure(frame)
    if sentinel is not None:  # only where trials read the speed sentinel (never counted as missing)
        body = _drawn(SHARED_HOST, report_plots.sign(sentinel, cpu), out, built, cpu)
        sections.append((SHARED_HOST.id, SHARED_HOST.title, body))
    curves = report_plots.load_curves(frame)
    if curves:  # only where server searches were run (never counted as missing)
        chart = Chart("load_curve", "Load curve (server scenario)", "Latency from LoadGen's scheduled issue time "
                      "vs offered Poisson load; red x: the step missed the p99 SLO.", lambda *_: None, "")
        figure = report_plots.sign(report_plots.load_curve_figure(curves), cpu)
        sections.append((chart.id, chart.title, _drawn(chart, figure, out, built, cpu)))
    from corescale.report import quality as quality_report

    judged = quality_report.section(frame)
    if judged is not None:  # only where some result checked its task's quality
        sections.append(judged)
    if missing:
        sections.append(("not-measured", "Not measured", not_measured_html(missing)))
    sections.append(("environment", "Environment", environment_html(frame)))
    sections.append(("results", f"All results ({len(frame)})", html_table(frame, RESULT_COLUMNS, "results-table")))
    if table.problems or built.skipped:
        items = "".join(f"<li>{e(reason)}</li>" for reason in [*(r for _, r in table.problems), *built.skipped])
        sections.append(("problems", "Skipped files", f"<ul>{items}</ul>"))
    write_atomic(out, render(root, frame, _ordered(sections)), "report")
    return built


def _drawn(chart: Chart, figure: Figure, out: Path, built: Built, cpu: str) -> str:
    """The chart's PNG written beside the report and its figure element (the caption names the CPU)."""
    png = report_plots.png_bytes(figure)
    png_path = out.with_name(f"{out.stem}-{chart.id}.png")
    write_atomic(png_path, png, "figure")
    built.charts.append(chart.id)
    built.pngs.append(png_path)
    return figure_html(chart.id, chart.title, f"{chart.caption} Measured on {cpu}.", png, png_path.name)


def _explain_sections(root, skipped: list[str], cpu: str = "") -> list[tuple[str, str, str]]:
    """`corescale explain` runs saved under the root: a stacked bar per backend (profiling runs, apart); a file
    that cannot be drawn is added to `skipped` with why."""
    from corescale.explain.analysis import load_saved
    from corescale.report.explain import SECTION_NOTE, entry_html

    saved, unreadable = load_saved(root)
    skipped.extend(unreadable)
    parts = []
    for entry in saved:
        try:
            parts.append(entry_html(entry, cpu))
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:  # valid JSON, wrong shape
            skipped.append(f"malformed explain file '{entry['path']}': {type(exc).__name__}: {str(exc)[:160]}")
    return [("explain", "Where the time goes (corescale explain)", SECTION_NOTE + "".join(parts))] if parts else []
