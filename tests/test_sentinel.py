"""The speed sentinel (measure/sentinel.py) and the record's contamination section: readings against the run's first,
the tolerance, the typed section read back, the console's lines, and a repeat whose sentinel moved measured once
more. In process: the real busy process that the sentinel flags is tests/test_contamination.py's burner test."""

import json

import pandas as pd
import pytest
from helpers import FAST

from corescale.measure import sentinel
from corescale.measure.runner import TrialOutcome, new_record, prepare_trial
from corescale.overrides import compose
from corescale.record.sections import Contamination
from corescale.record.trial import TrialRecord
from corescale.report.console import shared_host_lines
from corescale.trials import local
from corescale.trials.local import Planned, run_trials


def test_readings_compare_with_the_first_on_each_cpu(monkeypatch):
    # the first reading on a CPU is taken three times, its median the reference (one slow reading spoils none)
    times = iter([{0: sentinel.Timing(2.0, 4.0)}, {0: sentinel.Timing(9.0, 4.0)}, {0: sentinel.Timing(2.0, 30.0)},
                  {0: sentinel.Timing(2.2, 4.0)}, {0: sentinel.Timing(2.0, 9.0)}, {0: sentinel.Timing(3.0, 6.0)},
                  {0: sentinel.Timing(1.8, 3.5)}, {0: sentinel.Timing(1.0, 4.0)}, {0: sentinel.Timing(1.2, 4.0)},
                  {0: sentinel.Timing(2.0, 4.0)}])
    monkeypatch.setattr(sentinel, "time_cpus", lambda cpus: next(times))
    run = sentinel.Sentinel()
    first, near, memory_halved, gemm_slower, a_bit_faster, far_faster, after_healing, slowed_again = (
        run.read([0], "before") for _ in range(8))
    assert first["ratio"] == 1.0 and not first["moved"] and first["compute_ms"] == {"0": 2.0}
    assert near["ratio"] == pytest.approx(1.1) and not near["moved"]  # inside +25 %
    # the triad alone moved: its own tolerance (twice as slow: the host's memory bandwidth is noisy)
    assert memory_halved["memory_ratio"] == pytest.approx(2.25) and memory_halved["compute_ratio"] == 1.0
    assert memory_halved["ratio"] == pytest.approx(2.25) and memory_halved["moved"]
    # the GEMM 50 % slower moves the reading; the triad 50 % slower alone would not
    assert gemm_slower["ratio"] == pytest.approx(1.5) and gemm_slower["moved"]
    assert not sentinel.moved(1.5, sentinel.MEMORY_TOLERANCE) and sentinel.moved(1.5)
    # faster never moves a reading; within the tolerance it leaves the reference alone (noise never lowers it)
    assert a_bit_faster["ratio"] == pytest.approx(0.875) and not a_bit_faster["moved"]
    assert run.first[0] == sentinel.Timing(1.0, 4.0)  # 2.0 -> 1.0: the first readings were on slowed CPUs
    assert far_faster["compute_ratio"] == pytest.approx(0.5) and not far_faster["moved"]
    assert after_healing["ratio"] == pytest.approx(1.2) and not after_healing["moved"]
    assert slowed_again["ratio"] == pytest.approx(2.0) and slowed_again["moved"]  # against the healed reference


def test_a_part_is_the_median_of_its_runs_a_burst_spoils_none(monkeypatch):
    runs = iter([1.0, 1.0, 6.4, 1.1, 6.3, 1.2])  # steal in two of the five timed runs (the first: migration, untimed)
    monkeypatch.setattr(sentinel._Kernel, "compute", lambda self: next(runs))
    monkeypatch.setattr(sentinel._Kernel, "memory", lambda self: 3.0)
    import os

    cpu = min(os.sched_getaffinity(0))
    assert sentinel.time_cpus([cpu]) == {cpu: sentinel.Timing(1.2, 3.0)}


def test_a_real_reading_is_milliseconds_on_every_cpu_and_restores_affinity():
    import os

    mine = os.sched_getaffinity(0)
    cpus = sorted(mine)[:2]
    found = sentinel.Sentinel().read(cpus, "before")
    assert os.sched_getaffinity(0) == mine
    assert set(found["compute_ms"]) == {str(c) for c in cpus} and all(v > 0 for v in found["memory_ms"].values())
    assert sum(found["compute_ms"].values()) + sum(found["memory_ms"].values()) < 2000  # tens of ms; wide margin


def reading(ratio: float, phase: str = "after") -> dict:
    return {"at": 1.0, "phase": phase, "compute_ms": {"0": 1.0}, "memory_ms": {"0": 1.0}, "ratio": ratio,
            "moved": sentinel.moved(ratio)}


def contamination(ratio: float = 1.0, steal: float = 0.0, before: float = 1.0, **more) -> Contamination:
    return Contamination.from_dict({"steal_fraction": steal, "steal_by_cpu": {"0": steal}, "foreign_load": 0.0,
                                    "sentinel": [reading(before, "before"), reading(ratio)], "sentinel_tolerance": 0.25,
                                    **more}, "contamination")


