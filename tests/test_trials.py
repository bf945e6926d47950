"""Estimator trials on the simulator: the criteria are computed, and the default estimator meets them."""

from __future__ import annotations

import pytest

from bench import trials


def test_settle_time_and_tracking() -> None:
    trace = [(t / 10, 100.0, 0.0, mu) for t, mu in enumerate([200, 200, 120, 90, 100, 130, 100, 100])]
    assert trials.settle_time(trace, 0.0) == (0.3, 0.8)
    assert trials.settle_time([(0.0, 100.0, 0.0, None)], 0.0) == (None, 0.0)


def test_median_of_results() -> None:
    rs = [trials.Result("x", {"a": s}, {"a": 1.0}, 0.9 + i / 100, 0.2, 0.1, 0.05, r)
          for i, (s, r) in enumerate([(1.0, 2.0), (None, None), (3.0, 1.0)])]  # fmt: skip
    m = trials.median(rs)
    assert (m.settle["a"], m.recovery, m.goodput) == (3.0, 2.0, 0.91)


@pytest.mark.slow
def test_the_default_estimator_meets_the_criteria_by_median_of_five_seeds() -> None:
    noload = trials.noload_p99()
    result = trials.median([trials.run("bdp", seed, noload) for seed in range(1, 6)])
    failed = [name for name, ok in result.passes().items() if not ok]
    assert not failed, (failed, trials.table([result]))


@pytest.mark.slow
def test_a_static_limit_misses_a_capacity_change() -> None:
    result = trials.run("static", seed=3)
    assert result.settle["step down 50 % (workers)"] is None
    assert result.passes()["goodput"]
