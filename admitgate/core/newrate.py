"""λ_new: the measured rate of new requests (first attempts), which the retry schedule's H leaves room for."""

from __future__ import annotations

import math
from collections import deque

from .errors import integer


class NewRate:
    """λ_new in requests/s: the median of the last ``seconds`` whole-second counts of new requests.

    A herd's first wave falls within a second or two and moves the median by at most a place or
    two; steady new traffic fills every second. Seconds not seen yet count as 0: under-reading λ_new
    only makes the schedule optimistic, which costs a client a second 429, not capacity.
    """

    __slots__ = ("_counts", "_second", "_seen", "rate")

    def __init__(self, seconds: int = 5, now: float = 0.0) -> None:
        integer("new_window", seconds, 1)
        self._counts: deque[float] = deque([0.0] * seconds, maxlen=seconds)
        self._second = math.floor(now)
        self._seen = 0.0
        self.rate = 0.0

    def update(self, total: float, now: float) -> None:
        """``total``: new requests counted so far (cumulative); ``now``: seconds."""
        second = math.floor(now)
        if second <= self._second:
            return
        gap = min(second - self._second, len(self._counts))
        self._counts.append(total - self._seen)
        self._counts.extend([0.0] * (gap - 1))
        self._second, self._seen = second, total
        self.rate = sorted(self._counts)[len(self._counts) // 2]

    @property
    def span(self) -> int:
        """The window, seconds: a burst of new requests is out of the median at most this long after it ends."""
        return len(self._counts)
