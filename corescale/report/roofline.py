"""The roofline chart: every run with a measured roofline position, on log-log axes, under the roofs that bound it
(the compute roof labelled with the GEMM library that set it, the memory roof with the triad kernel)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from corescale.analysis.store import ok_rows
from corescale.report.charts import new_figure

ROOF_COLUMNS = ["roof_peak_gflops", "roof_peak_library", "roof_bandwidth_gbps", "roof_bandwidth_library",
                "threads_per_instance", "instances"]


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
    return f"{backend} bs{row.get('instance_batch_size')} s{row.get('sequence_length')}"


def roofline_figure(rows: pd.DataFrame) -> Figure:
    fig = new_figure(9, 5.6)
    ax = fig.subplots()
    low = float(rows["roofline_intensity"].min()) / 4
    high = float(rows["roofline_intensity"].max()) * 4
    roofs = rows.drop_duplicates(ROOF_COLUMNS)
    x = np.geomspace(min(low, float((roofs["roof_peak_gflops"] / roofs["roof_bandwidth_gbps"]).min()) / 2), high, 200)
    for i, roof in enumerate(roofs.itertuples(index=False)):
        peak, bandwidth = roof.roof_peak_gflops, roof.roof_bandwidth_gbps
        where = f"{roof.instances} x {roof.threads_per_instance} thread(s)"
        (line,) = ax.plot(x, np.minimum(peak, x * bandwidth), lw=2, alpha=0.8)
        ax.annotate(f"compute roof {peak:.0f} GFLOP/s ({roof.roof_peak_library}, {where})", (x[-1], peak),
                    xytext=(-4, 4 + 11 * i), textcoords="offset points", ha="right", fontsize=8, color=line.get_color())
        ridge = peak / bandwidth
        ax.annotate(f"memory roof {bandwidth:.1f} GB/s ({roof.roof_bandwidth_library})", (x[0], x[0] * bandwidth),
                    xytext=(4, 6 + 11 * i), textcoords="offset points", fontsize=8, color=line.get_color(),
                    rotation=0)
        ax.axvline(ridge, color=line.get_color(), ls=":", lw=0.8)
    for row in rows.to_dict("records"):
        ax.scatter(row["roofline_intensity"], row["gflops_per_s"], s=30, zorder=3)
        ax.annotate(f"{run_label(row)}: {row['roofline_fraction']:.0%} of attainable ({row['roofline_bound']})",
                    (row["roofline_intensity"], row["gflops_per_s"]), xytext=(5, -3), textcoords="offset points",
                    fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of minimum memory traffic)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("Roofline: every run under the roofs measured on its cores", fontsize=10)
    ax.grid(which="both", alpha=0.25)
    return fig
