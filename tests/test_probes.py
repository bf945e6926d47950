"""Probes: O(1) bucketed aggregates of in-flight, latency, outcome and shedding."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admitgate.core.errors import ConfigError
from admitgate.core.probes import LATENCY_BOUNDS, Probes


def test_samples_land_in_their_bucket_and_buckets_close_on_time() -> None:
    p = Probes(width=0.1, buckets=5, now=0.0)
    p.admit(0.01)
    p.admit(0.02)
    p.complete(0.05, 200, 0.06)
    p.complete(0.2, 503, 0.07)
    p.limited()
    p.limited()
    assert not p.ring  # nothing closed yet
    p.roll(0.15)
    (b,) = p.ring
    assert (b.end, b.completed, b.drops, b.admitted, b.inflight, b.shed) == (pytest.approx(0.1), 2, 1, 2, 0, 2)
    assert b.latency == pytest.approx(0.25)
    # in flight: 0 until 0.01, 1 until 0.02, 2 until 0.06, 1 until 0.07, then 0 -> area 0.01+0.08+0.01 = 0.1
    assert b.busy == pytest.approx(0.1 / 0.1)


def test_a_gap_closes_empty_buckets_but_never_more_than_the_ring() -> None:
    p = Probes(width=0.1, buckets=5, now=0.0)
    p.admit(0.05)
    p.roll(100.0)
    assert len(p.ring) == 5
    assert all(b.completed == 0 and b.busy == 1.0 for b in p.ring)  # the request is still in flight


def test_cancelled_and_failed_requests_give_no_latency_sample() -> None:
    p = Probes(now=0.0)
    for _ in range(3):
        p.admit(0.0)
    p.cancel(0.01)
    p.fail(0.02)
    p.complete(0.03, 200, 0.03)
    assert (p.inflight, p.total, p.total_errors) == (0, 1, 1)
    assert p.total_latency == pytest.approx(0.03)


def test_histogram_counts_by_bound() -> None:
    p = Probes(now=0.0)
    p.keep_histogram()
    for latency in (0.001, 0.1, 0.1000001, 100.0):
        p.admit(0.0)
        p.complete(latency, 200, 0.0)
    assert sum(p.histogram) == 4
    assert p.histogram[0] == 1
    assert p.histogram[LATENCY_BOUNDS.index(0.1)] == 1  # le=0.1 includes 0.1
    assert p.histogram[-1] == 1  # +Inf


def test_no_histogram_is_kept_until_one_is_asked_for() -> None:
    p = Probes(now=0.0)
    p.admit(0.0)
    p.complete(0.001, 200, 0.0)
    assert p.histogram is None and p.total == 1
    kept = p.keep_histogram()
    p.admit(0.0)
    p.complete(0.001, 200, 0.0)
    assert kept == [1] + [0] * len(LATENCY_BOUNDS) and p.keep_histogram() is kept


@given(st.lists(st.tuples(st.sampled_from(["admit", "complete", "cancel"]), st.floats(0, 0.5)), max_size=60))
def test_inflight_is_never_lost(events) -> None:
    p = Probes(now=0.0)
    t = 0.0
    open_ = 0
    for kind, dt in events:
        t += dt
        if kind == "admit":
            p.admit(t)
            open_ += 1
        elif open_:
            open_ -= 1
            p.complete(0.01, 200, t) if kind == "complete" else p.cancel(t)
    p.roll(t + 1)
    assert p.inflight == open_
    assert all(b.busy >= 0 for b in p.ring)


def test_invalid_configuration_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"probe_buckets"):
        Probes(buckets=1)
    with pytest.raises(ConfigError, match=r"probe_bucket"):
        Probes(width=0)


def test_without_a_bound_there_is_no_inflight_limit() -> None:
    p = Probes(now=0.0)
    p.admit(0.0)
    p.complete(0.01, 503, 0.01)
    p.roll(1.0)
    assert (p.floor, p.limit) == (None, math.inf)


def test_the_inflight_limit_grows_by_one_per_response_served_and_halves_per_drop_to_one() -> None:
    p = Probes(now=0.0)
    p.bound(4)
    assert p.limit == 4.0
    for _ in range(4):
        p.admit(0.0)
    for _ in range(4):
        p.complete(0.01, 200, 0.01)  # four served: room for eight (slow start doubles it each latency)
    assert p.limit == 8.0
    for i, expected in enumerate((4.0, 2.0, 1.0, 1.0)):  # each 5xx halves it, never below one request
        p.admit(0.02)
        p.complete(0.01, 504, 0.03)
        assert p.limit == expected, i
    p.admit(0.04)
    p.complete(0.01, 200, 0.05)  # served again: it grows back from there
    assert p.limit == 2.0


def test_a_share_of_5xx_halves_the_inflight_limit_once_per_latency_while_the_service_serves_between_them() -> None:
    """A service taking 0.1 s per request and asked for 100 at a time (1,000/s), one answer in 20 a 500 (a failing
    route). A 5xx whose request went in before the last halving, with answers served since, is of the same event
    (TCP halves once per window): it does not halve the limit again. (Each 5xx halved it, and the 19 answers between
    two raised it by 19: the service was sent under a third of what it holds, 296 of 1,000/s in the last second.)
    With nothing served between them (a service that answers only errors), each 5xx still halves it: see above."""
    p = Probes(width=0.1, buckets=50, now=0.0)
    p.bound(4)
    due: deque[float] = deque()
    answers = 0
    served = []
    for step in range(5000):  # five seconds in 1 ms steps
        t = step / 1000
        while due and due[0] <= t:
            due.popleft()
            answers += 1
            p.complete(0.1, 500 if answers % 20 == 0 else 200, t)
            served.append(t)
        p.roll(t)
        while p.inflight < min(p.limit, 100):
            p.admit(t)
            due.append(t + 0.1)
    assert sum(1 for t in served if t >= 4.0) >= 950  # the last second: all it was asked for
    assert p.limit >= 100


def test_the_inflight_limit_is_held_within_twice_the_mean_in_flight_while_the_service_served() -> None:
    p = Probes(width=0.1, buckets=50, now=0.0)
    p.bound(4)
    t = 0.0
    for _ in range(200):  # two seconds of steady traffic: 10 in flight, each answered after 0.1 s, 100/s
        for _ in range(10):
            p.admit(t)
        t += 0.1
        for _ in range(10):
            p.complete(0.1, 200, t)
    assert p.limit <= 2 * 10 + 10  # held at twice the in flight as each bucket closed, plus what came since
    p.roll(t + 2.0)  # two idle seconds: nothing served, in flight 0
    assert p.limit == 4.0  # back at the floor: a herd on an idle service starts from it
    p.admit(t + 2.0)
    p.complete(0.1, 503, t + 2.1)
    p.roll(t + 3.0)
    assert p.limit == 2.0  # the ceiling never lifts it: only responses served do


def test_a_slow_service_keeps_its_inflight_limit_between_answers_further_apart_than_the_ceilings_span() -> None:
    """A service that takes 10 s per request, asked once every 2 s: it holds five at once, and answers every 2 s,
    each a 200. Its limit must let the five in. (The ceiling took each second without an answer for an idle spell
    and put the limit back at the floor, four, while five were in flight and being served: one request in five
    was held for room and turned away for as long as the service ran, 12 of 60 over two minutes.)"""
    p = Probes(width=0.1, buckets=50, now=0.0)
    p.bound(4)
    due: deque[float] = deque()
    turned = []
    for step in range(12000):  # two minutes in 10 ms steps
        t = step / 100
        while due and due[0] <= t:
            due.popleft()
            p.complete(10.0, 200, t)
        p.roll(t)
        if step % 200 == 0:  # one request every 2 s
            if p.inflight < p.limit:
                p.admit(t)
                due.append(t + 10.0)
            else:
                turned.append(t)
    assert turned == [8.0]  # the fifth, before the first answer (the floor: slow start)
    assert p.inflight == 5 and p.limit >= 5
    p.admit(120.0)
    p.roll(137.0)  # silent since its last answer (118 s) with six in flight: within twice its latency, it stands
    assert p.limit >= 6
    p.roll(139.0)  # silent for longer than twice the latency of its answers: stalled, back at the floor
    assert p.limit == 4.0


@given(st.lists(st.tuples(st.sampled_from(["admit", "ok", "drop", "cancel"]), st.floats(0, 0.3)), max_size=80),
       st.sampled_from([1, 4, 20]))  # fmt: skip
def test_the_inflight_limit_stays_at_least_one_and_within_its_ceiling_plus_what_was_served_since(events, floor) -> None:
    p = Probes(width=0.1, buckets=20, now=0.0)
    p.bound(floor)
    t, open_, served, closed = 0.0, 0, 0, None
    for kind, dt in events:
        t += dt
        p.roll(t)
        if p.ring and p.ring[-1].end != closed:  # a bucket closed: the ceiling was applied just now
            served, closed = 0, p.ring[-1].end
        if kind == "admit":
            p.admit(t)
            open_ += 1
        elif open_:
            open_ -= 1
            if kind == "cancel":
                p.cancel(t)
            else:
                p.complete(0.05, 200 if kind == "ok" else 503, t)
                served += kind == "ok"
        held = [b.busy for b in list(p.ring)[-10:] if b.completed > b.drops]
        ceiling = max(floor, 2 * sum(held) / len(held) if held else 0.0)
        assert 1.0 <= p.limit <= ceiling + served + 1e-9


def test_an_inflight_floor_below_one_is_refused_naming_the_field() -> None:
    p = Probes(now=0.0)
    for bad in (0.5, -1, math.inf, True, "4"):
        with pytest.raises(ConfigError, match=r"capacity\.inflight_floor"):
            p.bound(bad)  # type: ignore[arg-type]
