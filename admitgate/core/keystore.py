"""Bounded per-key state: entries expire, and the map never holds more than ``max_keys``.

Every key an attacker can mint (a connection, a header value, a ticket id) ends up
here, so the map is bounded twice over: each entry carries an expiry time, and
inserting beyond ``max_keys`` evicts the oldest insertion. Work per call is O(1)
amortised: each insert also sweeps at most two expired entries from the old end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

from .errors import integer

V = TypeVar("V")


class BoundedExpiringMap(Generic[V]):
    """``key -> (expires_at, value)`` with lazy expiry and an insertion-order size cap."""

    __slots__ = ("_data", "evicted", "max_keys")

    def __init__(self, max_keys: int = 100_000) -> None:
        integer("max_keys", max_keys, 1)
        self.max_keys = max_keys
        self.evicted = 0  #: entries dropped by the size cap (not by expiry)
        self._data: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    @property
    def data(self) -> Mapping[Hashable, tuple[float, V]]:
        """The live mapping ``key -> (expires_at, value)``, expired entries included until dropped. Read-only use:
        its truthiness and size, or a hot path that looks a key up with one C call and checks the expiry itself."""
        return self._data

    def get(self, key: Hashable, now: float) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        if item[0] <= now:
            del self._data[key]
            return None
        return item[1]

    def put(self, key: Hashable, value: V, expires_at: float, now: float) -> None:
        data = self._data
        data[key] = (expires_at, value)
        data.move_to_end(key)
        for _ in range(2):  # amortised sweep of the oldest insertions
            oldest = next(iter(data.values()))
            if oldest[0] > now:
                break
            data.popitem(last=False)
        while len(data) > self.max_keys:
            data.popitem(last=False)
            self.evicted += 1

    def pop(self, key: Hashable, now: float) -> V | None:
        item = self._data.pop(key, None)
        if item is None or item[0] <= now:
            return None
        return item[1]

    def sweep(self, now: float) -> int:
        """Drop the expired entries at the old end (the oldest insertions, up to the first live one); return how
        many entries are left. O(1) amortised per entry dropped: each is dropped once. An entry that expires
        before older ones waits for them (the count may include it until then)."""
        data = self._data
        while data and next(iter(data.values()))[0] <= now:
            data.popitem(last=False)
        return len(data)

    def values(self, now: float) -> list[V]:
        """The live values, oldest insertion first; expired entries are dropped on the way (O(n))."""
        data = self._data
        for key in [key for key, item in data.items() if item[0] <= now]:
            del data[key]
        return [item[1] for item in data.values()]

    def live(self, now: float) -> list[V]:
        """The live values, oldest insertion first, without dropping anything (read-only: safe from a thread
        that only reads, such as a metrics scrape)."""
        return [item[1] for item in list(self._data.values()) if item[0] > now]

    def clear(self) -> None:
        self._data.clear()
