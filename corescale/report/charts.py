"""Report figures not covered by corescale.report.plots, and the series extraction that feeds every report figure.

`series` finds, in a results table, groups of trials that differ only along the axes of one figure (e.g. the
cores of one instance), whatever sweeps produced them. Figures are built on the Agg canvas (no pyplot).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from corescale.analysis.store import config_columns, normalise_value, ok_rows
from corescale.record.sections import ServerSummary

# Text in corescale's figures is drawn as written: a `$` in a model name, a label or a price is not mathtext
matplotlib.rcParams["text.parse_math"] = False

# How a trial was measured, not what: never splits a series.
PROCEDURE = {"output_dir", "cache_dir", "compiled_cache", "duration", "min_iterations", "timeout", "calibrate", "seed",
             "warmup.min_iterations", "warmup.max_iterations", "warmup.window", "warmup.tolerance",
             "warmup.max_seconds", "executor.name", "executor.address", "executor.max_retries"}
PLACEMENT = ["instances", "cores_per_instance", "threads", "layout", "cpus_total", "cpus_per_instance",
             "threads_per_instance"]


def _norm(value) -> str:
    """A value as a legend shows it ('-' for none)."""
    text = normalise_value(value)
    return "-" if text == "None" else text


def series(frame: pd.DataFrame, axes: list[str], free: Sequence[str] = (), keys: Sequence[str] = (),
           min_points: int = 2) -> pd.DataFrame:
    """Valid rows grouped so that within a group only `axes` (and `free`) change; a `group` column labels each.

    keys: derived columns that must also be equal within a group (e.g. cpus_per_instance).
    Groups with fewer than `min_points` distinct axis points are dropped; repeated points keep the latest.
    """
    rows = ok_rows(frame)
    if rows.empty:
        return rows
    by = [c for c in config_columns(rows) if c not in PROCEDURE and c not in axes and c not in free]
    by += [k for k in keys if k in rows and k not in by]
    rows = rows.assign(_group=[" ".join(_norm(v) for v in t) for t in rows[by].itertuples(index=False)])
    rows = rows.drop_duplicates(["_group", *axes], keep="last")
    sizes = rows.groupby("_group")[axes[0]].transform("size")
    rows = rows[sizes >= min_points]
    if rows.empty:
        return rows.drop(columns="_group")
    varying = [c for c in by if rows[c].map(_norm).nunique() > 1]
    labels = {g: " ".join(f"{c}={_norm(r[c])}" for c in varying) for g, r in rows.groupby("_group").first().iterrows()}
    return rows.assign(group=rows["_group"].map(labels)).drop(columns="_group").reset_index(drop=True)


def cores_series(frame: pd.DataFrame) -> pd.DataFrame:
    """One instance on different core counts (latency vs cores)."""
    rows = frame[(frame["instances"] == 1) & frame["total_batch_size"].isna()] if not frame.empty else frame
    return series(rows, ["cpus_total"], PLACEMENT).assign(total_cores=lambda f: f.get("cpus_total"))


def instances_series(frame: pd.DataFrame) -> pd.DataFrame:
    """N instances of the same size, each with its own batch (throughput vs instances)."""
    rows = frame[frame["total_batch_size"].isna()] if not frame.empty else frame
    out = series(rows, ["instances"], PLACEMENT, keys=["cpus_per_instance", "threads_per_instance"])
    return out.assign(total_cores=out.get("cpus_total"), cores_per_instance=out.get("cpus_per_instance"))


def batch_split_series(frame: pd.DataFrame) -> pd.DataFrame:
    """The same samples per step on the same cores, split over N instances (total_batch_size, or equivalent
    runs: 2 instances of batch 1 on 1 core each split a batch of 2 on 2 cores)."""
    out = series(frame, ["instances"], [*PLACEMENT, "batch_size", "total_batch_size"], keys=["batch_total",
                                                                                              "cpus_total"])
    return out.assign(total_cores=out.get("cpus_total"), cores_per_instance=out.get("cpus_per_instance"),
                      batch_size=out.get("instance_batch_size"), total_batch_size=out.get("batch_total"))


def heatmap_series(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per backend, the largest batch × sequence grid measured with everything else equal."""
    grids = series(frame, ["batch_size", "sequence_length"], min_points=2)
    out = {}
    for backend, rows in grids.groupby("backend", sort=True) if not grids.empty else []:
        best = rows.groupby("group").size().idxmax()
        out[str(backend)] = rows[rows["group"] == best]
    return out