def test_the_section_reads_back_and_an_old_record_has_none(tmp_path):
    trial = prepare_trial(compose([*FAST, f"output_dir={tmp_path}"]))
    record = new_record(trial, None, 0.0)
    record.contamination = contamination(1.4, 0.05)
    again = TrialRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again.contamination == record.contamination
    assert again.contamination.sentinel_moved and again.contamination.stolen
    assert again.contamination.sentinel_range == (1.0, 1.4)
    old = record.to_json()
    del old["contamination"]
    assert TrialRecord.from_json(old).contamination is None
    broken = {**record.to_json(), "contamination": {"steal_fraction": "much"}}
    with pytest.raises(Exception, match="contamination.steal_fraction"):
        TrialRecord.from_json(broken)


def test_console_warns_of_steal_and_a_moved_sentinel_only_above_their_thresholds(tmp_path):
    trial = prepare_trial(compose([*FAST, f"output_dir={tmp_path}"]))
    record = new_record(trial, None, 0.0)
    record.contamination = contamination(1.1, 0.01)
    assert shared_host_lines(record) == []
    record.contamination = contamination(1.6, 0.08)
    steal, moved = shared_host_lines(record)
    assert "stole 8.0%" in steal and "another guest" in steal
    assert "sentinel moved" in moved and "after 1.60x" in moved


def fake_trials(tmp_path, monkeypatch, readings) -> list[tuple[int, bool]]:
    """run_trial replaced: each call's record carries the sentinel's readings(repeat, rerun_of_moved) -> (before,
    after); returns the calls made, (repeat, rerun_of_moved) each."""
    calls = []

    def fake_run_trial(trial, host, on_event, keep_going, on_lock_wait, repeat, done_meanwhile, forkservers,
                       rerun_of_moved=False):
        calls.append((repeat, rerun_of_moved))
        record = new_record(trial, host, 0.0)
        record.repeat = repeat
        before, after = readings(repeat, rerun_of_moved)
        record.contamination = contamination(after, before=before, rerun_of_moved=rerun_of_moved)
        return TrialOutcome(tmp_path / f"r{len(calls)}", record)

    monkeypatch.setattr(local, "run_trial", fake_run_trial)
    return calls


def test_a_repeat_whose_sentinel_moved_before_and_after_is_measured_once_more(tmp_path, monkeypatch):
    trial = prepare_trial(compose([*FAST, "repeats=3", f"output_dir={tmp_path}"]))

    def readings(repeat, rerun):  # 0 unmoved, 1 slowed before and after (then fine again), 2 slowed after only
        ratio = 1.0 if rerun or repeat == 0 else 1.5
        return (ratio if repeat == 1 else 1.0), ratio

    calls = fake_trials(tmp_path, monkeypatch, readings)
    item = Planned(1, [], trial, "x")
    state = run_trials([item], resume=False)
    assert calls == [(0, False), (1, False), (1, True), (2, False)]  # repeat 1 once more, only once; 2 flagged only
    kept = [row.record.contamination for row in state.rows]
    assert [c.rerun_of_moved for c in kept] == [False, True, False] and not kept[1].sentinel_moved
    assert kept[2].sentinel_moved and not kept[2].sentinel_moved_throughout


def side(run: str, hour: int, moved: bool) -> pd.DataFrame:
    measured = json.dumps({"model": "m", "backend.name": "b"})
    return pd.DataFrame([{"status": "ok", "valid": True, "measured": measured, "model": "m", "backend": "b",
                          "repeat": r, "run": f"{run}{r}", "latency_p50_ms": 10.0 + r, "instances": 1,
                          "throughput_samples_per_s": 100.0, "started_at": f"2026-12-03T{hour:02d}:0{r}:00+0000",
                          "sentinel_low": 1.0, "sentinel_high": 1.6 if moved and r == 1 else 1.1,
                          "sentinel_moved": moved and r == 1, "steal_fraction": 0.01} for r in range(3)])


def test_compare_marks_a_ratio_whose_sentinel_moved_and_sides_measured_apart():
    from corescale.analysis import compare

    found = compare.compare_frames(side("a", 4, False), side("b", 6, True))
    [row] = found.rows.to_dict(orient="records")
    assert row["sentinel_moved"] and (row["sentinel_low"], row["sentinel_high"]) == (1.0, 1.6)
    assert row["interleaved"] is False and row["apart_s"] == pytest.approx(2 * 3600 - 120)
    moved, apart = compare.shared_host_note(found.rows)
    assert "marked *" in moved and "not interleaved" in apart
    steady = compare.compare_frames(side("a", 4, False), side("b", 4, False))
    assert steady.rows["interleaved"].tolist() == [True] and compare.shared_host_note(steady.rows) == []


def test_a_rerun_that_moved_too_ends_the_reruns_of_the_loop(tmp_path, monkeypatch):
    trial = prepare_trial(compose([*FAST, "repeats=4", f"output_dir={tmp_path}"]))
    # a host slow from repeat 1 on: every reading moved, re-runs included
    calls = fake_trials(tmp_path, monkeypatch, lambda repeat, rerun: (1.0, 1.0) if repeat == 0 else (1.5, 1.5))

    class Heard(local.Listener):
        said: list[int] = []

        def slow_host(self, item, state):
            self.said.append(state.repeat)

    heard = Heard()
    state = run_trials([Planned(1, [], trial, "x")], resume=False, listener=heard)
    # repeat 1 re-run once; its re-run moved too: repeats 2 and 3 are flagged, not re-run (not 8 trials but 5)
    assert calls == [(0, False), (1, False), (1, True), (2, False), (3, False)]
    assert state.slow_host and heard.said == [1]
    assert [row.record.contamination.sentinel_moved_throughout for row in state.rows] == [False, True, True, True]
