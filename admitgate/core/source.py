"""The rate seam: where the gate's capacity μ comes from (a rate source), read once per refresh.

A :class:`RateSource` gives the gate one :class:`RateReading` each time it refreshes (every
``refresh_interval`` seconds): the rate its pacer refills at and what the schedule and the forecast need beside
it. The gate pushes that rate into its pacer, so a live estimator plugs in here without touching the request
path. Critical traffic is charged against the same bucket and measured by the gate, so the rate reported is what
all gated classes share; sheddable traffic gets H = rate − λ_critical, the exact form of H = μ − λ_new.

* :class:`StaticCapacity`: a configured rate.
* :class:`~admitgate.limit.capacity.LiveCapacity`: a capacity estimator fed by the gate's probes.
* a tenants' pool's share (:class:`~admitgate.core.tenants.share.Share`): its part of its replica's μ.

A :class:`Capacity` that reports a rate alone (``rate(now)``, the public protocol an application implements) is
read through :class:`RateOf`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .errors import number
from .probes import Probes
from .settings import MAX_RATE, MIN_RATE


@dataclass(frozen=True, slots=True)
class RateReading:
    """What a rate source says at one refresh. Rates in requests/s.

    ``rate``: what the pacer refills at from now (finite, > 0). ``capacity``: μ as the source believes it, which
    the schedule is timed by (at least the rate while a drain holds the rate down; None: the rate in force).
    ``growth``: how fast H may rise per second in the forecast behind Retry-After (None: 0). ``collapsed``: an
    outage judged elsewhere (a pool's replica's; None: the gate judges its own). ``whole``: how many times this
    gate's H the H an outage expects back is (a pool's: its replica's with a shared budget; None: 1). ``known``:
    whether the source has measured a capacity (an estimator that opens the gate has none until a queue has stood:
    the schedule's places then wait, and clients are told to ask again in a second). ``latency``: the service's
    own latency as the source has seen it, seconds (None: not measured).
    """

    rate: float
    capacity: float | None = None
    growth: float | None = None
    collapsed: bool | None = None
    whole: float | None = None
    known: bool = True
    latency: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityState:
    """What a live estimator believes now (for metrics and logs). Rates in requests/s, times in seconds."""

    estimator: str
    state: str  # "warming", "low-traffic", or the estimator's own (probing, draining, ...)
    mu: float | None  # capacity estimate
    rate: float  # the rate pushed to the pacer
    background: float  # external background rate subtracted (λ_new beyond the gate's critical traffic)
    baseline: float | None  # baseline latency
    latency: float | None  # mean latency of the last window
    completion_rate: float  # completions per second in the last window
    inflight: int


@runtime_checkable
class RateSource(Protocol):
    """Where a gate reads its rate: :meth:`read` once per refresh, the rest once or at a scrape."""

    #: the probes the gate records into and bounds its in-flight requests by (a live capacity's), or None
    probes: Probes | None

    def read(self, now: float) -> RateReading:
        """The reading at ``now`` (seconds)."""
        ...

    def state(self) -> CapacityState | None:
        """What a live estimator believes now (None: no estimator)."""
        ...


@runtime_checkable
class Capacity(Protocol):
    """A rate source an application writes: the admissible rate in requests/s at ``now`` (finite, > 0)."""

    def rate(self, now: float) -> float: ...


class StaticCapacity:
    """A fixed rate, set in configuration."""

    __slots__ = ("_rate",)
    probes: Probes | None = None

    def __init__(self, rate: float) -> None:
        self._rate = number("rate", rate, MIN_RATE, MAX_RATE, unit="requests/s")

    def rate(self, now: float) -> float:
        return self._rate

    def read(self, now: float) -> RateReading:
        return RateReading(self._rate)

    def state(self) -> None:
        return None

    @property
    def value(self) -> float:
        """The configured rate, requests/s."""
        return self._rate

    def __repr__(self) -> str:
        return f"StaticCapacity({self._rate:g}/s)"


class RateOf:
    """A :class:`Capacity` read as a :class:`RateSource`: its rate, and nothing beside it."""

    __slots__ = ("capacity",)
    probes: Probes | None = None

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity

    def read(self, now: float) -> RateReading:
        return RateReading(self.capacity.rate(now))

    def state(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"RateOf({self.capacity!r})"
