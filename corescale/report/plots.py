"""Scaling figures, one function per figure: a DataFrame of results in, a matplotlib Figure out.

Columns read (as corescale.trials.studies builds them; other tables may provide the same names):
  group (optional: one line per value), status (optional: only "ok" rows are drawn),
  total_cores, instances, latency_p50_ms, max_instance_p50_ms, throughput_samples_per_s,
  and for the subtitle, when present: model, backend, batch_size, total_batch_size, sequence_length.
No pyplot: figures are built directly on the Agg canvas, so nothing here touches global state.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from corescale.report.labels import Label, place

SUBTITLE_COLUMNS = (("model", "{}"), ("backend", "{}"), ("batch_size", "batch {}"),
                    ("total_batch_size", "total batch {}"), ("sequence_length", "seq {}"))


def _figure(columns: int = 1) -> tuple[Figure, list]:
    from corescale.report.charts import new_figure

    fig = new_figure(6.4 * columns, 4.6)
    axes = [fig.add_subplot(1, columns, i + 1) for i in range(columns)]
    return fig, axes


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def _groups(frame: pd.DataFrame, group: str | None, x: str):
    """(label, rows sorted by x) per group; one unlabelled group when there is no group column."""
    if group is None or group not in frame or frame[group].nunique() <= 1:
        yield "", frame.sort_values(x)
        return
    for label, rows in frame.groupby(group, sort=False):
        yield str(label), rows.sort_values(x)


def _subtitle(frame: pd.DataFrame, skip: tuple[str, ...] = ()) -> str:
    parts = []
    for column, fmt in SUBTITLE_COLUMNS:
        if column in frame and column not in skip and frame[column].nunique() == 1:
            parts.append(fmt.format(frame[column].iloc[0]))
    return " · ".join(parts)


def _title(ax, title: str, frame: pd.DataFrame, skip: tuple[str, ...] = ()) -> None:
    sub = _subtitle(frame, skip)
    ax.set_title(f"{title}\n{sub}" if sub else title, fontsize=11)


def _count_axis(ax, values) -> None:
    """Log-2 x axis labelled with the actual counts (1, 2, 4, ... 48)."""
    values = sorted({int(v) for v in values})
    if len(values) > 1 and values[-1] / values[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(v) for v in values])


def _labels(xs, ys, texts, colour) -> list[Label]:
    return [Label(x, y, text, {"color": colour}) for x, y, text in zip(xs, ys, texts)]


def _place_by_rank(ax, found: list[list[Label]]) -> None:
    """Every line's labels, the first point of each line first, then the second of each, ...: where labels would
    cover each other, the later points of later lines give way (their values are in the table)."""
    ranked = [group[i] for i in range(max(map(len, found), default=0)) for group in found if i < len(group)]
    place(ax, ranked)


def _scaling_lines(ax, data: pd.DataFrame, group, x_col: str, y_col: str, ideal, efficiency) -> list[list[Label]]:
    """Measured line per group, its ideal (from the first point) dashed; returns its efficiency labels per line
    (placed once the axes are complete)."""
    found = []
    for label, rows in _groups(data, group, x_col):
        x = rows[x_col].to_numpy(float)
        y = rows[y_col].to_numpy(float)
        line, = ax.plot(x, y, marker="o", label=label or "measured")
        best = ideal(x, y)
        ax.plot(x, best, linestyle="--", color=line.get_color(), alpha=0.6,
                label=f"ideal (linear){' ' + label if label else ''}")
        found.append(_labels(x, y, [f"{e:.0%}" for e in efficiency(best, y)], line.get_color()))
    _count_axis(ax, data[x_col])
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return found


def cores_figure(frame: pd.DataFrame, group: str | None = "group") -> Figure:
    """Latency (p50) vs cores of one instance, a line per group, ideal 1/cores scaling dashed."""
    fig, (ax,) = _figure()
    data = _ok(frame)
    found = _scaling_lines(ax, data, group, "total_cores", "latency_p50_ms",
                           ideal=lambda x, y: y[0] * x[0] / x, efficiency=lambda ideal, y: ideal / y)
    ax.set_xlabel("cores (one instance)")
    ax.set_ylabel("latency p50 (ms)")
    _title(ax, "Latency vs cores (labels: scaling efficiency)", data, skip=("total_batch_size",))
    _place_by_rank(ax, found)
    return fig


def instances_figure(frame: pd.DataFrame, group: str | None = "group") -> Figure:
    """Total throughput vs number of instances, ideal-linear line dashed, efficiency annotated."""
    fig, (ax,) = _figure()
    data = _ok(frame)
    found = _scaling_lines(ax, data, group, "instances", "throughput_samples_per_s",
                           ideal=lambda n, t: t[0] * n / n[0], efficiency=lambda ideal, t: t / ideal)
    ax.set_xlabel("instances (each pinned to its own cores)")
    ax.set_ylabel("total throughput (samples/s)")
    cores = sorted(set(data["cores_per_instance"].dropna().astype(int))) if "cores_per_instance" in data else []
    each = f", {cores[0]} core(s) each" if len(cores) == 1 else ""
    _title(ax, f"Throughput vs instances{each} (labels: scaling efficiency)", data, skip=("total_batch_size",))
    _place_by_rank(ax, found)
    return fig


def batch_figure(frame: pd.DataFrame, group: str | None = "group") -> Figure:
    """One total batch split over N instances: max instance latency and total throughput per N."""
    fig, (left, right) = _figure(2)
    data = _ok(frame)
    found: dict = {left: [], right: []}
    for label, rows in _groups(data, group, "instances"):
        n = rows["instances"].to_numpy(float)
        latency = rows["max_instance_p50_ms"].to_numpy(float)
        throughput = rows["throughput_samples_per_s"].to_numpy(float)
        line, = left.plot(n, latency, marker="o", label=label or None)
        found[left].append(_labels(n, latency, [f"{v:.1f}" for v in latency], line.get_color()))
        line, = right.plot(n, throughput, marker="o", label=label or None)
        found[right].append(_labels(n, throughput, [f"{g:.2f}x" for g in throughput / throughput[0]],
                                    line.get_color()))
    for ax in (left, right):
        _count_axis(ax, data["instances"])
        ax.set_xlabel("instances (sharing all cores equally)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    left.set_ylabel("max instance latency p50 (ms)")
    right.set_ylabel("total throughput (samples/s)")
    _title(left, "Batch split: latency = slowest instance", data, skip=("batch_size",))
    _title(right, "Batch split: throughput (labels: gain vs fewest)", data, skip=("batch_size",))
    for ax, notes in found.items():
        _place_by_rank(ax, notes)
    return fig


def save_figure(fig: Figure, path: Path, dpi: int = 120) -> Path:
    """Writes the figure (format from the suffix) whole, then renames it into place."""
    from corescale.record.files import write_atomic

    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi), "figure")

