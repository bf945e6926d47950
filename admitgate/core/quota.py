"""Per-key quotas: N requests per W seconds for each key, on the injected clock (GCRA).

The generic cell rate algorithm keeps one float per key, its *theoretical arrival time* (TAT). Requests
are spaced by the emission interval ``T = W / N``; a key may run ``τ = (burst − 1)·T`` seconds ahead of
that spacing, so a fresh key gets ``burst`` requests at once. A request at ``now`` is allowed when
``TAT − τ ≤ now``, and then moves the TAT to ``max(TAT, now) + T``; otherwise it waits ``TAT − τ − now``.

The bound, exactly: in any interval of L seconds one key is allowed at most ``burst + L / T`` requests.
Over a long run that is N per W. With ``burst = 1`` no window of W seconds ever holds more than N;
with the default ``burst = N`` a full burst followed by the refill can put up to ``2N − 1`` into one W
(a fixed-window limiter, slowapi's default, allows 2N across a boundary the same way).

State is bounded: a key's entry expires when its TAT passes (a key idle that long is as good as new)
and the :class:`~admitgate.core.keystore.BoundedExpiringMap` never holds more than ``max_keys``; a
key evicted by the cap starts afresh.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from .clock import Clock
from .errors import ConfigError, integer, number
from .keystore import BoundedExpiringMap

#: Seconds of float slack in the comparison, so a request exactly on its spacing is not refused by rounding.
EPSILON = 1e-9
#: The longest quota window, seconds (a day would already be unusual for a rate limit).
MAX_WINDOW = 366 * 86_400.0


@dataclass(frozen=True, slots=True)
class QuotaRate:
    """``limit`` requests per ``window`` seconds, ``burst`` of them at once (default: all ``limit``)."""

    limit: int
    window: float
    burst: int | None = None

    def __post_init__(self) -> None:
        integer("limit", self.limit, 1, 10**9)
        number("window", self.window, 0.0, MAX_WINDOW, above=True, unit="seconds")
        if self.burst is not None:
            integer("burst", self.burst, 1, self.limit)

    @property
    def interval(self) -> float:
        """The emission interval T = W / N, seconds."""
        return self.window / self.limit

    @property
    def tolerance(self) -> float:
        """τ = (burst − 1)·T, seconds: how far a key may run ahead of the spacing."""
        return ((self.limit if self.burst is None else self.burst) - 1) * self.interval


class Answer(NamedTuple):
    """A quota's answer for one request. Seconds."""

    wait: float  # 0.0: allowed (and counted); else how long until the key's next request would be allowed
    backlog: float  # allowed: how far the key's spacing now runs ahead of the clock, TAT − now (0 if refused)

    def remaining(self, rate: QuotaRate) -> int:
        """Requests the key may still make at once after this one (allowed answers)."""
        return max(0, math.floor((rate.tolerance - self.backlog) / rate.interval + EPSILON) + 1)


class QuotaLimiter:
    """GCRA per key in this process. ``check(key)`` answers whether the key's request is allowed (and counts
    it) or how long it must wait (not counted), as an :class:`Answer`."""

    __slots__ = ("_clock", "_interval", "_store", "_tolerance", "rate")

    def __init__(self, rate: QuotaRate, clock: Clock, max_keys: int = 100_000) -> None:
        if not isinstance(rate, QuotaRate):
            raise ConfigError("rate", "must be a QuotaRate", rate)
        self.rate = rate
        self._clock = clock
        self._interval = rate.interval
        self._tolerance = rate.tolerance
        self._store: BoundedExpiringMap[float] = BoundedExpiringMap(max_keys)

    def __len__(self) -> int:
        return len(self._store)

    def check(self, key: Hashable) -> Answer:
        """Allowed (wait 0.0, counted) if ``key`` may make a request now, else the wait in seconds (> 0)."""
        now = self._clock()
        tat = self._store.get(key, now)
        tat = now if tat is None or tat < now else tat
        wait = tat - self._tolerance - now
        if wait > EPSILON:
            return Answer(wait, 0.0)
        tat += self._interval
        self._store.put(key, tat, tat, now)  # expires when the TAT passes: the key is fresh again
        return Answer(0.0, tat - now)
