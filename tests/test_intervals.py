"""Intervals a reader can use (issue 50): an across-repeat 95 % interval is printed only where it says something
(over MIN_REPEATS repeats or more, narrower than the value, inside what the repeats measured); elsewhere the text
says what the repeats were. tune.json keeps the bounds, the repeats' values and whether the interval is usable.
Counts read as whole numbers in every table."""

import pandas as pd
import pytest

from corescale.record.repeats import NO_INTERVAL, Interval
from corescale.report import quality
from corescale.report.tables import results_table
from corescale.report.tune import _fmt
from corescale.tune.document import Figure
from corescale.tune.outputs import interval_json, ratio_words
from corescale.tune.verdict import Finalist


def test_two_repeats_print_their_values_not_a_t_interval():
    two = Interval.of([41.2, 56.6])
    assert two.low is not None and two.low < 41.2  # Student-t over 2 repeats: t(0.975, 1) = 12.7
    assert two.text("QPS", 1) == f"48.9 QPS (2 repeats: 41.2, 56.6; {NO_INTERVAL})"
    assert two.bounds(1) == "repeats 41.2, 56.6" and not two.usable


def test_an_interval_below_the_smallest_repeat_is_never_printed_as_such():
    spread = Interval.of([10.0, 30.0, 11.0, 12.0])  # the t-interval reaches below 10 (and above 30)
    assert spread.low < 10.0 and spread.past_repeats and not spread.usable
    for shown in (spread.text("ms"), spread.bounds()):
        assert f"{spread.low:.2f}" not in shown and "10.00, 30.00, 11.00, 12.00" in shown
    many = Interval.of([10.0, 30.0, 11.0, 12.0, 10.5, 11.5, 12.5])  # beyond LISTED: their range
    assert many.text("ms") == f"13.93 ms (7 repeats, range 10.00 – 30.00; {NO_INTERVAL})"


def test_a_usable_interval_is_printed_with_its_repeats_count():
    tight = Interval.of([100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.0, 101.0, 99.0])
    assert tight.usable and tight.text("samples/s").startswith("100.00 samples/s (95 % CI 99.")
    assert tight.text("samples/s").endswith("over 10 repeats)") and tight.bounds().startswith("99.")
    assert Interval.of([5.0]).text("ms") == "5.00 ms (1 repeat: no interval)" and Interval.of([5.0]).bounds() == "-"
    assert Interval.of([0.9, 1.1], ).text("", 1) == f"1.0 (2 repeats: 0.9, 1.1; {NO_INTERVAL})"  # no unit


def test_each_repeat_shows_its_own_within_run_interval_where_known():
    p50 = Interval.of([12.1, None, 12.5], within=[(11.9, 12.3), (1.0, 2.0), None])
    assert p50.values == (12.1, 12.5) and p50.bounds(1) == "repeats 12.1 [11.9 – 12.3], 12.5"


def test_tune_json_keeps_the_bounds_the_repeats_and_whether_the_interval_is_usable():
    figure = interval_json(Interval.of([41.2, 56.6]))
    stored = figure.to_dict()
    assert stored["values"] == [41.2, 56.6] and stored["usable"] is False and stored["n"] == 2
    assert stored["low"] == pytest.approx(Interval.of([41.2, 56.6]).low)  # the numbers stay for machines
    read = Figure.from_dict(stored)
    assert read.interval_text(1) == "repeats 41.2, 56.6" and _fmt(read, 1) == "48.9 (repeats 41.2, 56.6)"
    old = Figure.from_dict({"mean": 48.9, "low": -49.0, "high": 146.8, "n": 2})  # a tune.json before 0.3
    assert old.interval_text(1) == f"2 repeats: {NO_INTERVAL}" and "-49.0" not in _fmt(old, 1)
    usable = interval_json(Interval.of([100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.0, 101.0, 99.0]))
    assert usable.usable and _fmt(usable).startswith("100.00 (99.")


def _quality_frame() -> pd.DataFrame:
    return pd.DataFrame([{"quality_task": "embed", "quality_verdict": "passed", "quality_gate": "cosine_p1>=0.99",
                          "quality_reference": "pytorch fp32", "quality_metric": "cosine_p1", "quality_value": 1.0,
                          "quality_cosine_p1": 0.99996, "quality_samples": 256.0, "model": "m", "precision": "fp32",
                          "instances": 1, "cpus_per_instance": 2, "backend": "pytorch", "batch_size": 1,
                          "sequence_length": 128}])


def test_the_quality_tables_print_counts_as_whole_numbers():
    _, _, html = quality.section(_quality_frame())
    assert "<td>256</td>" in html and "256.0000" not in html and "<td>1.0000</td>" in html  # 0.99996
    table = results_table(_quality_frame(), ["quality_samples", "quality_cosine_p1", "instances"], "results")
    cells = [c for column in table.columns for c in column._cells]
    assert cells == ["256", "1.0000", "1"]


def _finalist(label, throughputs):
    return Finalist(label, [], [], [], [{"valid": True, "throughput": t} for t in throughputs])


def test_a_speedup_over_two_repeats_says_the_repeats_ratios_not_its_bootstrap_interval():
    winner, baseline = _finalist("w", [400.0, 600.0]), _finalist("b", [40.0, 60.0])
    words = ratio_words((10.0, 6.7, 15.0), winner, baseline)
    assert words == f"over 2 and 2 repeats, {NO_INTERVAL}; the repeats' ratios 6.67 – 15.00×"
    winner, baseline = _finalist("w", [500.0, 510.0, 490.0]), _finalist("b", [50.0, 51.0, 49.0])
    assert ratio_words((10.0, 9.8, 10.2), winner, baseline) == "95 % CI 9.80 – 10.20×"
