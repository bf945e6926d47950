"""Strangers' places their clients have not come back for: a stranger back at its time takes its source's earliest.

A client nothing ties to its request (a :class:`~admitgate.core.decision.Stranger`) that keeps no cookie comes back,
at the time it was told, as a stranger again: nothing finds its place, and it would take another at the tail, so
that the schedule held two places for each such client and everyone behind waited for both. Instead a stranger that
holds no place claims the place of a stranger from its source (see :meth:`Strays.claim`) whose told time has come
and whose client has not come back for it, the earliest told first: whoever it is, one arrival stands for one place
told due, and the number of places stays the number of clients waiting.

The owner keeps its booking: a client that returns its ticket after its place was claimed still finds it (the
bucket bounds what two clients on one place let in). A client that comes back for its place is no longer a stray
(:meth:`Strays.drop`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

from .schedule import SLOT_GRACE, Place

#: A place counts as told due this long before its told time (float rounding).
TOLD_SLACK = 1e-6


class Strays:
    """Places of strangers not come back for, by source: at most ``max_keys``. Times in seconds.

    A place is claimable from its told time until the book forgets it (``SLOT_GRACE`` later). Each method is
    O(log n) amortised (stale entries are dropped as they surface, and all of them once they outnumber the live)."""

    __slots__ = ("_entries", "_heaps", "_keys", "_seq", "max_keys")

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._keys: dict[Hashable, tuple[float, Hashable | None]] = {}  # key -> (told, source), claimable
        self._heaps: dict[Hashable | None, list[tuple[float, int, Hashable]]] = {}  # source -> (told, order, key)
        self._entries = 0  # heap entries, stale ones included
        self._seq = 0

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Hashable | None, told: float, now: float) -> None:
        """Stranger ``key`` was told to come back at ``told`` (its source is ``key.source``); None: no key, no place
        to take."""
        if key is None:
            return
        if key not in self._keys and len(self._keys) >= self.max_keys:
            self._compact(now)
            if len(self._keys) >= self.max_keys:
                return
        keys = self._keys
        source = getattr(key, "source", None)
        keys[key] = (told, source)
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(source, []), (told, self._seq, key))
        self._entries += 1
        if self._entries > 2 * len(keys) + 1024:
            self._compact(now)

    def drop(self, key: Hashable) -> None:
        """``key``'s client came back for its place: nobody else claims it."""
        self._keys.pop(key, None)

    def claim(self, source: Hashable | None, now: float, place_of: Callable[[Hashable, float], Place | None]
              ) -> Place | None:  # fmt: skip
        """The place a stranger from ``source`` takes at ``now``: the earliest told, due by now, not come back for,
        that the book (``place_of``) still holds; no longer claimable. None if there is none."""
        while (key := self._next(source, now)) is not None:
            place = place_of(key, now)
            if place is not None:
                return place
        return None

    def _next(self, source: Hashable | None, now: float) -> Hashable | None:
        """The key of the earliest place of ``source`` told due by ``now`` and not forgotten (no longer claimable)."""
        heap = self._heaps.get(source)
        keys = self._keys
        while heap:
            told, _, key = heap[0]
            if keys.get(key, (None,))[0] != told:  # come back for, claimed or told again since
                heapq.heappop(heap)
                self._entries -= 1
                continue
            if told > now + TOLD_SLACK:
                return None
            heapq.heappop(heap)
            self._entries -= 1
            del keys[key]
            if now <= told + SLOT_GRACE:  # (beyond it, the book has forgotten the place)
                return key
        if heap is not None:
            del self._heaps[source]
        return None

    def _compact(self, now: float) -> None:
        """Every heap rebuilt from the claimable keys, those the book has forgotten left out."""
        keys = {k: v for k, v in self._keys.items() if now <= v[0] + SLOT_GRACE}
        heaps: dict[Hashable | None, list[tuple[float, int, Hashable]]] = {}
        for seq, (key, (told, source)) in enumerate(keys.items()):
            heaps.setdefault(source, []).append((told, seq, key))
        for heap in heaps.values():
            heapq.heapify(heap)
        self._keys, self._heaps, self._entries, self._seq = keys, heaps, len(keys), len(keys)
