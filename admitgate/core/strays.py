"""Places their clients have not come back for: a client back at its time under another key takes its source's earliest.

A client nothing ties to its request (a :class:`~admitgate.core.decision.Stranger`) that keeps no cookie comes back,
at the time it was told, as a stranger again: nothing finds its place, and it would take another at the tail, so
that the schedule held two places for each such client and everyone behind waited for both. Instead a stranger that
holds no place claims the place of a stranger from its source (see :meth:`Strays.claim`) whose told time has come
and whose client has not come back for it, the earliest told first: whoever it is, one arrival stands for one place
told due, and the number of places stays the number of clients waiting.

A client known by its connection (a :class:`~admitgate.core.decision.ConnectionKey`) does the same among places of
clients known by theirs: told to wait longer than the server keeps an idle connection open (uvicorn: 5 s), it comes
back on a new one, under a new key. Each kind claims only its own kind's places: a request that closes its
connection is a stranger and comes back as one, and a client that comes back on its connection finds its own place
(it is then no longer a stray), so a stranger retrying in a loop does not take the place of a client on its way back.

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

#: Whose places a key's client may claim: its kind's (a stranger's, or a connection's) from its source.
Pool = tuple[type, Hashable | None]


def pool_of(key: Hashable) -> Pool:
    """The places ``key`` may claim, and its own place is claimable in: its kind's from its source."""
    return type(key), getattr(key, "source", None)


class Strays:
    """Places of lapsing keys (:attr:`~admitgate.core.decision.ClientKey.lapses`) not come back for, by
    :func:`pool_of`: at most ``max_keys``. Times in seconds.

    A place is claimable from its told time until the book forgets it (``SLOT_GRACE`` later). Each method is
    O(log n) amortised (stale entries are dropped as they surface, and all of them once they outnumber the live)."""

    __slots__ = ("_entries", "_heaps", "_keys", "_seq", "max_keys")

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._keys: dict[Hashable, tuple[float, Pool]] = {}  # key -> (told, pool), claimable
        self._heaps: dict[Pool, list[tuple[float, int, Hashable]]] = {}  # pool -> (told, order, key)
        self._entries = 0  # heap entries, stale ones included
        self._seq = 0

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Hashable | None, told: float, now: float) -> None:
        """``key`` was told to come back at ``told``: claimable in its :func:`pool_of` if it lapses; None, or a key
        that does not, is kept nowhere (its client comes back under it)."""
        if not getattr(key, "lapses", False):
            return
        if key not in self._keys and len(self._keys) >= self.max_keys:
            self._compact(now)
            if len(self._keys) >= self.max_keys:
                return
        keys = self._keys
        pool = pool_of(key)
        keys[key] = (told, pool)
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(pool, []), (told, self._seq, key))
        self._entries += 1
        if self._entries > 2 * len(keys) + 1024:
            self._compact(now)

    def drop(self, key: Hashable) -> None:
        """``key``'s client came back for its place: nobody else claims it."""
        self._keys.pop(key, None)

    def claim(self, key: Hashable, now: float, place_of: Callable[[Hashable, float], Place | None]
              ) -> Place | None:  # fmt: skip
        """The place ``key``, holding none, takes at ``now``: the earliest told in its :func:`pool_of`, due by now,
        not come back for, that the book (``place_of``) still holds; no longer claimable. None if there is none."""
        pool = pool_of(key)
        while (key := self._next(pool, now)) is not None:
            place = place_of(key, now)
            if place is not None:
                return place
        return None

    def _next(self, pool: Pool, now: float) -> Hashable | None:
        """The key of the earliest place of ``pool`` told due by ``now`` and not forgotten (no longer claimable)."""
        heap = self._heaps.get(pool)
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
            del self._heaps[pool]
        return None

    def _compact(self, now: float) -> None:
        """Every heap rebuilt from the claimable keys, those the book has forgotten left out."""
        keys = {k: v for k, v in self._keys.items() if now <= v[0] + SLOT_GRACE}
        heaps: dict[Pool, list[tuple[float, int, Hashable]]] = {}
        for seq, (key, (told, pool)) in enumerate(keys.items()):
            heaps.setdefault(pool, []).append((told, seq, key))
        for heap in heaps.values():
            heapq.heapify(heap)
        self._keys, self._heaps, self._entries, self._seq = keys, heaps, len(keys), len(keys)
