"""Weighted max-min fair shares, pinned by hand and by their invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate.core.fair import fair_shares


def test_equal_tenants_asking_for_more_split_evenly() -> None:
    assert fair_shares(300, {"a": 500, "b": 500, "c": 500}, {}) == pytest.approx({"a": 100, "b": 100, "c": 100})


def test_what_a_modest_tenant_leaves_goes_to_the_others() -> None:
    # a asks for 20 of its 100: b and c share the other 280
    assert fair_shares(300, {"a": 20, "b": 500, "c": 500}, {}) == pytest.approx({"a": 20, "b": 140, "c": 140})


def test_weights_divide_the_rate_in_proportion() -> None:
    shares = fair_shares(500, {"premium": 1e6, "x": 1e6, "y": 1e6}, {"premium": 3})
    assert shares == pytest.approx({"premium": 300, "x": 100, "y": 100})


def test_a_lone_tenant_gets_all_of_it_and_nobody_gets_more_than_asked() -> None:
    assert fair_shares(200, {"a": 1e9}, {}) == pytest.approx({"a": 200})
    assert fair_shares(200, {"a": 50, "b": 60}, {}) == pytest.approx({"a": 50, "b": 60})


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0, 1e6),
    demands=st.dictionaries(st.text(min_size=1, max_size=3), st.floats(0, 1e6), max_size=12),
    weights=st.dictionaries(st.text(min_size=1, max_size=3), st.floats(0.01, 100), max_size=12),
)
def test_shares_are_max_min_fair(rate, demands, weights) -> None:
    shares = fair_shares(rate, demands, weights)
    total = sum(shares.values())
    assert total <= rate * (1 + 1e-9) + 1e-6  # never more than the rate
    assert all(0 <= shares[t] <= demands[t] * (1 + 1e-9) + 1e-9 for t in demands)  # never more than asked
    if sum(demands.values()) >= rate:
        assert total == pytest.approx(rate, rel=1e-6, abs=1e-6)  # work-conserving under overload
    total_weight = sum(weights.get(t, 1.0) for t in demands)
    for t in demands:  # no tenant below its floor: min(demand, weighted share of the rate)
        floor = min(demands[t], rate * weights.get(t, 1.0) / total_weight)
        assert shares[t] >= floor * (1 - 1e-9) - 1e-6
