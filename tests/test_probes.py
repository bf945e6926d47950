"""Probes: O(1) bucketed aggregates of in-flight, latency, outcome and shedding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admitgate.core.errors import ConfigError
from admitgate.limit.probes import LATENCY_BOUNDS, Probes


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
    for latency in (0.001, 0.1, 0.1000001, 100.0):
        p.admit(0.0)
        p.complete(latency, 200, 0.0)
    assert sum(p.histogram) == 4
    assert p.histogram[0] == 1
    assert p.histogram[LATENCY_BOUNDS.index(0.1)] == 1  # le=0.1 includes 0.1
    assert p.histogram[-1] == 1  # +Inf


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
