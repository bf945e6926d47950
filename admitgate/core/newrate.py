"""λ_new: the measured rate of new requests (first attempts), which the retry schedule's H leaves room for."""

from __future__ import annotations

import math
from collections import deque

from .errors import integer

#: Returns told are kept per 1/TICKS s: a count leaves out those told up to the moment it ends.
TICKS = 100
#: Most ticks with returns told that are kept (beyond, a return told is not left out: λ_new reads high, as it
#: would without the rule, which costs new arrivals room, never a client its place).
MAX_TICKS = 65_536


class NewRate:
    """λ_new in requests/s: the median of the last ``seconds`` whole-second counts of new requests.

    A herd's first wave falls within a second or two and moves the median by at most a place or
    two; steady new traffic fills every second. Seconds not seen yet count as 0: under-reading λ_new
    only makes the schedule optimistic, which costs a client a second 429, not capacity.

    A client that nothing tied to its request (no key: a :class:`~admitgate.core.decision.Stranger`, or None)
    comes back, if it keeps no cookie, as a new request at the time it was told, which no rule can tell from a
    new arrival; so each second's count leaves out the rejections of such clients told to come back in that
    second that no recognised client claimed (:meth:`told`, :meth:`claimed`), which is none when their tickets
    come back, every unrecognised return when they do not, and never more than the rate places are told at, H.
    """

    __slots__ = ("_counts", "_last", "_second", "_seen", "_told", "rate")

    def __init__(self, seconds: int = 5, now: float = 0.0) -> None:
        integer("new_window", seconds, 1)
        self._counts: deque[float] = deque([0.0] * seconds, maxlen=seconds)
        self._second = math.floor(now)
        self._last = math.floor(now * TICKS)  # the tick the last count ended at
        self._seen = 0.0
        self._told: dict[int, int] = {}  # tick -> rejections told to come back in it, not yet claimed
        self.rate = 0.0

    def told(self, at: float) -> None:
        """A rejected client nothing ties was told to come back at ``at`` (seconds)."""
        tick, told = math.floor(at * TICKS), self._told
        if tick in told:
            told[tick] += 1
        elif len(told) < MAX_TICKS:
            told[tick] = 1

    def claimed(self, at: float) -> None:
        """A client told to come back at ``at`` (seconds) came back and was recognised (a no-op unless it was
        :meth:`told`: a client with a key was never counted)."""
        tick = math.floor(at * TICKS)
        left = self._told.get(tick)
        if left is not None:
            if left > 1:
                self._told[tick] = left - 1
            else:
                del self._told[tick]

    def _unclaimed(self, until: int) -> int:
        """Returns told before tick ``until`` that nobody claimed (forgotten once counted)."""
        told = self._told
        if until - self._last <= len(told):
            return sum(told.pop(t, 0) for t in range(self._last, until))
        past = [t for t in told if t < until]
        return sum(told.pop(t) for t in past)

    def update(self, total: float, now: float) -> None:
        """``total``: new requests counted so far (cumulative); ``now``: seconds. A count ends at the first
        update in a new whole second, and leaves out the returns told up to that moment (not to the second's
        end: the update comes up to a refresh interval late, and a herd's returns crowd the start of a second)."""
        second = math.floor(now)
        if second <= self._second:
            return
        gap = min(second - self._second, len(self._counts))
        tick = math.floor(now * TICKS)
        self._counts.append(max(0.0, total - self._seen - self._unclaimed(tick)))
        self._counts.extend([0.0] * (gap - 1))
        self._second, self._seen, self._last = second, total, tick
        self.rate = sorted(self._counts)[len(self._counts) // 2]

    @property
    def span(self) -> int:
        """The window, seconds: a burst of new requests is out of the median at most this long after it ends."""
        return len(self._counts)
