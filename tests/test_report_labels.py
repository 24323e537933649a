"""The report's matplotlib figures never draw one text over another: every figure the report draws from recorded
results (and a crowded roofline of 24 runs) is drawn at the report's resolution and the boxes of all its drawn
texts (titles, tick labels, axis labels, legends, point labels) are checked pairwise. Built in this process."""

import itertools

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

from corescale.analysis.store import load, ok_rows
from corescale.report import charts, labels
from corescale.report import html as report
from corescale.report.roofline import roofline_figure

pytestmark = pytest.mark.slow  # chart rendering may start fc-list once (matplotlib's font cache on a cold machine)

DATA = ROOT / "tests" / "data"
DPI = 110  # report.charts.png_bytes


def _context(frame, recommended=frozenset()):
    facts = report.machine_context(frame, None)
    machines = report.cost_machines(None, None, frame, facts["ranking"])
    return {"machines": machines, "slo": None, "cpu": charts.cpu_caption(frame), "recommended": recommended,
            "cost_tables": {m.name: report.cost.cost_table(frame, m, None) for m in machines}, **facts}


def _report_figures(root):
    frame = load(root).frame
    context = _context(frame)
    for chart in report.CHARTS:
        figure = chart.build(frame, context)
        if figure is not None:
            yield f"{root.name}:{chart.id}", charts.sign(figure, context["cpu"])


def _crowded_roofline_rows() -> pd.DataFrame:
    """24 runs of three backends and two precisions within a factor of 1.3 of each other (the crowd of issue 24),
    under one roof."""
    rng = np.random.default_rng(7)
    rows = []
    for number, (backend, precision, _) in enumerate(itertools.product(["pytorch", "onnxruntime", "openvino"],
                                                                        ["fp32", "int8"], range(4))):
        gflops = 20 * rng.uniform(1, 1.3)
        rows.append({"run": f"run-{number}", "backend": backend, "precision": precision, "instance_batch_size": 1,
                     "sequence_length": 128, "roofline_intensity": 30 * rng.uniform(1, 1.3), "gflops_per_s": gflops,
                     "roofline_fraction": gflops / 90, "roofline_bound": "compute", "roof_peak_gflops": 90.0,
                     "roof_peak_library": "torch_onednn", "roof_bandwidth_gbps": 6.0,
                     "roof_bandwidth_library": "torch_triad", "threads_per_instance": 2, "instances": 1})
    return pd.DataFrame(rows)


def test_every_report_figure_of_recorded_results_is_free_of_overlapping_text():
    drawn = dict(_report_figures(DATA / "schema1"))
    drawn.update(_report_figures(DATA / "schema2"))
    rows = ok_rows(load(DATA / "schema1").frame)  # three backends, each in its own configuration
    grouped = rows.assign(group=rows["instances"].map(lambda n: f"instances={n} sequence_length=32 batch_size=1"))
    drawn["backends"] = charts.sign(charts.backends_figure(grouped.drop_duplicates(["group", "backend"], keep="last")),
                                    charts.cpu_caption(rows))
    assert {"schema1:heatmap", "schema1:cores", "schema1:instances", "schema1:cost"} <= set(drawn)
    for name, figure in drawn.items():
        assert labels.overlaps(figure, DPI) == [], name
        assert any("measured on AMD EPYC" in t.get_text() for t, _ in labels.drawn_texts(figure)), name


def test_a_crowded_roofline_labels_the_best_of_each_backend_and_the_recommendation_only():
    rows = _crowded_roofline_rows()
    recommended = rows.sort_values("gflops_per_s").iloc[len(rows) // 2]["run"]
    figure = roofline_figure(rows, frozenset({recommended}))
    assert labels.overlaps(figure, DPI) == []
    placed = [t.get_text() for t, _ in labels.drawn_texts(figure) if t.get_gid() == labels.GID]
    assert 1 <= len(placed) <= 4  # the recommendation and at most one per backend: never 24
    assert placed[0].startswith("recommended: ")
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert {"pytorch", "onnxruntime", "openvino", "fp32", "int8"} <= set(legend)
    assert any("compute roof 90 GFLOP/s (torch_onednn)" in t and "memory roof 6.0 GB/s (torch_triad)" in t
               for t in legend)


def test_the_overlap_check_finds_texts_drawn_over_each_other_and_place_leaves_out_what_does_not_fit():
    figure = charts.new_figure(4, 3)
    ax = figure.subplots()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.text(0.5, 0.5, "first text")
    ax.text(0.52, 0.5, "second text")
    assert labels.overlaps(figure, DPI) == [("first text", "second text")]

    figure = charts.new_figure(3, 2)
    ax = figure.subplots()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    crowd = [labels.Label(0.5, 0.5, f"label number {i}") for i in range(30)]  # all on one point
    left_out = labels.place(ax, crowd)
    assert 0 < len(left_out) < len(crowd) and left_out[0] is not crowd[0]  # the first always finds a place
    assert labels.overlaps(figure, DPI) == []
