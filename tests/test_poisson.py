import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admitgate.planning.poisson import max_safe_rate, normal_quantile, normal_safe_rate, poisson_cdf, poisson_sf


def direct_cdf(k: int, lam: float) -> float:
    return sum(math.exp(-lam + i * math.log(lam) - math.lgamma(i + 1)) for i in range(k + 1))


@given(st.integers(0, 200), st.floats(0.01, 300))
def test_cdf_matches_the_direct_sum(k: int, lam: float) -> None:
    assert poisson_cdf(k, lam) == pytest.approx(direct_cdf(k, lam), abs=1e-9)
    assert poisson_sf(k, lam) == pytest.approx(1 - direct_cdf(k, lam), abs=1e-9)


def test_hand_computed_values() -> None:
    assert poisson_sf(10, 5.0) == pytest.approx(0.0136953, abs=1e-7)
    assert poisson_cdf(3, 2.0) == pytest.approx(math.exp(-2) * (1 + 2 + 2 + 4 / 3))
    assert poisson_cdf(-1, 3.0) == 0.0 and poisson_sf(5, 0.0) == 0.0


def test_safe_rate_at_h_2000() -> None:
    exact = max_safe_rate(2000, 0.01)
    assert poisson_sf(2000, exact) == pytest.approx(0.01, rel=1e-3)
    assert exact == pytest.approx(1898.41, abs=0.05)
    assert normal_safe_rate(2000, 0.01) == pytest.approx(1899.12, abs=0.05)


def test_normal_quantile() -> None:
    assert normal_quantile(0.99) == pytest.approx(2.3263479, abs=1e-6)
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-12)
    assert normal_quantile(0.001) == pytest.approx(-3.0902323, abs=1e-6)
    with pytest.raises(ValueError):
        normal_quantile(1.0)
