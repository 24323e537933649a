"""The roofline chart: every run with a measured roofline position, on log-log axes, under the roofs that bound it
(each roof named in the legend with the GEMM library that set its compute roof and the triad kernel that set its
memory roof). A colour per backend, a marker per precision; only the points that matter carry a label (the best of
each backend, the recommended configuration), every other point is in the results table."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from corescale.analysis.store import ok_rows
from corescale.machine.precisions import PRECISIONS, REFERENCE
from corescale.report import labels
from corescale.report.charts import log_scale, new_figure

ROOF_COLUMNS = ["roof_peak_gflops", "roof_peak_library", "roof_bandwidth_gbps", "roof_bandwidth_library",
                "threads_per_instance", "instances"]
MARKERS = "o^sDvP*X"  # a marker per precision, in the registry's order (fp32 o, bf16 ^, int8 s); others: o
ROOF_STYLES = ["-", "--", "-.", ":"]


def marker(precision) -> str:
    names = list(PRECISIONS)
    return MARKERS[names.index(precision) % len(MARKERS)] if precision in names else MARKERS[0]


def roofline_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Valid runs whose roofline position is known."""
    rows = ok_rows(frame)
    if rows.empty or "roofline_intensity" not in rows:
        return rows.iloc[0:0]
    return rows[rows["roofline_intensity"].notna() & rows["gflops_per_s"].notna()].reset_index(drop=True)


def run_label(row) -> str:
    backend = str(row.get("backend"))
    linear = row.get("backend.linear")
    if isinstance(linear, str) and linear != "default":
        backend += f" linear={linear}"
    precision = row.get("precision")
    if isinstance(precision, str) and precision != REFERENCE:
        backend += f" {precision}"
    return f"{backend} bs{row.get('instance_batch_size')} s{row.get('sequence_length')}"


def _point_text(row) -> str:
    return f"{run_label(row)}: {100 * row['roofline_fraction']:.2g}% of attainable ({row['roofline_bound']})"


def _roofs(ax, rows: pd.DataFrame) -> list[Line2D]:
    """Each distinct roof (per instances × threads), its ridge point dotted; the legend names what set it."""
    low = float(rows["roofline_intensity"].min()) / 4
    high = float(rows["roofline_intensity"].max()) * 4
    roofs = rows.drop_duplicates(ROOF_COLUMNS)
    x = np.geomspace(min(low, float((roofs["roof_peak_gflops"] / roofs["roof_bandwidth_gbps"]).min()) / 2), high, 200)
    handles = []
    for i, roof in enumerate(roofs.itertuples(index=False)):
        peak, bandwidth = roof.roof_peak_gflops, roof.roof_bandwidth_gbps
        style = ROOF_STYLES[i % len(ROOF_STYLES)]
        shade = str(0.15 + 0.5 * i / max(1, len(roofs) - 1))
        (line,) = ax.plot(x, np.minimum(peak, x * bandwidth), lw=1.8, ls=style, color=shade,
                          label=f"roof on {roof.instances} x {roof.threads_per_instance} thread(s): compute roof "
                                f"{peak:.0f} GFLOP/s ({roof.roof_peak_library}), memory roof {bandwidth:.1f} GB/s "
                                f"({roof.roof_bandwidth_library})")
        ax.axvline(peak / bandwidth, color=shade, ls=":", lw=0.8)
        handles.append(line)
    return handles


def roofline_figure(rows: pd.DataFrame, recommended: frozenset[str] = frozenset()) -> Figure:
    """recommended: the run names of the recommended configuration (a tune's winner), labelled first."""
    fig = new_figure(9, 5.8)
    ax = fig.subplots()
    handles = _roofs(ax, rows)
    backends = sorted(rows["backend"].astype(str).unique())
    colours = {b: f"C{i % 10}" for i, b in enumerate(backends)}
    precisions = sorted(rows["precision"].astype(str).unique()) if "precision" in rows else []
    for row in rows.to_dict("records"):
        ax.scatter(row["roofline_intensity"], row["gflops_per_s"], s=34, zorder=3, color=colours[str(row["backend"])],
                   marker=marker(row.get("precision")), edgecolors="white", linewidths=0.5)
    handles += [Line2D([], [], ls="", marker="o", color=colours[b], label=b) for b in backends]
    handles += [Line2D([], [], ls="", marker=marker(p), color="0.3", label=p) for p in precisions]
    log_scale(ax)
    ax.set_xlabel("arithmetic intensity (FLOP/byte of minimum memory traffic)")
    ax.set_ylabel("achieved (GFLOP/s)")
    ax.set_title("Roofline: each run under the roofs measured on its cores (labelled: best of each backend)",
                 fontsize=10)
    ax.grid(which="both", alpha=0.25)
    fig.legend(handles=handles, loc="outside lower center", ncols=1 if len(handles) <= 3 else 2, fontsize=7)
    chosen = rows[rows["run"].isin(recommended)] if "run" in rows else rows.iloc[0:0]
    notes = [labels.Label(r["roofline_intensity"], r["gflops_per_s"], "recommended: " + _point_text(r),
                          {"weight": "bold"}) for r in chosen.head(1).to_dict("records")]
    for backend in backends:
        best = rows[rows["backend"].astype(str) == backend].sort_values("gflops_per_s").iloc[-1]
        if best.get("run") not in recommended:
            notes.append(labels.Label(best["roofline_intensity"], best["gflops_per_s"], _point_text(best),
                                      {"color": colours[backend]}))
    labels.place(ax, notes)
    return fig
