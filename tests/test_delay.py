"""The ``delay`` estimator: each rule pinned on synthetic windows (as Netflix's VegasLimitTest feeds samples)."""

from __future__ import annotations

import math

import pytest

from admitgate.core.errors import ConfigError
from admitgate.limit.delay import DelayTuning, QueueDelay
from admitgate.limit.window import Window

BASE = 0.1  # the service's own latency, seconds
T = DelayTuning()


def window(now: float, *, delivered: float = 100.0, latency: float = BASE, busy: float | None = None, lag: float = 0.0,
           limiting: bool = True, stalled: bool = False, drops: float = 0.0) -> Window:  # fmt: skip
    """A window at ``now``: ``delivered`` requests/s completing after ``latency`` s, ``busy`` in flight (default: no
    queue, delivered × latency), the loop ``lag``, ``drops`` 5xx per second among the delivered."""
    busy = delivered * latency if busy is None else busy
    return Window(now, 0.1, 100, delivered, latency, round(drops * 0.5), int(busy), busy, latency, delivered, limiting,
                  1e9, delivered, delivered, drops, lag, stalled)  # fmt: skip


def feed(e: QueueDelay, start: float, end: float, **fields: object) -> float:
    """Windows every 0.1 s from ``start`` to ``end`` (inclusive); the last rate."""
    rate = math.nan
    for i in range(round((end - start) / 0.1) + 1):
        rate = e.estimate(window(round(start + 0.1 * i, 6), **fields))  # type: ignore[arg-type]
    return rate


def limiting(mu: float = 100.0, baseline: float = BASE) -> QueueDelay:
    """An estimator that has seen a standing queue and measured ``mu``."""
    e = QueueDelay()
    feed(e, 0.0, 0.5, delivered=mu, latency=baseline)  # the baseline, no queue
    feed(e, 0.6, 1.2, delivered=mu, latency=baseline + 0.2, busy=mu * (baseline + 0.2))  # a standing queue
    assert e.state == "limiting"
    return e


def test_the_gate_stays_open_without_a_queue_and_knows_no_capacity() -> None:
    e = QueueDelay()
    assert feed(e, 0.0, 3.0, delivered=5000.0, latency=0.001) == T.open_rate
    assert e.state == "open" and e.mu is None


def test_a_burst_that_drains_within_the_interval_does_not_limit() -> None:
    e = QueueDelay()
    feed(e, 0.0, 0.5)
    feed(e, 0.6, 0.9, latency=0.3, busy=30.0)  # 0.4 s of queue: under the 0.5 s interval
    assert feed(e, 1.0, 2.0) == T.open_rate and e.state == "open"


def test_a_standing_queue_limits_at_what_the_service_delivers() -> None:
    e = limiting(mu=180.0)
    assert e.mu == pytest.approx(180.0)


def test_a_slow_services_queue_stands_only_once_it_has_outlasted_two_of_its_round_trips() -> None:
    """A herd landing on a 0.5 s service: its first answers come back after 0.5 s, so the rate it delivers over the
    half second before says nothing of its capacity (a cold gate told a whole herd by 6/s that way)."""
    e = QueueDelay()
    feed(e, 0.0, 0.5, delivered=200.0, latency=0.5)
    queue = {"delivered": 200.0, "latency": 0.8, "busy": 200.0 * 0.8}
    assert feed(e, 0.6, 1.5, **queue) == T.open_rate and e.state == "open"  # 0.9 s: under two round trips
    feed(e, 1.6, 1.7, **queue)
    assert e.state == "limiting" and e.mu == pytest.approx(200.0)


def test_the_event_loop_lag_is_a_queue_of_its_own() -> None:
    """A CPU-bound app: its handlers show no latency beyond the baseline, the loop's lag shows the queue."""
    e = QueueDelay()
    feed(e, 0.0, 0.5, delivered=450.0, latency=0.002)
    feed(e, 0.6, 1.2, delivered=450.0, latency=0.002, lag=0.3)
    assert e.state == "limiting" and e.mu == pytest.approx(450.0)


def test_work_in_flight_beyond_the_delivered_rate_is_no_queue_unless_latency_shows_it_too() -> None:
    """The in-flight count is noisy (and lags a herd's onset): alone it does not read as a queue."""
    e = QueueDelay()
    feed(e, 0.0, 0.5)
    feed(e, 0.6, 2.0, busy=40.0)  # 40 in flight where 10 would be no queue, latency at its baseline
    assert e.state == "open"


