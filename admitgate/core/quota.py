"""Per-key quotas: N requests per W seconds for each key, on the injected clock (GCRA).

The generic cell rate algorithm keeps one float per key, its *theoretical arrival time* (TAT). Requests
are spaced by the emission interval ``T = W / N``; a key may run ``τ = (burst − 1)·T`` seconds ahead of
that spacing, so a fresh key gets ``burst`` requests at once. A request at ``now`` is allowed when
``TAT − τ ≤ now``, and then moves the TAT to ``max(TAT, now) + T``; otherwise it waits ``TAT − τ − now``.

The bound, exactly: in any interval of L seconds one key is allowed at most ``burst + L / T`` requests.
Over a long run that is N per W. With ``burst = 1`` no window of W seconds ever holds more than N;
with the default ``burst = N`` a full burst followed by the refill can put up to ``2N − 1`` into one W
(a fixed-window limiter, slowapi's default, allows 2N across a boundary the same way).

A quota may have several windows (``"5/minute;100/day"``): one GCRA per window, and a request is allowed only
if every window allows it; then, and only then, it is counted in each (:func:`check_cells`, which also takes the
windows of several quotas at once). A refused request counts nowhere.

A refusal's wait is spread (:func:`spread`): keys refused at the same moment would all be told the same
wait and come back together; each is told its wait plus a fraction of the window's interval T fixed by a
digest of its key, so a cohort of keys returns spread evenly over T, and each finds its next request there.

State is bounded: a key's entry expires when its TAT passes (a key idle that long is as good as new)
and the :class:`~admitgate.core.keystore.BoundedExpiringMap` never holds more than ``max_keys``; a
key evicted by the cap starts afresh.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Sequence
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

    def window(self, rate: QuotaRate) -> int:
        """The effective window of an allowed answer, whole seconds (at least 1): the time within which the key
        can make no more than :meth:`remaining` requests, until the next one comes back (at most one interval).

        Its ``RateLimit`` ``t`` (draft-ietf-httpapi-ratelimit-headers-11 §4.1.2). Rounded up, since a longer
        window only makes a client that keeps to it send less."""
        due = self.backlog + self.remaining(rate) * rate.interval - rate.tolerance
        return max(1, math.ceil(due - EPSILON))


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
        wait = self.wait(key, now)
        if wait > EPSILON:
            return Answer(wait, 0.0)
        return Answer(0.0, self.take(key, now))

    def wait(self, key: Hashable, now: float) -> float:
        """Seconds until ``key`` may make a request (<= 0: now); nothing is counted."""
        tat = self._store.get(key, now)
        return (now if tat is None or tat < now else tat) - self._tolerance - now

    def take(self, key: Hashable, now: float) -> float:
        """Count a request of ``key`` at ``now``; return its backlog, TAT − now, seconds."""
        tat = self._store.get(key, now)
        tat = (now if tat is None or tat < now else tat) + self._interval
        self._store.put(key, tat, tat, now)  # expires when the TAT passes: the key is fresh again
        return tat - now


class Tally(NamedTuple):
    """The answer of several windows (of one quota or several) for one request. Seconds."""

    wait: float  # 0.0: allowed by every window (and counted in each); else the longest wait
    refused: int  # the index of the window that waits longest (-1: allowed)
    backlogs: tuple[float, ...]  # allowed: each window's TAT − now, in order (empty if refused)


def check_cells(cells: Sequence[tuple[QuotaLimiter, Hashable]], now: float) -> Tally:
    """Allowed by every window of ``cells`` (a limiter and the key it counts): counted in each; else the longest
    wait and the window that has it, counted in none (a refused request must not use up the other windows)."""
    worst, refused = EPSILON, -1
    for i, (limiter, key) in enumerate(cells):
        wait = limiter.wait(key, now)
        if wait > worst:
            worst, refused = wait, i
    if refused >= 0:
        return Tally(worst, refused, ())
    return Tally(0.0, -1, tuple(limiter.take(key, now) for limiter, key in cells))


def digest(key: Hashable) -> bytes:
    """A stable digest of ``key`` (the same in every process and replica: never Python's salted ``hash``)."""
    return hashlib.blake2b(repr(key).encode("utf-8", "backslashreplace"), digest_size=16).digest()


def spread(wait: float, rate: QuotaRate, key_digest: bytes) -> float:
    """A refused key's wait, spread: ``wait`` plus a fraction of the interval T fixed by ``key_digest``.

    Keys refused together come back evenly over one interval instead of in one instant, and each still finds
    its next request (one is earned every T). The fraction is the key's, so a key that asks again before its
    time is told the same moment again."""
    fraction = int.from_bytes(key_digest[:8], "big") / 2.0**64
    return wait + fraction * rate.interval
