"""The headroom seam: where the pacer's refill rate comes from.

A :class:`Headroom` reports the rate (requests/s) the gate may admit for gated
traffic at a given time. The gate polls it on a cadence (``refresh_interval``) and
pushes changes into the pacer, so a live estimator plugs in here without touching
the request path. Critical traffic is charged against the same bucket, so the rate
reported here is the capacity μ the gated classes share; what sheddable traffic
gets is μ − λ_new, measured by the gate.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .errors import positive


@runtime_checkable
class Headroom(Protocol):
    def rate(self, now: float) -> float:
        """Admissible rate in requests/s at ``now`` (finite, > 0)."""
        ...


class StaticHeadroom:
    """A fixed rate, set in configuration."""

    __slots__ = ("_rate",)

    def __init__(self, rate: float) -> None:
        self._rate = positive("rate", rate)

    def rate(self, now: float) -> float:
        return self._rate

    def __repr__(self) -> str:
        return f"StaticHeadroom({self._rate:g}/s)"
