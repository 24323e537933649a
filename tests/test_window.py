"""Unbiased common-window throughput: synthetic timelines whose true rate is known, for any number of instances
and batch sizes (dropping straddling calls undercounts by about half a call per instance)."""

import numpy as np
import pytest

from corescale.measure.aggregate import InstanceSamples, common_window, run_metrics
from corescale.record.stats import in_window, window_throughput

REPORT = {"wall_seconds": 10.0, "foreign_cpu_seconds": 0.0, "cpu_seconds": 10.0, "peak_rss_bytes": 1,
          "load_seconds": 1.0, "stage_seconds": {}, "warmup_iterations": 3, "warmup_converged": True}


def steady(instance: int, start_ns: int, period_ns: int, gap_ns: int, calls: int, batch: int, phase_ns: int = 0):
    """An instance calling back to back: each call lasts period - gap, then a short gap; first call after phase."""
    starts = start_ns + phase_ns + np.arange(calls, dtype=np.int64) * period_ns
    return InstanceSamples(instance, [instance], 1, batch, starts, starts + period_ns - gap_ns,
                           np.array([period_ns] * 3), dict(REPORT))


@pytest.mark.parametrize("instances, batch", [(1, 1), (2, 1), (2, 8), (8, 8), (8, 1)])
def test_throughput_is_the_true_rate(instances, batch):
    rng = np.random.default_rng(instances * 100 + batch)
    start = 10**12
    timelines = []
    true_rate = 0.0
    for i in range(instances):
        period = int(rng.uniform(0.05e9, 0.9e9))  # 50-900 ms per call, every instance its own speed
        phase = int(rng.uniform(0, 0.2e9))  # and its own start offset
        calls = int(12e9 // period) + 2
        timelines.append(steady(i, start, period, 50_000, calls, batch, phase))
        true_rate += batch * 1e9 / period
    metrics = run_metrics(timelines, start, 128, 1e9)
    # the window starts at the common start: the phase offsets before the first calls cost a little
    lost = sum(int(t.starts_ns[0] - start) / 1e9 * t.batch_size * 1e9 / (t.starts_ns[1] - t.starts_ns[0])
               for t in timelines) / metrics.window_s
    assert metrics.throughput_samples_per_s == pytest.approx(true_rate - lost, rel=0.01)
    dropped = sum(np.count_nonzero(in_window(t.starts_ns, t.ends_ns, metrics.window_start_ns,
                                             metrics.window_end_ns)) * batch for t in timelines) / metrics.window_s
    if instances > 1:  # what whole-calls-only counting would have said: biased low
        assert dropped < metrics.throughput_samples_per_s


def test_straddling_call_is_credited_by_its_fraction():
    # one call from 0 to 10 s, window from 5 s to 10 s: half a call's samples
    samples, rate = window_throughput([0], [10_000_000_000], 5_000_000_000, 10_000_000_000, batch_size=8)
    assert samples == pytest.approx(4.0) and rate == pytest.approx(0.8)
    assert window_throughput([0], [10], 20, 30, 8) == (0.0, 0.0)  # outside: nothing


def test_latency_comes_from_calls_inside_the_window():
    start = 0
    fast = steady(0, start, 100_000_000, 0, 50, 1)  # 100 ms calls, ends at 5 s
    slow = steady(1, start, 3_000_000_000, 0, 3, 1)  # 3 s calls: its last one straddles the window's end
    window = common_window([fast, slow], start)
    assert window == (0, int(fast.ends_ns[-1]))
    metrics = run_metrics([fast, slow], start, 32, 1e9)
    assert metrics.calls_outside_window == 2  # the 3-6 s call straddles the end, the 6-9 s one is after it
    assert metrics.per_instance[1].latency_s.count == 1  # its one call inside the 5 s window
    assert metrics.samples_in_window == pytest.approx(50 + 5 / 3)
