"""The roofline: the memory roof (triad), the model's intensity, attainable = min(peak, intensity x bandwidth),
each run's position in its record, and the chart's roofs labelled with what set them."""

import json

import pytest
from helpers import ROOT

from corescale.machine import bandwidth, roofline
from corescale.record.trial import Roofline, RunMetrics, TrialRecord
from corescale.workload.flops import forward_flops
from corescale.workload.memory import encoder_parameter_count, traffic_bytes
from corescale.workload.models import resolve_model

BASE = resolve_model("bert-base")


def peak(gflops, gbps, library="torch_onednn"):
    return {"gflops": gflops, "library": library, "bandwidth": {"gbps": gbps, "library": "torch_triad"}}


def test_attainable_is_the_lower_roof():
    assert roofline.attainable(10.0, 100.0, 5.0) == (50.0, "memory")
    assert roofline.attainable(40.0, 100.0, 5.0) == (100.0, "compute")
    assert roofline.attainable(20.0, 100.0, 5.0) == (100.0, "compute")  # at the ridge both bind: compute


def test_position_sums_the_roofs_of_instances_and_needs_all_of_them():
    found = roofline.position(60.0, 1e9, 1e8, [peak(50.0, 2.0), peak(50.0, 2.0, "openvino")])
    assert found["intensity_flops_per_byte"] == 10.0 and found["bandwidth_gbps"] == 4.0
    assert found["attainable_gflops"] == 40.0 and found["bound"] == "memory"
    assert found["fraction_of_attainable"] == 1.5 and found["peak_library"] == "openvino+torch_onednn"
    assert found["ridge_flops_per_byte"] == 25.0
    assert roofline.position(60.0, 1e9, 1e8, [peak(50.0, 2.0), {"gflops": 50.0}]) is None  # a roof missing
    assert roofline.position(60.0, 1e9, 1e8, [None]) is None


def test_intensity_grows_with_batch_and_falls_with_precision_width():
    def intensity(batch, precision="fp32"):
        return forward_flops(BASE, batch, 128) / traffic_bytes(BASE, batch, 128, precision)

    assert intensity(1) < intensity(8) < intensity(64)
    assert intensity(1, "int8") > intensity(1, "bf16") > intensity(1)
    # bs 1 is dominated by the fp32 weights: 4 bytes per encoder parameter, within the other traffic's share
    weights = 4 * encoder_parameter_count(BASE)
    assert weights < traffic_bytes(BASE, 1, 128) < 1.05 * weights


def test_triad_measures_a_bandwidth_and_sizes_arrays_past_the_cache():
    assert bandwidth.array_bytes(32 * 2**20) == 128 * 2**20 and bandwidth.array_bytes(0) == bandwidth.ARRAY_MIN_BYTES
    found = bandwidth.triad(1, min_seconds=0.0, size_bytes=8 * 2**20)
    assert found["gbps"] > 0.1 and found["library"] == "torch_triad" and found["passes"] >= bandwidth.MIN_PASSES


def test_the_record_keeps_its_position_and_old_records_read_without_one():
    position = Roofline(**roofline.position(30.0, 1e9, 1e8, [peak(50.0, 2.0)]))
    schema1 = next((ROOT / "tests" / "data" / "schema1").glob("*/result.json"))
    record = TrialRecord.from_json(json.loads(schema1.read_text()))
    assert record.metrics.roofline is None  # measured before roofs existed
    record.metrics.roofline = position
    again = TrialRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again.metrics.roofline == position and isinstance(again.metrics, RunMetrics)


def test_chart_labels_each_roof_with_what_set_it():
    import pandas as pd

    from corescale.report.roofline import roofline_figure

    rows = pd.DataFrame([{"backend": b, "backend.linear": linear, "instance_batch_size": 8, "sequence_length": 128,
                          "roofline_intensity": 300.0, "gflops_per_s": g, "roofline_fraction": g / 90,
                          "roofline_bound": "compute", "roof_peak_gflops": 90.0, "roof_peak_library": "torch_onednn",
                          "roof_bandwidth_gbps": 6.0, "roof_bandwidth_library": "torch_triad",
                          "threads_per_instance": 2, "instances": 1}
                         for b, linear, g in (("pytorch", "default", 40.0), ("pytorch", "onednn", 80.0))])
    figure = roofline_figure(rows)
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert any("compute roof 90 GFLOP/s (torch_onednn" in t for t in legend)
    assert any("memory roof 6.0 GB/s (torch_triad)" in t for t in legend)
    texts = [t.get_text() for t in figure.axes[0].texts]  # the best of the backend labelled, the other not
    assert texts == ["pytorch linear=onednn bs8 s128: 89% of attainable (compute)"]
    ax = figure.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


@pytest.mark.parametrize("column", ["roofline_intensity", "roofline_bound", "roof_bandwidth_library"])
def test_results_table_has_the_roofline_columns(column):
    from corescale.analysis import store

    table = store.load(ROOT / "tests" / "data" / "schema1")
    assert column in table.frame and table.frame[column].isna().all()  # old records: no position
