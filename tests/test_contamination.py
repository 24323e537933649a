"""Foreign load on pinned CPUs: the /proc/stat arithmetic, and a real CPU burner flagging a real run."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import FAST, execute

from corescale.measure import contamination
from corescale.measure.runner import prepare_trial
from corescale.overrides import compose
from corescale.report.console import print_result

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
    busy, total = times[0]
    assert busy == pytest.approx(2.0) and total == pytest.approx(9.0)  # iowait counts as idle


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


def test_cpu_burner_on_the_pinned_cpu_flags_the_result(tmp_path, capsys):
    cpu = min(os.sched_getaffinity(0))
    trial = prepare_trial(compose([*FAST, "duration=1", "cores_per_instance=1", f"output_dir={tmp_path}"]))
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
    instance = metrics.instances[0]
    assert instance.contaminated and instance.foreign_load == metrics.foreign_load
    assert instance.cpu_utilisation < 0.8  # its own CPU time fell well short of wall x threads
    print_result(outcome.record)
    assert "contaminated" in capsys.readouterr().err