def test_over_the_target_the_rate_is_cut_in_proportion_to_the_excess_at_most_by_half() -> None:
    e = limiting(mu=100.0)
    excess = 0.1  # the delay 0.1 s beyond the target: cut by gain × excess
    rate = e.estimate(window(1.3, latency=BASE + e.target + excess, busy=100.0 * (BASE + e.target + excess)))
    assert rate == pytest.approx(e.mu * (1 - T.gain * excess))
    rate = e.estimate(window(1.4, latency=BASE + 2.0, busy=100.0 * (BASE + 2.0)))
    assert rate == pytest.approx(e.mu * (1 - T.max_cut))


def test_under_the_target_the_rate_rises_by_as_much_while_the_gate_limits() -> None:
    e = limiting(mu=100.0)
    delay = e.target / 2 + 0.005
    rate = e.estimate(window(1.3, latency=BASE + delay, busy=100.0 * (BASE + delay)))
    assert rate == pytest.approx(e.mu * (1 + T.gain * (e.target - delay)))


def test_demand_below_the_rate_leaves_it_at_mu() -> None:
    """Nothing to learn, and a burst must not find a rate above the capacity."""
    e = limiting(mu=100.0)
    assert e.estimate(window(1.3, delivered=60.0, limiting=False)) == pytest.approx(e.mu)


def test_a_whole_interval_of_unmet_demand_and_no_queue_doubles_the_rate() -> None:
    """BBR's start-up gain: a service with room shows it within a span (after an outage, or a jam at a herd's onset)."""
    e = limiting(mu=100.0)
    rates = [e.estimate(window(round(1.3 + 0.1 * i, 6), delivered=100.0)) for i in range(6)]
    assert rates[-1] == pytest.approx(T.max_gain * e.mu)
    assert max(rates[:-1]) < T.max_gain * e.mu


def test_mu_follows_what_a_saturated_service_delivers() -> None:
    e = limiting(mu=200.0)
    feed(e, 1.3, 4.0, delivered=100.0, latency=BASE + 0.2, busy=100.0 * (BASE + 0.2))  # capacity halved
    assert e.mu == pytest.approx(100.0, rel=0.01)


def test_mu_rises_with_what_is_delivered_without_a_queue() -> None:
    e = limiting(mu=100.0)
    feed(e, 1.3, 4.0, delivered=150.0)
    assert e.mu == pytest.approx(150.0, rel=0.01)


def test_a_stalled_service_is_sent_nothing_new_and_its_capacity_stands() -> None:
    e = limiting(mu=100.0)
    assert e.estimate(window(1.3, delivered=0.0, busy=30.0, stalled=True)) == T.least
    assert e.mu == pytest.approx(100.0)
    assert e.estimate(window(1.4, delivered=0.0, busy=30.0, drops=50.0, latency=2.0)) == T.least  # only errors
    assert e.mu == pytest.approx(100.0)
    assert e.estimate(window(1.5)) >= e.mu  # answered again: the rate comes back at once


def test_the_gate_opens_again_once_it_has_not_limited_for_the_release_time() -> None:
    e = limiting(mu=100.0)  # (it last limited at 1.2 s)
    feed(e, 1.3, 1.2 + e.release - 0.1, delivered=50.0, limiting=False)
    assert e.state == "limiting"
    assert feed(e, 1.2 + e.release, 1.2 + e.release, delivered=50.0, limiting=False) == T.open_rate
    assert e.state == "open"


def test_the_baseline_is_learnt_only_without_a_queue() -> None:
    e = QueueDelay()
    feed(e, 0.0, 0.5, latency=0.1)
    feed(e, 0.6, 3.0, latency=0.04)  # faster: learnt
    assert e.baseline == pytest.approx(0.04)
    e = limiting(mu=100.0, baseline=0.1)
    feed(e, 1.3, 3.0, latency=0.5, busy=50.0)  # a standing queue: nothing learnt from it
    assert e.baseline == pytest.approx(0.1)


def test_the_forecast_expects_mu_to_rise_as_a_probe_would_raise_it() -> None:
    e = QueueDelay(target=0.08)
    assert e.growth == pytest.approx(T.gain * 0.08)


@pytest.mark.parametrize("field", ["target", "interval", "release", "baseline_window"])
def test_each_knob_must_be_positive_and_the_error_names_it(field: str) -> None:
    with pytest.raises(ConfigError, match=f"capacity.delay.{field}"):
        QueueDelay(**{field: 0})
