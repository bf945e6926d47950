"""Poisson tail probabilities without SciPy.

``poisson_sf(k, lam)`` = P(X > k) for X ~ Poisson(lam), via the regularised incomplete
gamma function: P(X <= k) = Q(k + 1, lam). The series / continued-fraction split is the
classic one (converges in O(sqrt(k)) terms near the mean), evaluated in log space so
k in the millions is fine.
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 1_000_000


def _gamma_p_series(a: float, x: float) -> float:
    """Regularised lower incomplete gamma P(a, x) by its series (good for x < a + 1)."""
    term = total = 1.0 / a
    ap = a
    for _ in range(_MAX_ITER):
        ap += 1.0
        term *= x / ap
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_fraction(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) by Lentz's continued fraction (x >= a + 1)."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def _tails(k: int, lam: float) -> tuple[float, float]:
    """(P(X <= k), P(X > k)), each computed directly where it is small, so neither loses precision."""
    a = k + 1.0
    if lam < a + 1.0:
        upper = _gamma_p_series(a, lam)  # P(a, λ) = P(X > k)
        return 1.0 - upper, upper
    lower = _gamma_q_fraction(a, lam)  # Q(a, λ) = P(X <= k)
    return lower, 1.0 - lower


def poisson_cdf(k: int, lam: float) -> float:
    """P(X <= k) for X ~ Poisson(lam)."""
    if k < 0:
        return 0.0
    return 1.0 if lam <= 0 else _tails(k, lam)[0]


def poisson_sf(k: int, lam: float) -> float:
    """P(X > k) for X ~ Poisson(lam)."""
    if k < 0:
        return 1.0
    return 0.0 if lam <= 0 else _tails(k, lam)[1]


def max_safe_rate(h: float, eps: float) -> float:
    """Largest mean λ with P(Poisson(λ) > h) <= eps (arrivals per second vs a headroom of h/s)."""
    k = math.floor(h)
    lo, hi = 0.0, max(1.0, float(h))
    if poisson_sf(k, hi) <= eps:
        return hi
    for _ in range(100):
        mid = (lo + hi) / 2
        if poisson_sf(k, mid) <= eps:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return lo


def normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |rel. error| < 1.2e-9)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)  # fmt: skip
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)  # fmt: skip
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)  # fmt: skip
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    low = 0.02425
    if p < low:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    if p > 1 - low:
        return -normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * q
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )


def normal_safe_rate(h: float, eps: float) -> float:
    """The manual's normal approximation: λ_ε = ((−z + sqrt(z² + 4(h + 0.5))) / 2)², z = Φ⁻¹(1 − ε)."""
    z = normal_quantile(1 - eps)
    return ((-z + math.sqrt(z * z + 4 * (h + 0.5))) / 2) ** 2
