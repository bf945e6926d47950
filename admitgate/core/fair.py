"""Weighted max-min fair shares of a rate (water-filling).

Tenants asking for more than a rate allows are each given no less than their weighted share of it, and
what one leaves unused goes to the others: sort by demand per unit of weight, give each ``min(demand,
remaining × weight / remaining weights)``, and carry what a modest tenant leaves to the rest. Exact (not
Doorman's two-round approximation), O(n log n) in the tenants asking, run on a cadence, never per request.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def fair_shares(rate: float, demands: Mapping[K, float], weights: Mapping[K, float]) -> dict[K, float]:
    """Each tenant's weighted max-min fair share of ``rate`` (requests/s), given its ``demands`` (requests/s).

    Every tenant gets ``min(demand, its weighted share of what is left)``; the shares never sum to more than
    ``rate`` and, when demand exceeds it, sum to exactly ``rate`` (work-conserving). A tenant missing from
    ``weights`` weighs 1.
    """
    left = rate
    out: dict[K, float] = {}
    order = sorted(demands, key=lambda t: demands[t] / weights.get(t, 1.0))
    weight_left = sum(weights.get(t, 1.0) for t in order)
    for tenant in order:
        weight = weights.get(tenant, 1.0)
        share = min(demands[tenant], left * weight / weight_left) if weight_left > 0 else 0.0
        out[tenant] = share
        left -= share
        weight_left -= weight
    return out
