"""Estimator trials on the simulator: the criteria are computed, and the default estimator meets them."""

from __future__ import annotations

import pytest

from lab import trials


def test_settle_time_and_tracking() -> None:
    trace = [(t / 10, 100.0, 0.0, mu) for t, mu in enumerate([200, 200, 120, 90, 100, 130, 100, 100])]
    assert trials.settle_time(trace, 0.0) == (0.3, 0.8)
    assert trials.settle_time([(0.0, 100.0, 0.0, None)], 0.0) == (None, 0.0)


def test_a_change_is_met_when_found_within_5_s_and_tracked_most_of_the_time_after() -> None:
    def result(settle: float | None, tracking: float) -> trials.Result:
        return trials.Result("x", {"s": settle}, {"s": tracking}, 0.95, 0.2, 0.2, 0.05, 1.0)

    assert result(4.0, 0.9).passes()["s"] and result(5.0, trials.STAYS).passes()["s"]
    assert not result(5.1, 1.0).passes()["s"] and not result(None, 0.0).passes()["s"]
    assert not result(0.8, 0.33).passes()["s"]  # found at once and left again (gradient's step down)


def test_median_of_results() -> None:
    rs = [trials.Result("x", {"a": s}, {"a": 1.0}, 0.9 + i / 100, 0.2, 0.1, 0.05, r)
          for i, (s, r) in enumerate([(1.0, 2.0), (None, None), (3.0, 1.0)])]  # fmt: skip
    m = trials.median(rs)
    assert (m.settle["a"], m.recovery, m.goodput) == (3.0, 2.0, 0.91)


def test_a_change_is_moved_by_each_phase_and_every_run_counts_in_the_median() -> None:
    ramp = trials.STEPS["ramp 50 → 200/s over 20 s"][0]
    moved = trials._moved(ramp, 0.8)
    assert moved["workers"] == 5 and moved["capacity"][0] == (20.8, 5.0) and moved["capacity"][-1] == (40.8, 20.0)
    assert len(trials.PHASES) >= 3 and max(trials.PHASES) >= 2.0  # across a cruise of 1-3 s
    a = trials.Result("x", {"s": 2.0}, {"s": 1.0}, runs={"s": [1.0, 2.0, None, 9.0]})
    b = trials.Result("x", {"s": 4.0}, {"s": 1.0}, runs={"s": [3.0, 4.0, 5.0, 6.0]})
    m = trials.median([a, b])
    assert m.runs["s"] == [1.0, 2.0, None, 9.0, 3.0, 4.0, 5.0, 6.0]
    assert m.settle["s"] == 4.0  # of the eight runs, not of the two seeds' medians (2.0)
    assert m.within("s") == 5 / 8 and a.within("s") == 0.5 and a.within("s", 10.0) == 0.75


@pytest.mark.slow
def test_the_default_estimator_meets_the_criteria_by_median_of_five_seeds() -> None:
    noload = trials.noload_p99()
    result = trials.median([trials.run("bdp", seed, noload) for seed in range(1, 6)])
    failed = [name for name, ok in result.passes().items() if not ok]
    assert not failed, (failed, trials.table([result]))


@pytest.mark.slow
def test_a_static_limit_misses_a_capacity_change() -> None:
    result = trials.run("static", seed=3, phases=(0.0,))  # (at any phase: a static limit never moves)
    assert result.settle["step down 50 % (workers)"] is None
    assert result.passes()["goodput"]
