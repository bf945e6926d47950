import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import ConfigError
from admitgate.core.pacer import TokenPacer


def test_starts_full_and_takes_exactly() -> None:
    p = TokenPacer(rate=10, burst=3, now=0.0)
    assert [p.try_take(1, 0.0) for _ in range(4)] == [True, True, True, False]
    assert p.tokens(0.0) == 0.0
    assert p.tokens(0.05) == pytest.approx(0.5)
    assert not p.try_take(1, 0.05)
    assert p.try_take(1, 0.1)


def test_a_stale_now_is_made_good_by_the_next_call() -> None:
    """try_take with a ``now`` earlier than the last refills negatively; the next call restores the bucket."""
    p = TokenPacer(rate=10, burst=100, now=0.0)
    assert p.try_take(100, 0.0)
    assert p.try_take(1, 2.0)  # 20 refilled, 19 left
    assert p.try_take(1, 1.5)  # as of 1.5: 19 - 5 - 1 = 13
    assert p.tokens(1.5) == pytest.approx(13.0)
    assert p.tokens(3.0) == pytest.approx(28.0)  # 30 refilled by 3.0, 2 taken: as if in order
    assert not p.try_take(14, 1.5)  # 28 as of 3.0 is 13 as of 1.5


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.5, 500),
    burst=st.floats(1, 50),
    steps=st.lists(st.tuples(st.floats(0, 0.2), st.floats(0, 0.5), st.sampled_from([1.0, 2.0, 0.5])), max_size=200),
)
def test_stale_times_never_admit_more_than_rate_times_t_plus_burst(rate, burst, steps) -> None:
    """Calls whose ``now`` lags the latest (requests decided out of order) never add tokens: the cost taken by
    the latest time T is at most rate*T + burst."""
    p = TokenPacer(rate, burst, now=0.0)
    latest, taken = 0.0, 0.0
    for gap, lag, cost in steps:
        latest += gap
        if p.try_take(cost, max(0.0, latest - lag)):
            taken += cost
        assert taken <= rate * latest + burst + 1e-6
    assert p.tokens(latest) <= burst + 1e-9


def test_refill_is_capped_at_burst() -> None:
    p = TokenPacer(rate=100, burst=5, now=0.0)
    p.try_take(5, 0.0)
    assert p.tokens(10.0) == 5.0


def test_rate_change_keeps_tokens_accrued_at_old_rate() -> None:
    p = TokenPacer(rate=10, burst=100, now=0.0)
    p.try_take(100, 0.0)
    p.set_rate(100, now=1.0)  # 10 tokens accrued at the old rate
    assert p.tokens(1.0) == pytest.approx(10.0)
    assert p.tokens(1.5) == pytest.approx(60.0)  # then 50 more at the new rate


def test_wait_time_says_when_the_next_token_exists() -> None:
    p = TokenPacer(rate=4, burst=2, now=0.0)
    p.try_take(2, 0.0)
    assert p.wait_time(1, 0.0) == pytest.approx(0.25)
    assert p.wait_time(2, 0.0) == pytest.approx(0.5)
    assert p.wait_time(1, 0.0, keep=1) == pytest.approx(0.5)
    assert p.wait_time(1, 1.0) == 0.0


def wait(p: TokenPacer, cost: float, now: float, max_wait: float, keep: float = 0.0) -> float | None:
    place = p.reserve(cost, now, max_wait, keep)
    return None if place is None else max(0.0, p.due_in(place, now))


def test_reserve_queues_later_callers_behind_earlier_ones() -> None:
    p = TokenPacer(rate=10, burst=1, now=0.0, max_debt=5)
    assert wait(p, 1, 0.0, max_wait=1.0) == 0.0
    assert wait(p, 1, 0.0, max_wait=1.0) == pytest.approx(0.1)
    assert wait(p, 1, 0.0, max_wait=1.0) == pytest.approx(0.2)
    assert p.reserve(1, 0.0, max_wait=0.25) is None  # would wait 0.3 s
    assert p.tokens(0.0) == pytest.approx(-2.0)


def test_a_reservation_comes_due_sooner_when_the_rate_rises_and_later_when_it_falls() -> None:
    p = TokenPacer(rate=10, burst=1, now=0.0, max_debt=5)
    p.try_take(1, 0.0)
    a, b = p.reserve(1, 0.0, 1.0), p.reserve(1, 0.0, 1.0)
    assert a is not None and b is not None
    p.set_rate(20, 0.05)  # a was due at 0.1 s, b at 0.2 s: what is left of each halves
    assert (p.due_in(a, 0.05), p.due_in(b, 0.05)) == pytest.approx((0.025, 0.075))
    p.set_rate(15, 0.06)  # a shallow cut keeps the epoch: the places stand, and come due later
    assert p.epoch == 0 and p.due_in(b, 0.06) == pytest.approx((2.0 - 0.7) / 15)  # refilled by 0.06 s: 0.5 + 0.2


