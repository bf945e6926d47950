"""The retry schedule: places on the axis of work, a head that moves at H, and the forecast."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import ConfigError
from admitgate.core.schedule import SLOT_GRACE, Schedule, forecast


def test_consecutive_places_come_due_at_the_rate() -> None:
    s = Schedule(4.0, now=0.0)
    places = [s.take(1.0, 0.0, start=1.0) for _ in range(5)]
    assert [s.due_in(p, 0.0) for p in places] == pytest.approx([1.0, 1.25, 1.5, 1.75, 2.0])
    assert s.horizon(0.0) == pytest.approx(2.25)


def test_a_place_is_cost_wide() -> None:
    s = Schedule(10.0)
    first = s.take(2.0, 0.0)
    assert s.due_in(s.take(1.0, 0.0), 0.0) - s.due_in(first, 0.0) == pytest.approx(0.2)


def test_places_follow_h_as_it_changes_in_order() -> None:
    s = Schedule(10.0)
    a, b = s.take(1.0, 0.0, start=1.0), s.take(1.0, 0.0, start=1.0)
    assert (s.due_in(a, 0.0), s.due_in(b, 0.0)) == pytest.approx((1.0, 1.1))
    s.set_rate(20.0, 0.5)  # H doubles half a second in: what was left of each wait halves
    assert (s.due_in(a, 0.5), s.due_in(b, 0.5)) == pytest.approx((0.25, 0.3))
    s.set_rate(5.0, 0.6)  # H falls: both move later, still in order
    assert s.due_in(a, 0.6) == pytest.approx(0.6) and s.due_in(b, 0.6) == pytest.approx(0.8)


def test_an_idle_schedule_starts_again_from_the_head() -> None:
    s = Schedule(10.0)
    s.take(1.0, 0.0)
    later = s.take(1.0, 50.0, start=0.5)
    assert s.due_in(later, 50.0) == pytest.approx(0.5)


def test_release_of_a_place_ahead_shortens_the_queue_behind_it() -> None:
    s = Schedule(1.0)
    places = [s.take(1.0, 0.0, start=1.0) for _ in range(4)]
    assert s.horizon(0.0) == 5.0
    s.release(places[2], 1.0, 0.5)
    assert s.horizon(0.0) == 4.0
    s.release(places[0] - 10, 1.0, 0.5)  # a place the head has passed changes nothing
    assert s.horizon(0.0) == 4.0


def test_a_release_ahead_brings_every_waiting_place_one_place_closer_and_no_two_share_a_place() -> None:
    s = Schedule(1.0)
    places = [s.take(1.0, 0.0, start=1.0) for _ in range(4)]
    before = s.due_in(places[3], 0.5)
    s.release(places[1], 1.0, 0.5)  # the client of the second place got in early, from the bucket's surplus
    assert s.due_in(places[3], 0.5) == pytest.approx(before - 1.0)  # the head skips the hole it leaves
    assert s.take(1.0, 0.5) >= places[3] + 1.0  # a new place goes behind every place still held


def test_jitter_draws_a_place_uniformly_over_the_backlog() -> None:
    s = Schedule(10.0, placement="jitter", uniform=lambda a, b: b)
    last = [s.take(1.0, 0.0, start=1.0) for _ in range(10)][-1]
    assert s.due_in(last, 0.0) == pytest.approx(2.0)  # ten places at 10/s end one second after the start
    fixed = Schedule(100.0, placement="jitter", window=8.0, uniform=lambda a, b: a + (b - a) / 2)
    assert fixed.due_in(fixed.take(1.0, 0.0, start=2.0), 0.0) == pytest.approx(6.0)


def test_the_book_forgets_a_place_after_the_grace() -> None:
    s = Schedule(1.0)
    s.hold("a", (1.0, 1.0, 2.0), 0.0)
    assert s.place_of("a", 2.0 + SLOT_GRACE - 0.1) == (1.0, 1.0, 2.0)
    s.hold("b", (2.0, 1.0, 100.0), 2.0 + SLOT_GRACE + 0.1)  # an insert sweeps the stale entry
    assert s.holders == 1 and s.place_of("a", 0.0) is None


def test_the_book_is_bounded() -> None:
    s = Schedule(1000.0, max_keys=100)
    for i in range(10_000):
        s.hold(f"k{i}", (float(i), 1.0, 10.0), 0.0)
    assert s.holders == 100 and s.evicted == 9_900


def test_bad_configuration_names_the_field() -> None:
    with pytest.raises(ConfigError, match="spread"):
        Schedule(1.0, placement="gaussian")
    with pytest.raises(ConfigError, match="rate"):
        Schedule(0.0)
    with pytest.raises(ConfigError, match="rate"):
        Schedule(1.0).set_rate(math.inf, 0.0)


def test_forecast_with_no_growth_is_the_flat_time() -> None:
    assert forecast(7.5, 0.0) == 7.5
    assert forecast(-1.0, 0.25) == -1.0


def test_forecast_solves_the_growing_integral() -> None:
    # H(t) = H(1+g)^t does the work of 10 s at H by τ with ((1+g)^τ − 1)/ln(1+g) = 10
    tau = forecast(10.0, 0.25)
    assert ((1.25**tau) - 1) / math.log(1.25) == pytest.approx(10.0)
    assert tau == pytest.approx(5.26, abs=0.01)


@settings(max_examples=200, deadline=None)
@given(seconds=st.floats(0, 1e6), growth=st.floats(0, 5))
def test_forecast_is_never_later_than_the_flat_time_and_keeps_order(seconds, growth) -> None:
    tau = forecast(seconds, growth)
    assert 0 <= tau <= seconds + 1e-9
    assert forecast(seconds + 1.0, growth) >= tau


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.01, 2.0), st.floats(0.5, 500.0)), min_size=1, max_size=30))
def test_places_stay_in_order_whatever_h_does(steps) -> None:
    s = Schedule(10.0)
    places = [s.take(1.0, 0.0, start=0.1) for _ in range(20)]
    now = 0.0
    for gap, rate in steps:
        now += gap
        s.set_rate(rate, now)
        dues = [s.due_in(p, now) for p in places]
        assert dues == sorted(dues)
