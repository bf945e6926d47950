import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import ConfigError, Gate, Priority, StaticHeadroom, Verdict
from admitgate.routing import DEFAULT_CLASSES

DEFAULT = DEFAULT_CLASSES["default"]
CRITICAL = DEFAULT_CLASSES["critical"]
SHEDDABLE = DEFAULT_CLASSES["sheddable"]


def test_admit_then_pace_then_reject() -> None:
    g = Gate(10, 2, max_pacing_delay=0.25, now=0.0)
    assert g.try_admit(1, DEFAULT, 0.0) and g.try_admit(1, DEFAULT, 0.0)
    assert not g.try_admit(1, DEFAULT, 0.0)
    d1, d2 = g.decide(1, DEFAULT, None, 0.0), g.decide(1, DEFAULT, None, 0.0)
    assert (d1.verdict, d1.delay) == (Verdict.PACE, pytest.approx(0.1))
    assert (d2.verdict, d2.delay) == (Verdict.PACE, pytest.approx(0.2))
    d3 = g.decide(1, DEFAULT, None, 0.0)
    assert d3.verdict is Verdict.REJECT and d3.retry_after == 1
    assert g.waiters == 2 and g.stats.paced == 2 and g.stats.rejected == 1


def test_waiter_bound() -> None:
    g = Gate(10, 1, max_pacing_delay=5, max_waiters=1, now=0.0)
    g.try_admit(1, DEFAULT, 0.0)
    assert g.decide(1, DEFAULT, None, 0.0).verdict is Verdict.PACE
    assert g.decide(1, DEFAULT, None, 0.0).verdict is Verdict.REJECT
    g.release_waiter()
    assert g.decide(1, DEFAULT, None, 0.0).verdict is Verdict.PACE


def test_abandoned_pacing_refunds_the_token() -> None:
    g = Gate(10, 1, max_pacing_delay=1, now=0.0)
    g.try_admit(1, DEFAULT, 0.0)
    g.decide(1, DEFAULT, None, 0.0)
    g.abandon(1, 0.0)
    assert g.waiters == 0 and g.stats.abandoned == 1
    assert g.pacer.tokens(0.0) == pytest.approx(0.0)
    assert g.decide(1, DEFAULT, None, 0.0).delay == pytest.approx(0.1)  # first in the queue again


def test_retry_after_leads_the_slot_by_up_to_one_second() -> None:
    g = Gate(10, 1, max_pacing_delay=0, now=0.0)
    g.try_admit(1, DEFAULT, 0.0)
    # no pacing: lead 0, so Retry-After = ceil(slot - now)
    slots = [g.decide(1, DEFAULT, None, 0.0) for _ in range(25)]
    assert [d.retry_after for d in slots[:3]] == [1, 1, 1]
    assert slots[-1].slot == pytest.approx(2.5) and slots[-1].retry_after == 3
    g2 = Gate(10, 1, max_pacing_delay=1.5, max_waiters=0, now=0.0)
    g2.try_admit(1, DEFAULT, 0.0)
    d = [g2.decide(1, DEFAULT, None, 0.0) for _ in range(25)][-1]
    assert d.slot == pytest.approx(2.5) and d.retry_after == 2  # told to come back 0.5 s before its slot


def test_a_cohort_rejected_at_once_comes_back_at_no_more_than_h_per_second() -> None:
    rate, m = 180.0, 2000
    g = Gate(rate, 20, max_pacing_delay=1.5, now=0.0)
    verdicts = Counter()
    retry = Counter()
    for _ in range(m):
        if g.try_admit(1, DEFAULT, 0.0):
            verdicts["admit"] += 1
            continue
        d = g.decide(1, DEFAULT, None, 0.0)
        verdicts[d.verdict] += 1
        if d.verdict is Verdict.REJECT:
            retry[d.retry_after] += 1
    assert verdicts["admit"] == 20 and verdicts[Verdict.PACE] == 270  # 1.5 s of tokens held
    assert max(retry.values()) <= rate + 1
    assert all(retry[s] >= rate - 1 for s in range(2, max(retry)))  # a flat stream, no gaps
    assert max(retry) == math.ceil((m - 20) / rate) - 1  # the last slot: window M/H, minus the 1 s lead


def test_critical_traffic_is_charged_first_and_measured_as_lambda_new() -> None:
    g = Gate(100, 10, max_pacing_delay=0, now=0.0)
    for i in range(400):  # 20 critical requests/s for 20 s
        assert g.try_admit(1, CRITICAL, i * 0.05)
    assert g.critical_rate(20.0) == pytest.approx(20.0, rel=0.05)
    assert g.shed_rate(20.0) == pytest.approx(80.0, rel=0.05)
    for _ in range(20):
        g.try_admit(1, CRITICAL, 20.0)
    assert g.pacer.tokens(20.0) == -10.0  # critical drove the bucket to its floor
    assert not g.try_admit(1, DEFAULT, 20.0)