def test_a_deep_cut_starts_an_epoch_and_forgives_the_debt_of_the_old_one() -> None:
    p = TokenPacer(100, 10, now=0.0, max_debt=150)
    for _ in range(60):  # 10 from the bucket, then 50 reserved ahead: half a second of promises at 100/s
        assert p.reserve(1, 0.0, 1.5) is not None
    assert p.tokens(0.0) == pytest.approx(-50)
    p.set_rate(60, 0.0)  # not below half the highest rate: same epoch, the debt stands
    assert p.epoch == 0 and p.tokens(0.0) == pytest.approx(-50)
    p.set_rate(40, 0.0)  # below half: a new epoch; the held requests will reserve again
    assert p.epoch == 1 and p.tokens(0.0) == 0.0
    p.set_rate(100, 1.0)
    p.set_rate(60, 1.0)  # half of the highest rate since the epoch began (100), not of 40
    assert p.epoch == 1
    p.set_rate(49, 1.0)
    assert p.epoch == 2


def test_reserve_respects_the_debt_floor() -> None:
    p = TokenPacer(rate=10, burst=1, now=0.0, max_debt=1)
    assert wait(p, 1, 0.0, max_wait=10) == 0.0
    assert p.reserve(1, 0.0, max_wait=10) is not None
    assert p.reserve(1, 0.0, max_wait=10) is None


def test_refund_and_charge() -> None:
    p = TokenPacer(rate=10, burst=2, now=0.0, max_debt=3)
    first = p.reserve(2, 0.0, 1.0)
    newest = p.reserve(2, 0.0, 1.0)
    assert first is not None and newest is not None
    assert not p.refund(2, 0.0, first) and p.tokens(0.0) == -2.0  # a reservation stands behind it: not given
    assert p.refund(2, 0.0, newest) and p.tokens(0.0) == 0.0
    again = p.reserve(2, 0.0, 1.0)
    assert again == newest  # the place given back is the next one reserved
    p.set_burst(1, 0.3)  # (refilled to 1 by 0.3)
    assert again is not None and p.refund(2, 0.3, again) and p.tokens(0.3) == 1.0  # never above burst
    for _ in range(10):
        p.charge(1, 0.0)
    assert p.tokens(0.0) == -3.0  # never below the floor


@pytest.mark.parametrize(("field", "kwargs"), [("rate", {"rate": 0, "burst": 1}), ("rate", {"rate": -1, "burst": 1}),
                                               ("burst", {"rate": 1, "burst": 0}), ("rate", {"rate": "x", "burst": 1}),
                                               ("rate", {"rate": math.inf, "burst": 1})])  # fmt: skip
def test_bad_config_names_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        TokenPacer(**kwargs)
    assert info.value.field == field


def test_set_rate_rejects_non_positive() -> None:
    p = TokenPacer(rate=1, burst=1)
    with pytest.raises(ConfigError, match="rate"):
        p.set_rate(0, 1.0)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.5, 500),
    burst=st.floats(1, 50),
    gaps=st.lists(st.floats(0, 0.2), min_size=1, max_size=300),
    costs=st.lists(st.sampled_from([1.0, 1.0, 2.0, 0.5]), min_size=1, max_size=300),
    pace=st.floats(0, 2),
)
def test_admitted_never_exceeds_rate_times_t_plus_burst(rate, burst, gaps, costs, pace) -> None:
    """Over any interval [a, b] the cost admitted (paced ones at their release time) is <= rate*(b-a) + burst."""
    p = TokenPacer(rate, burst, now=0.0, max_debt=rate * pace + burst)
    now, admitted = 0.0, []
    for gap, cost in zip(gaps, costs, strict=False):
        now += gap
        if cost > burst:
            continue
        delay = wait(p, cost, now, max_wait=pace)
        if delay is not None:
            admitted.append((now + delay, cost))
    admitted.sort()
    times = [t for t, _ in admitted]
    for i in range(len(admitted)):
        total = 0.0
        for j in range(i, len(admitted)):
            total += admitted[j][1]
            assert total <= rate * (times[j] - times[i]) + burst + 1e-6


def test_give_adds_tokens_up_to_the_bucket_and_pays_a_debt_first() -> None:
    pacer = TokenPacer(10.0, 5.0)
    pacer.cap(0.0, 0.0)
    pacer.give(0.5, 0.0)
    assert pacer.tokens(0.0) == 0.5 and pacer.tokens(0.05) == 1.0  # (and refills from there)
    pacer.give(10.0, 0.05)
    assert pacer.tokens(0.05) == 5.0  # never beyond the burst
    assert pacer.reserve(7.0, 0.05, 1.0) is not None and pacer.tokens(0.05) == -2.0
    pacer.give(1.0, 0.05)
    assert pacer.tokens(0.05) == -1.0