def backends_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Configurations measured with two or more backends."""
    backend_options = ["compile_mode", "ort_graph_optimization_level", "ort_execution_mode", "ort_fusion",
                       "ov_performance_hint", "reference"]
    return series(frame, ["backend"], backend_options)


# --- figures ----------------------------------------------------------------------------------------------------

def new_figure(width: float = 6.4, height: float = 4.6) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def cpu_caption(frame: pd.DataFrame) -> str:
    """The CPU the results were measured on, as every chart's caption names it: 'AMD EPYC 9R14, 2 physical cores
    (2 logical CPUs)'; every one of them when the results come from several."""
    columns = [c for c in ("cpu_model", "host_physical_cores", "host_logical_cpus") if c in frame]
    if "cpu_model" not in columns:
        return "an unnamed CPU"
    parts = []
    for values in frame[columns].drop_duplicates().itertuples(index=False):
        facts = dict(zip(columns, values))
        text = str(facts["cpu_model"]) if pd.notna(facts["cpu_model"]) else "an unnamed CPU"
        cores, cpus = facts.get("host_physical_cores"), facts.get("host_logical_cpus")
        if cores is not None and pd.notna(cores):
            text += f", {cores:.0f} physical cores"
            text += f" ({cpus:.0f} logical CPUs)" if cpus is not None and pd.notna(cpus) else ""
        parts.append(text)
    return " and ".join(dict.fromkeys(parts))


def sign(fig: Figure, cpu: str) -> Figure:
    """Names the CPU at the top of the figure (so a PNG says where it was measured on its own); a point label
    that the heading pushes onto another text gives way (labels.tidy)."""
    from corescale.report.labels import tidy

    fig.suptitle(f"measured on {cpu}", fontsize=8, color="0.35")
    tidy(fig)
    return fig


class PlainLog(LogFormatter):
    """Log-axis ticks as plain numbers (0.1, 20, 3000): mathtext is off in corescale's figures (see above)."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def log_scale(ax, which: str = "both") -> None:
    for name in ("x", "y") if which == "both" else (which,):
        getattr(ax, f"set_{name}scale")("log")
        axis = getattr(ax, f"{name}axis")
        axis.set_major_formatter(PlainLog(labelOnlyBase=False))
        axis.set_minor_formatter(PlainLog(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def png_bytes(fig: Figure, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})  # no URL in the file
    return buffer.getvalue()


def heatmap_figure(grids: dict[str, pd.DataFrame]) -> Figure:
    """Latency p50 (ms) for batch size × sequence length, one panel per backend (the study's figures 1 and 2)."""
    fig = new_figure(max(5.2 * len(grids), 6.4), 4.8)
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, (backend, rows) in zip(axes, grids.items()):
        table = rows.pivot_table(index="batch_size", columns="sequence_length", values="latency_p50_ms")
        image = ax.imshow(table.to_numpy(float), cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(table.columns)), [str(c) for c in table.columns])
        ax.set_yticks(range(len(table.index)), [str(i) for i in table.index])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("batch size (samples)")
        peak = np.nanmax(table.to_numpy(float))
        for (i, j), value in np.ndenumerate(table.to_numpy(float)):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8,
                        color="white" if value < 0.6 * peak else "black")
        ax.set_title(f"{backend}: latency p50 (ms)\n{rows['group'].iloc[0]}".rstrip(), fontsize=10)
        fig.colorbar(image, ax=ax, label="latency p50 (ms)")
    return fig


def backends_figure(rows: pd.DataFrame) -> Figure:
    """Latency and throughput of each backend, side by side, per configuration: horizontal bars, so that each
    configuration's name (wrapped) has a row of its own and no two names can cover each other."""
    groups = list(dict.fromkeys(rows["group"]))
    names = [textwrap.fill(g or "all", 34) for g in groups]
    backends = sorted(rows["backend"].unique())
    step = max(0.45, 0.17 * max(n.count("\n") + 1 for n in names), 0.2 * len(backends))
    fig = new_figure(11, 1.9 + step * len(groups))
    left, right = fig.subplots(1, 2, sharey=True)
    height = 0.8 / len(backends)
    y = np.arange(len(groups))
    for i, backend in enumerate(backends):
        mine = rows[rows["backend"] == backend].set_index("group").reindex(groups)
        offset = y - 0.4 + height * (i + 0.5)
        left.barh(offset, mine["latency_p50_ms"], height, label=backend, color=f"C{i % 10}")
        right.barh(offset, mine["throughput_samples_per_s"], height, color=f"C{i % 10}")
    left.set_yticks(y, names, fontsize=8)
    left.invert_yaxis()
    left.set_ylabel("configuration")
    for ax, xlabel, title in ((left, "latency p50 (ms)", "Latency by backend (lower is better)"),
                              (right, "throughput (samples/s)", "Throughput by backend (higher is better)")):
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.legend(*left.get_legend_handles_labels(), loc="outside lower center", ncols=len(backends), fontsize=8)
    return fig


