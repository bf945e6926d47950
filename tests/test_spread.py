import pytest

from admitgate import ConfigError, JitterSpread, ScheduleSpread
from admitgate.spread import SLOT_GRACE, spread_from_name


def test_schedule_gives_consecutive_slots_at_the_rate() -> None:
    s = ScheduleSpread()
    slots = [s.assign(None, 0.0, rate=4.0, earliest=1.0, cost=1.0) for _ in range(5)]
    assert slots == [1.0, 1.25, 1.5, 1.75, 2.0]
    assert s.horizon(0.0) == pytest.approx(2.25)


def test_schedule_slot_width_follows_cost_and_current_rate() -> None:
    s = ScheduleSpread()
    assert s.assign(None, 0.0, rate=10.0, earliest=0.0, cost=2.0) == 0.0
    assert s.assign(None, 0.0, rate=1.0, earliest=0.0, cost=1.0) == pytest.approx(0.2)
    assert s.assign(None, 0.0, rate=1.0, earliest=0.0, cost=1.0) == pytest.approx(1.2)


def test_schedule_never_starts_before_earliest_and_restarts_after_idle() -> None:
    s = ScheduleSpread()
    s.assign(None, 0.0, 10.0, 0.0, 1.0)
    assert s.assign(None, 50.0, 10.0, 50.5, 1.0) == 50.5


def test_a_holder_gets_its_slot_back_without_extending_the_schedule() -> None:
    s = ScheduleSpread()
    first = s.assign("a", 0.0, 10.0, 1.0, 1.0)
    s.assign("b", 0.0, 10.0, 1.0, 1.0)
    horizon = s.horizon(0.0)
    for t in (0.1, 0.2, 0.5):
        assert s.assign("a", t, 10.0, t, 1.0) == first
    assert s.horizon(0.0) == horizon
    assert s.holders == 2


def test_a_holder_past_its_slot_gets_a_new_one() -> None:
    s = ScheduleSpread()
    s.assign("a", 0.0, 10.0, 1.0, 1.0)
    assert s.slot_of("a", 1.0) is None
    assert s.assign("a", 1.0, 10.0, 1.0, 1.0) == pytest.approx(1.1)


def test_release_of_an_early_holder_pulls_the_horizon_in() -> None:
    s = ScheduleSpread()
    for key in "abcd":
        s.assign(key, 0.0, 1.0, 1.0, 1.0)
    assert s.horizon(0.0) == 5.0
    s.release("c", 0.5)
    assert s.horizon(0.0) == 4.0
    assert s.slot_of("c", 0.5) is None
    s.release("zz", 0.5)  # unknown keys are ignored
    assert s.horizon(0.0) == 4.0


def test_book_forgets_slots_after_the_grace() -> None:
    s = ScheduleSpread()
    s.assign("a", 0.0, 1.0, 1.0, 1.0)
    assert s.holders == 1
    s.assign("b", 1.0 + SLOT_GRACE + 0.1, 1.0, 0.0, 1.0)  # an insert sweeps the stale entry
    assert s.holders == 1


def test_schedule_is_capped_by_max_retry_after() -> None:
    s = ScheduleSpread(max_retry_after=10)
    slots = [s.assign(None, 0.0, 1.0, 0.0, 1.0) for _ in range(20)]
    assert max(slots) == 10.0
    assert s.horizon(0.0) <= 10.0 + 1.0


def test_book_is_bounded() -> None:
    s = ScheduleSpread(max_keys=100)
    for i in range(10_000):
        s.assign(f"k{i}", 0.0, 1000.0, 0.0, 1.0)
    assert s.holders == 100


def test_jitter_with_a_fixed_window_draws_uniformly_from_it() -> None:
    draws = iter([0.0, 0.5, 1.0])
    s = JitterSpread(window=8.0, uniform=lambda a, b: a + (b - a) * next(draws))
    assert [s.assign(None, 0.0, 100.0, 2.0, 1.0) for _ in range(3)] == [2.0, 6.0, 10.0]


def test_jitter_without_a_window_spreads_over_the_backlog_horizon() -> None:
    s = JitterSpread(uniform=lambda a, b: b)
    last = [s.assign(None, 0.0, 10.0, 1.0, 1.0) for _ in range(10)][-1]
    assert last == pytest.approx(2.0)  # ten slots at 10/s end one second after earliest


def test_jitter_reuses_a_holders_slot() -> None:
    s = JitterSpread(window=5.0)
    slot = s.assign("a", 0.0, 1.0, 1.0, 1.0)
    assert s.assign("a", 0.5, 1.0, 1.0, 1.0) == slot


def test_policy_names() -> None:
    assert isinstance(spread_from_name("schedule", 60, 10), ScheduleSpread)
    assert isinstance(spread_from_name("jitter", 60, 10), JitterSpread)
    with pytest.raises(ConfigError, match="spread"):
        spread_from_name("gaussian", 60, 10)
