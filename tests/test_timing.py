import time

import numpy as np

from corescale.config import WarmupConfig
from corescale.measure.timing import is_stable, timed_loop, warm_up


def test_is_stable():
    assert not is_stable([10, 10, 10], 3, 0.05)
    assert is_stable([100, 100, 100, 101, 99, 100], 3, 0.05)
    assert not is_stable([200, 200, 200, 100, 100, 100], 3, 0.05)


def test_warmup_stops_when_latency_settles():
    delays = iter([0.02, 0.015, 0.01] + [0.002] * 100)
    result = warm_up(lambda: time.sleep(next(delays)), WarmupConfig(min_iterations=3, max_iterations=50, window=3,
                                                                     tolerance=0.5))
    assert result.converged
    assert 6 <= len(result.durations_ns) < 15


def test_warmup_gives_up_at_max_iterations():
    delays = iter([0.001 * (i % 2 * 5 + 1) for i in range(100)])  # never settles at 1 % tolerance
    result = warm_up(lambda: time.sleep(next(delays)), WarmupConfig(min_iterations=2, max_iterations=8, window=1,
                                                                     tolerance=0.01))
    assert not result.converged and len(result.durations_ns) == 8


def test_timed_loop_keeps_every_sample_with_timestamps():
    start = time.perf_counter_ns() + 20_000_000
    samples = timed_loop(lambda: time.sleep(0.005), start, 0.2, min_iterations=5)
    assert samples.starts_ns[0] >= start
    assert samples.ends_ns[-1] >= start + 200_000_000
    assert np.all(samples.durations_ns >= 5_000_000)
    assert np.all(np.diff(samples.starts_ns) > 0)
    assert 10 <= len(samples.starts_ns) <= 41


def test_timed_loop_honours_min_iterations_past_the_window():
    samples = timed_loop(lambda: time.sleep(0.01), time.perf_counter_ns(), 0.001, min_iterations=12)
    assert len(samples.starts_ns) == 12