def cost_figure(tables: dict[str, pd.DataFrame]) -> Figure:
    """Dollars per 1M inferences per layout; hatched bars are projections to another machine."""
    layouts = list(dict.fromkeys(label for t in tables.values() for label in t["layout"]))
    fig = new_figure(9, max(3.0, 0.3 * len(layouts) * len(tables) + 1.8))
    ax = fig.subplots()
    height = 0.8 / len(tables)
    y = np.arange(len(layouts))
    for i, (machine, table) in enumerate(tables.items()):
        table = table.drop_duplicates("layout").set_index("layout").reindex(layouts)
        costs = table["cost_per_1m_usd"].replace([np.inf], np.nan).to_numpy(float)
        projected = (table["basis"] != "measured").to_numpy()
        bars = ax.barh(y - 0.4 + height * (i + 0.5), costs, height, label=machine)
        for bar, hatch in zip(bars, projected):
            bar.set_hatch("//" if hatch else "")
        for bar, value, guess in zip(bars, costs, projected):
            if not np.isnan(value):
                ax.annotate(f"${value:.{2 if guess else 3}g}", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                            xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(y, layouts, fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.12)  # room for the value labels
    every = pd.concat([t["cost_per_1m_usd"] for t in tables.values()]).replace([np.inf], np.nan).dropna()
    wide = not every.empty and every.min() > 0 and every.max() / every.min() > 30
    if wide:  # costs 30× apart: a log axis keeps the cheap ones visible
        log_scale(ax, "x")
    ax.set_xlabel("cost per 1M inferences (US$" + (", log scale)" if wide else ")"))
    ax.set_ylabel("measured layout")
    ax.set_title("Cost per 1M inferences (hatched: projection to that machine)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=len(tables), fontsize=8)
    return fig


def sentinel_figure(frame: pd.DataFrame) -> Figure | None:
    """Per trial in the order measured: the speed sentinel's lowest and highest reading against its reference
    (a vertical bar), the tolerance bands (GEMM, triad), a red x where it moved; the steal over the window as
    bars (right axis). None when no result has a sentinel reading (records before 0.4, sentinel=false)."""
    from corescale.measure.sentinel import MEMORY_TOLERANCE, TOLERANCE

    if "sentinel_low" not in frame.columns or frame["sentinel_low"].isna().all():
        return None
    rows = frame[frame["sentinel_low"].notna()].sort_values("sentinel_at", kind="stable").reset_index(drop=True)
    x = np.arange(len(rows))
    fig = new_figure(9, 4.2)
    ax = fig.subplots()
    ax.axhspan(1.0, 1 + TOLERANCE, color="green", alpha=0.12, label=f"GEMM's tolerance: {TOLERANCE:.0%} slower")
    ax.axhspan(1 + TOLERANCE, 1 + MEMORY_TOLERANCE, color="green", alpha=0.05,
               label=f"the triad's: {MEMORY_TOLERANCE:.0%} slower")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.vlines(x, rows["sentinel_low"].astype(float), rows["sentinel_high"].astype(float), lw=3, color="C0",
              label="sentinel: before – after the trial")
    moved = rows["sentinel_moved"].fillna(False).astype(bool).to_numpy()
    ax.plot(x[moved], rows["sentinel_high"].astype(float)[moved], "x", color="red", markersize=8,
            label="moved (flagged)")
    ax.set_ylabel("sentinel time ÷ its reference")
    if len(x) <= 30:
        ax.set_xticks(x, [str(i + 1) for i in x])
    ax.set_xlabel("trial, in the order measured")
    steal = rows["steal_fraction"].astype(float).fillna(0.0) * 100 if "steal_fraction" in rows else None
    if steal is not None:
        right = ax.twinx()
        right.bar(x, steal, width=0.4, color="C1", alpha=0.4, label="steal (% of the window)")
        right.set_ylabel("steal (% of the window)")
        right.set_ylim(0, max(5.0, float(steal.max()) * 1.2))
        handles, labels = right.get_legend_handles_labels()
    else:
        handles, labels = [], []
    left_handles, left_labels = ax.get_legend_handles_labels()
    ax.legend(left_handles + handles, left_labels + labels, fontsize=7, loc="upper left")
    ax.set_title("Shared host: the speed sentinel and steal per trial", fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def load_curves(frame: pd.DataFrame) -> dict[str, ServerSummary]:
    """label -> the `server` section of each target_qps=auto result (its load curve, SLO and max valid QPS)."""
    from corescale.record.files import read_result

    if "scenario" not in frame.columns:
        return {}
    found = {}
    for _, row in frame[(frame["scenario"] == "server") & (frame["status"] == "ok")].iterrows():
        server = read_result(Path(row["path"])).server
        if server is not None and len(server.load_curve) >= 2:
            served = (f"{server.endpoint.url} · {server.endpoint.api}" if server.endpoint else
                      f"{row['backend']} · {row['instances']:.0f} inst · max_batch "
                      f"{server.batching.max_batch if server.batching else '-'}")
            label = f"{row['model']} · {served} · {row['run']}"
            found[label] = server
    return found


def load_curve_figure(curves: dict[str, ServerSummary]) -> Figure:
    """Latency (p50, p90, p99 from LoadGen's scheduled issue) vs offered QPS; the SLO, the max valid QPS and the
    knee marked; one panel per search."""
    fig = new_figure(6.4 * min(len(curves), 2), 4.6 * ((len(curves) + 1) // 2))
    axes = fig.subplots((len(curves) + 1) // 2, min(len(curves), 2), squeeze=False).ravel()
    for ax, (label, server) in zip(axes, curves.items()):
        points = server.load_curve
        qps = [p.target_qps for p in points]
        ax.plot(qps, [p.p50 for p in points], ":", marker="o", markersize=3, label="p50")
        ax.plot(qps, [p.p90 for p in points], "--", marker="o", markersize=3, label="p90")
        ax.plot(qps, [p.p99 for p in points], "-", marker="o", markersize=3, label="p99")
        for p in points:
            if not p.meets_slo:
                ax.plot(p.target_qps, p.p99, "x", color="red", markersize=8)
        if server.slo_p99_ms:
            ax.axhline(server.slo_p99_ms, color="grey", lw=1, label=f"SLO p99 {server.slo_p99_ms:g} ms")
        if server.max_valid_qps:
            ax.axvline(server.max_valid_qps, color="green", lw=1, label=f"max valid {server.max_valid_qps:.4g} QPS")
        if server.knee_qps:
            ax.axvline(server.knee_qps, color="orange", lw=1, ls="--", label=f"knee {server.knee_qps:.4g} QPS")
        log_scale(ax, "y")
        ax.set_xlabel("offered load (queries/s, Poisson)")
        ax.set_ylabel("latency (ms, log)")
        ax.set_title(label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(curves):]:
        ax.set_visible(False)
    return fig


ARCH_MARKERS = {"x86_64": "o", "aarch64": "^"}


def machine_size_figure(ranked: pd.DataFrame, cpu_model: str, here: dict | None, workload: str) -> Figure:
    """US$ per 1M inferences against a catalog kind's physical cores (log-log), one colour per CPU family;
    a vertical bar is a range (the kind's ISA differs from the measured one); the measured machine is a star."""
    priced = ranked[ranked["rank"].notna()]
    fig = new_figure(8.5, 5.2)
    ax = fig.subplots()
    for family, rows in priced.groupby("cpu", sort=False):
        slow = rows["cost_per_1m_usd"].to_numpy(float)
        fast = rows["cost_per_1m_low_usd"].fillna(rows["cost_per_1m_usd"]).to_numpy(float)
        x = rows["physical_cores"].to_numpy(float)
        marker = ARCH_MARKERS.get(str(rows["arch"].iloc[0]) if "arch" in rows else "", "o")
        [points] = ax.plot(x, slow, marker, markersize=6, label=str(family))
        ax.vlines(x, fast, slow, color=points.get_color(), lw=2, alpha=0.6)
    if here is not None:
        ax.plot([here["cores"]], [here["cost_per_1m_usd"]], "*", color="black", markersize=14,
                label=f"this machine (measured, {here['cores']} cores)")
    log_scale(ax, "y")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(PlainLog(base=2, labelOnlyBase=True))
    ax.xaxis.set_minor_formatter(PlainLog(base=2, labelOnlyBase=True))
    ax.set_xlabel("machine size (physical cores, log2)")
    ax.set_ylabel("US$ per 1M inferences (log)")
    ax.set_title(f"Cost against machine size, {workload}: projected from {cpu_model}\n(dots: the cost a "
                 "projection can promise; bars: the range where the ISA differs)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncols=2)
    return fig