def test_sheddable_class_is_shed_before_default() -> None:
    g = Gate(10, 10, max_pacing_delay=0, now=0.0)
    assert sum(g.try_admit(1, SHEDDABLE, 0.0) for _ in range(10)) == 5  # keeps half the burst
    assert sum(g.try_admit(1, DEFAULT, 0.0) for _ in range(10)) == 5


def test_early_returner_keeps_its_slot_and_the_horizon_stays_put() -> None:
    g = Gate(10, 1, max_pacing_delay=0.5, max_waiters=0, now=0.0)
    g.try_admit(1, DEFAULT, 0.0)
    for _ in range(30):  # others queue up first, so "a" holds a slot beyond the pacing window
        g.decide(1, DEFAULT, None, 0.0)
    first = {k: g.decide(1, DEFAULT, k, 0.0) for k in ("a", "b", "c")}
    horizon = g.spread.horizon(0.0)
    for t in (0.1, 0.2, 0.3, 0.4):  # "a" ignores Retry-After and hammers
        d = g.decide(1, DEFAULT, "a", t)
        assert d.slot == first["a"].slot and d.verdict is Verdict.REJECT and d.early
    assert g.spread.horizon(0.0) == horizon
    assert g.stats.early == 4 and not first["b"].early


def test_headroom_changes_are_pulled_on_the_refresh_cadence() -> None:
    class Ramp:
        def rate(self, now: float) -> float:
            return 10.0 + now

    g = Gate(Ramp(), 5, refresh_interval=0.5, now=0.0)
    g.refresh(0.1)
    assert g.pacer.rate == 10.0
    g.refresh(0.5)
    assert g.pacer.rate == 10.5
    assert isinstance(StaticHeadroom(3), StaticHeadroom)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": -5}, "rate"),
        ({"rate": 10, "burst": 0}, "burst"),
        ({"rate": 10, "max_pacing_delay": -1}, "max_pacing_delay"),
        ({"rate": 10, "max_waiters": -1}, "max_waiters"),
        ({"rate": 10, "spread": "fifo"}, "spread"),
        ({"rate": 10, "spread": object()}, "spread"),
        ({"rate": 10, "max_retry_after": 0.5}, "max_retry_after"),
    ],
)
def test_bad_config_names_the_field(kwargs, field) -> None:
    with pytest.raises(ConfigError) as info:
        Gate(**kwargs)
    assert info.value.field == field


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 5000),
    cap=st.integers(1, 600),
    pace=st.floats(0, 3),
    arrivals=st.lists(st.tuples(st.floats(0, 0.5), st.sampled_from(["a", "b", None]), st.sampled_from([1.0, 2.0])),
                      min_size=1, max_size=200),
)  # fmt: skip
def test_retry_after_is_always_a_positive_integer_within_the_cap(rate, cap, pace, arrivals) -> None:
    g = Gate(rate, 2, max_pacing_delay=pace, max_retry_after=cap, now=0.0)
    now = 0.0
    for gap, key, cost in arrivals:
        now += gap
        if g.try_admit(cost, DEFAULT, now):
            continue
        d = g.decide(cost, DEFAULT, key, now)
        if d.verdict is Verdict.REJECT:
            assert isinstance(d.retry_after, int) and 1 <= d.retry_after <= cap
        elif d.verdict is Verdict.PACE:
            assert 0 <= d.delay <= pace + 1e-9
            g.release_waiter()


def test_priority_is_exported() -> None:
    assert Priority("x").reserve == 0.0


def test_a_standing_pacing_queue_stops_pacing_fresh_arrivals_for_long() -> None:
    gate = Gate(100, 1, max_pacing_delay=1.5, standing_queue=0.3, fresh_pacing_delay=0.1, now=0.0)
    assert gate.try_admit(1, DEFAULT, 0.0)
    for i in range(100):  # about one second of promises, from t = 0
        assert gate.decide(1, DEFAULT, None, i / 1000).verdict is Verdict.PACE
    early = gate.decide(1, DEFAULT, None, 0.2)  # not standing yet: paced up to 1.5 s
    assert early.verdict is Verdict.PACE and early.delay > 0.5
    late = gate.decide(1, DEFAULT, "k", 0.5)  # standing: a fresh arrival would wait > 0.1 s, so it gets a slot
    assert late.verdict is Verdict.REJECT
    back = gate.decide(1, DEFAULT, "k", late.slot - 1.0)  # back a second before its slot: paced in full
    assert back.verdict is Verdict.PACE