def test_cap_leaves_at_most_so_many_tokens_and_keeps_a_debt() -> None:
    pacer = TokenPacer(10.0, 5.0)
    pacer.cap(2.0, 0.0)
    assert pacer.tokens(0.0) == 2.0 and pacer.tokens(0.1) == 3.0
    assert pacer.reserve(5.0, 0.1, 1.0) is not None and pacer.tokens(0.1) == -2.0
    pacer.cap(1.0, 0.1)
    assert pacer.tokens(0.1) == -2.0


def test_a_released_place_is_taken_by_the_next_reservation_of_its_cost() -> None:
    """A reservation given up behind the newest: its place goes to the next reservation of the same cost (sooner
    than a place behind the newest), and the bucket's debt stays as it was: its token is charged once, used once."""
    p = TokenPacer(rate=10, burst=1, now=0.0, max_debt=10)
    places = [p.reserve(1, 0.0, 1.0) for _ in range(5)]  # due at 0, 0.1, 0.2, 0.3, 0.4 s
    assert None not in places
    p.release(1, 0.05, places[2])  # (not the newest: no refund)
    assert p.tokens(0.05) == pytest.approx(-4.0 + 0.5)
    assert p.reserve(2, 0.05, 1.0) == pytest.approx(places[4] + 2)  # another cost: behind the newest
    assert p.reserve(1, 0.05, 1.0) == places[2]  # its place, due in 0.15 s
    assert p.tokens(0.05) == pytest.approx(-6.0 + 0.5)  # (the cost-2 reservation's debt alone)
    assert p.reserve(1, 0.05, 1.0) == pytest.approx(places[4] + 3)  # taken once


def test_a_released_place_is_not_taken_once_due_nor_by_a_wait_too_long_nor_after_a_deep_cut() -> None:
    p = TokenPacer(rate=10, burst=1, now=0.0, max_debt=10)
    places = [p.reserve(1, 0.0, 1.0) for _ in range(6)]
    assert None not in places
    p.release(1, 0.0, places[1])  # due at 0.1 s
    p.release(1, 0.0, places[4])  # due at 0.4 s
    assert p.reserve(1, 0.2, 1.0) == places[4]  # the one at 0.1 s came and went unused: dropped
    p.release(1, 0.2, places[3])  # due at 0.3 s
    assert p.reserve(1, 0.2, 0.05) is None  # due in 0.1 s: too long a wait for this one
    p.set_rate(4.0, 0.2)  # a deep cut: a new epoch, whose reservations start afresh (the debt forgiven)
    assert p.reserve(1, 0.2, 10.0) is not None and p.tokens(0.2) == pytest.approx(-1.0)  # charged: not the old place


def test_the_newest_released_is_refunded() -> None:
    p = TokenPacer(rate=10, burst=1, now=0.0, max_debt=10)
    p.reserve(1, 0.0, 1.0)
    newest = p.reserve(1, 0.0, 1.0)
    assert newest is not None
    p.release(1, 0.0, newest)
    assert p.tokens(0.0) == pytest.approx(0.0)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.5, 500),
    burst=st.floats(1, 50),
    steps=st.lists(st.tuples(st.floats(0, 0.2), st.sampled_from([1.0, 1.0, 2.0]), st.booleans()), min_size=1,
                   max_size=300),
    pace=st.floats(0, 2),
)  # fmt: skip
def test_with_places_released_and_taken_again_admitted_never_exceeds_rate_times_t_plus_burst(
    rate: float, burst: float, steps: list[tuple[float, float, bool]], pace: float
) -> None:
    """Reservations given up at random (each at a random time before its place): what is admitted, the places
    taken again included, stays within rate·(b − a) + burst over any interval."""
    p = TokenPacer(rate, burst, now=0.0, max_debt=rate * pace + burst)
    now, admitted, held = 0.0, [], []  # held: (place, cost, time due)
    for gap, cost, give_up in steps:
        now += gap
        for item in [h for h in held if h[2] <= now]:
            held.remove(item)
            admitted.append((item[2], item[1]))
        if give_up and held:
            place, size, _ = held.pop(len(held) // 2)
            p.release(size, now, place)
        if cost > burst:
            continue
        place = p.reserve(cost, now, pace)
        if place is not None:
            held.append((place, cost, now + max(0.0, p.due_in(place, now))))
    admitted += [(due, size) for _, size, due in held]
    admitted.sort()
    for i in range(len(admitted)):
        total = 0.0
        for j in range(i, len(admitted)):
            total += admitted[j][1]
            assert total <= rate * (admitted[j][0] - admitted[i][0]) + burst + 1e-6
