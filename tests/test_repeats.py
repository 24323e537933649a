"""Repeats in fresh processes are the unit of uncertainty: interleaved across a sweep, resumed by (key, repeat),
summarised with an interval across repeats."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import LOOP, assert_one_line_error, corescale

from corescale.overrides import compose
from corescale.record.repeats import Interval, across_repeats
from corescale.record.trial import Failure, TrialRecord
from corescale.trials.local import schedule


def item(name, repeats=3, order="interleaved", seed=0):
    cfg = SimpleNamespace(repeats=repeats, repeat_order=order, seed=seed)
    return SimpleNamespace(label=name, trial=SimpleNamespace(cfg=cfg))


def names(order):
    return [f"{i.label}{r}" for i, r in order]


def test_repeats_are_interleaved_round_by_round():
    a, b, c = item("A"), item("B"), item("C", repeats=1)
    assert names(schedule([a, b, c])) == ["A0", "B0", "C0", "A1", "B1", "A2", "B2"]


def test_shuffled_rounds_are_seeded():
    trials = [item(n, repeats=4, order="shuffled", seed=7) for n in "ABCDE"]
    first, again = names(schedule(trials)), names(schedule(trials))
    assert first == again  # the same seed, the same order
    rounds = [first[i:i + 5] for i in range(0, 20, 5)]
    assert all(sorted(r) == sorted(f"{n}{k}" for n in "ABCDE") for k, r in enumerate(rounds))
    assert len({tuple(x[0] for x in r) for r in rounds}) > 1  # not one fixed order
    other = names(schedule([item(n, repeats=4, order="shuffled", seed=8) for n in "ABCDE"]))
    assert other != first


def test_interval_is_across_repeats():
    interval = Interval.of([10.0, 12.0, 11.0])
    assert interval.mean == pytest.approx(11.0) and interval.n == 3
    assert interval.low == pytest.approx(11.0 - 4.303 * 1.0 / 3**0.5, rel=1e-3)  # t(0.975, 2) = 4.303
    single = Interval.of([5.0])
    assert single.low is None and "1 repeat: no interval" in single.text("ms")


@pytest.mark.parametrize("overrides, message", [
    (["repeats=0"], "repeats must be > 0"),
    (["repeats=nan"], "repeats: expected int"),
    (["repeat_order=random"], "unknown repeat_order 'random'; allowed: interleaved, shuffled"),
    (["backend=onnxruntime", "openmp=gnu"], "openmp=gnu applies to the backends that run on OpenMP threads"),
    (["backend=openvino", "openmp=intel"], "backend=openvino uses its own thread pool"),
])
def test_bad_repeat_and_openmp_settings_are_one_line(overrides, message):
    assert_one_line_error(compose, overrides, message)


@pytest.mark.slow
def test_run_with_repeats_measures_each_in_fresh_processes_and_resumes(tmp_path, toy_everywhere):
    """On the toy backend (a real one, in real worker processes): the subject is the loop, not a framework."""
    out = tmp_path / "out"
    proc = corescale("run", *LOOP, "repeats=3", f"output_dir={out}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "across repeats" in proc.stdout and "this configuration" in proc.stdout
    records = [TrialRecord.from_json(json.loads((d / "result.json").read_text())) for d in sorted(out.iterdir())]
    assert sorted(r.repeat for r in records) == [0, 1, 2] and {r.repeats for r in records} == {3}
    assert len({r.trial_key for r in records}) == 1
    assert len({r.started_at + str(r.elapsed_s) for r in records}) == 3  # three runs, one after another
    summary = across_repeats(records)
    assert summary.repeats == 3 and summary.throughput.low < summary.throughput.mean < summary.throughput.high
    sweep = corescale("run", "-m", *LOOP, "repeats=3", "batch_size=1,2", f"output_dir={out}", "--no-progress")
    assert sweep.returncode == 0, sweep.stderr
    assert "6 trials: 3 measured ok, 0 failed, 3 skipped" in sweep.stdout  # batch 1's repeats were done
    assert len(list(out.iterdir())) == 6


def test_an_interval_of_a_positive_figure_never_reaches_zero():
    """Three repeats of a rate, one far off (a busy machine): the Student-t interval of the values would go
    below 0 samples/s; the one of their logarithms stays positive and still holds the mean."""
    wide = Interval.of([3.44, 3.52, 14.54])
    assert 0 < wide.low < 3.44 and wide.high > wide.mean
    assert Interval.of([10.0, 11.0, 12.0]).low == pytest.approx(11 - 4.303 / 3 ** 0.5, rel=1e-3)  # as before


SERVED = next((Path(__file__).parent / "data" / "schema2").glob("*pytorch*/result.json"))  # max valid QPS 416


def served(max_qps, p50=9.0, p99=28.0):
    record = TrialRecord.from_json(json.loads(SERVED.read_text()))
    met = {"p50": p50, "p99": p99} if max_qps else {"p50": 80.0, "p99": 900.0}
    record.server = replace(record.server, max_valid_qps=max_qps, latency_ms=met)
    return record


def test_server_repeats_are_summarised_by_their_max_qps():
    """A server-scenario record has no closed-loop metrics: its repeats' figure is the max QPS that met the SLO
    and the latencies at it (it read as 0 repeats, 2 failed, nan)."""
    summary = across_repeats([served(400.0, 9.0, 30.0), served(440.0, 11.0, 34.0), served(None)])
    assert summary.repeats == 2 and summary.failed == 0 and summary.unmet == 1
    assert summary.unit == "QPS at the SLO"
    assert summary.throughput.mean == pytest.approx(420.0) and summary.throughput.low < 400.0
    assert summary.p50_ms.mean == pytest.approx(10.0) and summary.p99_ms.mean == pytest.approx(32.0)
    failed = served(430.0).fail(Failure(kind="crash", message="instance 0 ended"))
    assert across_repeats([failed, served(410.0)]).failed == 1


def test_the_repeats_table_names_the_servers_rate(monkeypatch):
    from corescale.report import console

    shown = []
    monkeypatch.setattr(console, "print_wide", lambda table: shown.append(table))
    state = SimpleNamespace(records_of=lambda item: [served(400.0), served(440.0)])
    console.print_repeats(state, [SimpleNamespace(number=1, label="server.max_batch=2")])
    table = shown[0]
    assert [c.header for c in table.columns][3] == "QPS at the SLO"
    assert list(table.columns[2].cells) == ["2"] and list(table.columns[3].cells) == ["420.00"]
