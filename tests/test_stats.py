import numpy as np
import pytest

from corescale.record.stats import Measurement, bootstrap_ratio_ci, window_throughput


def test_known_samples():
    m = Measurement(np.arange(1, 101, dtype=float))  # 1..100
    assert m.count == 100
    assert m.mean == pytest.approx(50.5)
    assert m.std == pytest.approx(np.std(np.arange(1, 101), ddof=1))
    assert (m.min, m.max) == (1.0, 100.0)
    assert m.median == pytest.approx(50.5)
    assert m.percentile(90) == pytest.approx(90.1)
    assert m.percentile(99) == pytest.approx(99.01)
    assert m.cv == pytest.approx(m.std / 50.5)
    s = m.summary()
    assert s.p99_9 == pytest.approx(99.901) and s.p50 == m.median and s.count == 100
    assert set(s.to_dict()) >= {"count", "mean", "std", "min", "max", "p50", "p90", "p95", "p99", "p99_9", "cv",
                                "mean_ci95_low", "mean_ci95_high", "p50_ci95_low", "p50_ci95_high", "outliers"}


def test_confidence_intervals_contain_truth_and_shrink():
    rng = np.random.default_rng(1)
    small = Measurement(rng.normal(10, 1, 50))
    large = Measurement(rng.normal(10, 1, 5000))
    for m in (small, large):
        assert m.mean_ci95[0] < 10 < m.mean_ci95[1]
        assert m.median_ci95[0] < 10 < m.median_ci95[1]
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(large.mean_ci95) < width(small.mean_ci95) / 5
    assert width(large.median_ci95) < width(small.median_ci95) / 5


def test_median_ci_coverage():
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(400):
        lo, hi = Measurement(rng.exponential(1.0, 60)).median_ci95
        covered += lo <= np.log(2) <= hi
    assert 0.92 <= covered / 400 <= 0.99  # a 95 % interval covers the true median ~95 % of the time


def test_mad_outliers():
    samples = np.r_[np.full(50, 10.0) + np.linspace(-0.1, 0.1, 50), [30.0, 50.0]]
    m = Measurement(samples)
    assert m.outliers == 2
    assert Measurement(np.full(10, 3.0)).outliers == 0


def test_from_ns_is_seconds():
    assert Measurement.from_ns([1_000_000, 3_000_000]).mean == pytest.approx(0.002)


def test_window_throughput_counts_samples_done_in_the_window_not_inverse_mean():
    # 10 calls of 100 ms back to back from t=0, then one from 1.0 to 1.1 s that straddles the window's end
    starts = np.arange(11) * 100_000_000
    ends = starts + 100_000_000
    samples, rate = window_throughput(starts, ends, 0, 1_050_000_000, batch_size=4)
    assert samples == pytest.approx(40 + 4 * 0.5)  # the 11th call is half inside: half its samples
    assert rate == pytest.approx(42 / 1.05)


def test_bootstrap_ratio():
    rng = np.random.default_rng(0)
    a = rng.normal(10, 0.5, 200)
    b = rng.normal(20, 1.0, 200)
    ratio, lo, hi = bootstrap_ratio_ci(a, b)
    assert lo < ratio < hi
    assert lo > 1.9 and hi < 2.1


def test_the_t_quantile_and_welchs_p_agree_with_scipy_stats():
    """record.stats computes them from scipy.special (scipy.stats costs every run a second to import)."""
    from scipy import stats

    from corescale.record.stats import t_quantile, welch_p

    rng = np.random.default_rng(0)
    for n, m in [(2, 2), (2, 7), (5, 5), (30, 4)]:
        a, b = rng.normal(1.0, 0.1, n), rng.normal(1.05, 0.3, m)
        assert welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
        assert t_quantile(0.975, n - 1) == pytest.approx(stats.t.ppf(0.975, n - 1), rel=1e-12)
    same = np.array([2.0, 2.0])
    assert welch_p(same, same.copy()) == 1.0 and welch_p(same, same + 1) == 0.0  # no spread: equal or not
