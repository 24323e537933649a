"""Foreign load on pinned CPUs: the /proc/stat arithmetic, and a real CPU burner flagging a real run."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from helpers import FAST, execute, needs_two_cpus

from corescale.measure import contamination
from corescale.measure.runner import prepare_trial
from corescale.overrides import compose
from corescale.record.trial import TrialRecord
from corescale.report.console import print_result

pytestmark = pytest.mark.alone  # a busy loop's share of a pinned CPU and the speed sentinel

TICK = os.sysconf("SC_CLK_TCK")
STAT = """cpu  900 0 300 9000 0 0 0 0 0 0
cpu0 {busy0} 0 0 {idle0} {iowait0} 0 0 0 0 0
cpu1 500 0 100 4000 0 0 0 0 0 0
intr 12345
"""


def stat_file(tmp_path, name, busy0, idle0, iowait0=0):
    path = tmp_path / name
    path.write_text(STAT.format(busy0=busy0, idle0=idle0, iowait0=iowait0))
    return str(path)


def test_read_cpu_times_counts_busy_and_total_seconds(tmp_path):
    times = contamination.read_cpu_times([0], stat_file(tmp_path, "stat", busy0=2 * TICK, idle0=6 * TICK,
                                                        iowait0=TICK))
    assert list(times) == [0]  # only the pinned CPUs
    busy, total, steal = times[0]
    assert busy == pytest.approx(2.0) and total == pytest.approx(9.0) and steal == 0  # iowait counts as idle


def test_steal_is_not_busy_time(tmp_path):
    path = tmp_path / "stat"
    path.write_text(f"cpu0 {2 * TICK} 0 0 {6 * TICK} 0 0 0 {TICK} 0 0\n")
    busy, total, steal = contamination.read_cpu_times([0], str(path))[0]
    assert (busy, total, steal) == (pytest.approx(2.0), pytest.approx(9.0), pytest.approx(1.0))


def test_the_worst_cpu_decides_not_the_average(monkeypatch):
    """One stolen CPU of 16 is flagged: the verdict is per CPU (and per sibling, per thread), never averaged."""
    cpus = list(range(16))
    before = {c: contamination.CpuTimes(0.0, 0.0, 0.0) for c in cpus}
    after = {c: contamination.CpuTimes(10.0, 10.0, 0.0) for c in cpus}  # every CPU busy for the 10 s window
    reads = iter([before, after])
    monkeypatch.setattr(contamination, "read_cpu_times", lambda wanted: next(reads))
    waits = iter([{1: (0, 0)}, {1: (int(9e9), int(4e9))}])  # a working thread that waited 4 of 10 s
    monkeypatch.setattr(contamination, "read_thread_waits", lambda: next(waits))
    watch = contamination.Watch(cpus)
    watch.start()
    found = watch.stop(own_cpu_seconds=15 * 10.0 + 5.0, wall_seconds=10.0)  # CPU 3 gave half to a burner
    assert found["foreign_parts"]["runqueue_wait"] == pytest.approx(0.4)
    assert found["foreign_load"] == pytest.approx(0.4) and found["foreign_load"] > contamination.CONTAMINATION_THRESHOLD
    average = contamination.foreign_fraction(found["foreign_cpu_seconds"], 10.0, 16)
    assert average < contamination.CONTAMINATION_THRESHOLD  # what averaging over 16 CPUs would have said


def test_own_threads_crowding_one_cpu_are_not_foreign_load():
    """Two threads bound to CPU 0 (as GNU OpenMP binds them), one free to run on both: each thread's time goes to
    the CPUs it may run on; what no live thread accounts for is spread evenly."""
    share = contamination.own_share_by_cpu({11: 4.0, 12: 4.0, 13: 2.0}, {11: [0], 12: [0], 13: [0, 1]}, [0, 1],
                                           own_cpu_seconds=12.0)
    assert share == {0: pytest.approx(4 + 4 + 1 + 1), 1: pytest.approx(1 + 1)}
    assert contamination.own_share_by_cpu({}, {}, [0, 1], own_cpu_seconds=6.0) == {0: 3.0, 1: 3.0}  # as before
    assert contamination.own_share_by_cpu({5: 3.0}, {5: [7]}, [0, 1], own_cpu_seconds=3.0) == {0: 1.5, 1: 1.5}


@needs_two_cpus
def test_a_thread_bound_to_one_cpu_loads_that_cpu_alone_in_the_real_accounting():
    """Real threads, real /proc: a spinning thread that bound itself to one CPU is counted there, not spread."""
    import threading
    import time

    from corescale.machine.instance_env import thread_affinities

    cpus = sorted(os.sched_getaffinity(0))[:2]
    bound, done, found = threading.Event(), threading.Event(), {}

    def spin():
        os.sched_setaffinity(0, [cpus[0]])  # this thread only, as an OpenMP runtime binds its threads
        found["tid"] = threading.get_native_id()
        bound.set()
        while not done.is_set():
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        bound.wait(10)
        before = contamination.read_thread_waits()
        time.sleep(0.3)
        after, allowed = contamination.read_thread_waits(), thread_affinities()
    finally:
        done.set()
        thread.join()
    tid = found["tid"]
    ran = {tid: (after[tid][0] - before[tid][0]) / 1e9}
    assert allowed[tid] == [cpus[0]] and ran[tid] > 0.01
    share = contamination.own_share_by_cpu(ran, allowed, cpus, own_cpu_seconds=ran[tid])
    assert share == {cpus[0]: pytest.approx(ran[tid]), cpus[1]: 0.0}


def test_a_busy_smt_sibling_counts(monkeypatch):
    reads = iter([{0: contamination.CpuTimes(0, 0, 0), 1: contamination.CpuTimes(0, 0, 0)},
                  {0: contamination.CpuTimes(10, 10, 0), 1: contamination.CpuTimes(6, 10, 0)}])
    monkeypatch.setattr(contamination, "read_cpu_times", lambda wanted: next(reads))
    monkeypatch.setattr(contamination, "read_thread_waits", lambda: {})
    watch = contamination.Watch([0], siblings=[1])
    watch.start()
    found = watch.stop(own_cpu_seconds=10.0, wall_seconds=10.0)
    assert found["sibling_busy"] == {"1": pytest.approx(0.6)} and found["foreign_load"] == pytest.approx(0.6)


def test_smt_siblings_come_from_sysfs(tmp_path):
    for cpu, siblings in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings)
    assert contamination.smt_siblings([0], root=str(tmp_path)) == [2]
    assert contamination.smt_siblings([0, 1], exclude=[3], root=str(tmp_path)) == [2]  # 3 is another instance's


def test_foreign_time_is_busy_time_minus_own_time(tmp_path):
    before = contamination.read_cpu_times([0, 1], stat_file(tmp_path, "a", busy0=0, idle0=0))
    after = contamination.read_cpu_times([0, 1], stat_file(tmp_path, "b", busy0=3 * TICK, idle0=TICK))
    assert contamination.foreign_seconds(before, after, own_cpu_seconds=1.0) == pytest.approx(2.0)
    assert contamination.foreign_seconds(before, after, own_cpu_seconds=5.0) == 0.0  # never negative
    assert contamination.foreign_fraction(2.0, wall_seconds=4.0, cpus=1) == pytest.approx(0.5)
    assert contamination.foreign_fraction(2.0, wall_seconds=0.0, cpus=1) == 0.0


def test_message_names_instances_figure_and_threshold():
    metrics = SimpleNamespace(foreign_load=0.42, contaminated_instances=[0, 2])
    text = contamination.contamination_message(metrics)
    assert "42%" in text and "instance(s) 0, 2" in text and f"{contamination.CONTAMINATION_THRESHOLD:.0%}" in text


@pytest.mark.slow
def test_cpu_burner_on_the_pinned_cpu_flags_the_result(tmp_path, capsys, monkeypatch):
    from corescale.measure import sentinel

    monkeypatch.setattr(sentinel, "_RUN", sentinel.Sentinel())  # this trial's "before" reading is the reference
    cpu = min(os.sched_getaffinity(0))
    trial = prepare_trial(compose([*FAST, "duration=1", "cores_per_instance=1", "sentinel=true",
                                   f"output_dir={tmp_path}"]))
    assert trial.plan.instances[0].cpus == (cpu,)
    burners = []

    def start_burner(instance, event):  # a busy loop on the instance's CPU, from the common start on
        if event["event"] == "started":
            burners.append(subprocess.Popen([sys.executable, "-c",
                                             f"import os; os.sched_setaffinity(0, [{cpu}])\nwhile True: pass"]))

    try:
        outcome = execute(trial, on_event=start_burner)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert len(burners) == 1
    metrics = outcome.record.metrics
    assert outcome.record.status == "ok"
    # sharing one CPU with a busy loop: the scheduler gives the burner about half of it
    assert metrics.contaminated is True and metrics.contaminated_instances == [0]
    assert metrics.foreign_load > 0.25
    instance = metrics.per_instance[0]
    assert instance.contaminated and instance.foreign_load == metrics.foreign_load
    assert instance.cpu_utilisation < 0.8  # its own CPU time fell well short of wall x threads
    # the speed sentinel after the trial shares the CPU with the busy loop, which is still running: about 2x slower
    found = outcome.record.contamination
    assert found is not None and [r.phase for r in found.sentinel] == ["before", "after"]
    # (how much slower depends on what else shares the CPU already: 1.5x on a busy machine; when a part is slower
    # beyond its tolerance the reading moved — test_sentinel.py holds that rule)
    assert found.sentinel[1].ratio > 1.25  # against the "before" (median of three)
    assert found.sentinel[1].moved == (found.sentinel[1].compute_ratio > 1.25 or found.sentinel[1].memory_ratio > 2)
    assert found.sentinel_moved and found.foreign_load == metrics.foreign_load
    assert found.steal_fraction is not None and str(cpu) in found.steal_by_cpu
    again = TrialRecord.from_json(json.loads(json.dumps(outcome.record.to_json())))
    assert again.contamination == found
    print_result(outcome.record)
    err = capsys.readouterr().err
    assert "contaminated" in err and "sentinel" in err
