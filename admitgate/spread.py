"""Spreading policies: how a rejected request's Retry-After is chosen.

A rejected cohort of M requests must come back over at least W = M/H seconds at no
more than H per second (H: the headroom the pacer refills at). A policy turns each
rejection into a *slot*, an absolute time (seconds on the gate's clock) at which
that client is expected back; the gate turns the slot into an integer Retry-After.

Both policies keep a book of slots by client key. A client that already holds a
future slot gets the same slot back (it does not push the schedule further out),
and a holder that is admitted early frees its slot, pulling the horizon in, so the
horizon tracks the real number of waiting clients rather than the number of tries.
Requests with no recognisable key (``key is None``) always take a new slot.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sized
from typing import Protocol, runtime_checkable

from .errors import ConfigError, positive
from .keystore import BoundedExpiringMap

#: A slot is forgotten this long after its time has passed (seconds): long enough
#: for a client that slept exactly Retry-After to be recognised on its return.
SLOT_GRACE = 5.0


@runtime_checkable
class SpreadPolicy(Protocol):
    """Chooses when rejected clients come back."""

    def assign(self, key: Hashable | None, now: float, rate: float, earliest: float, cost: float) -> float:
        """Return the slot (absolute seconds, >= ``earliest``) for a request rejected at ``now``.

        ``rate``: requests/s the cohort may come back at (the headroom); ``cost``: tokens
        this request takes. A key holding a future slot gets that slot again.
        """
        ...

    def slot_of(self, key: Hashable, now: float) -> float | None:
        """The future slot ``key`` holds, or None."""
        ...

    def release(self, key: Hashable, now: float) -> None:
        """``key`` was admitted: free its slot, if it holds one."""
        ...

    def horizon(self, now: float) -> float:
        """Seconds from ``now`` to the end of the promised schedule (0.0 when empty)."""
        ...

    @property
    def holders(self) -> int:
        """Number of keys holding slots."""
        ...

    @property
    def book(self) -> Sized:
        """The keys holding slots; empty (falsy) lets the gate skip key look-ups on admission."""
        ...


class _SlotBook:
    """Shared state: the virtual schedule end ``tat`` and the bounded key -> slot book."""

    __slots__ = ("_book", "_tat", "max_delay")

    def __init__(self, max_delay: float, max_keys: int) -> None:
        self.max_delay = positive("max_retry_after", max_delay)
        self._book: BoundedExpiringMap[tuple[float, float]] = BoundedExpiringMap(max_keys)
        self._tat = float("-inf")

    @property
    def holders(self) -> int:
        return len(self._book)

    @property
    def book(self) -> Sized:
        return self._book.data

    def horizon(self, now: float) -> float:
        return max(0.0, self._tat - now)

    def slot_of(self, key: Hashable, now: float) -> float | None:
        held = self._book.get(key, now)
        if held is None or held[0] <= now:
            return None
        return held[0]

    def release(self, key: Hashable, now: float) -> None:
        held = self._book.pop(key, now)
        if held is not None and held[0] > now:
            self._tat = max(now, self._tat - held[1])

    def _book_slot(self, key: Hashable | None, slot: float, width: float, now: float) -> None:
        if key is not None:
            self._book.put(key, (slot, width), slot + SLOT_GRACE, now)

    def _next(self, now: float, rate: float, earliest: float, cost: float) -> tuple[float, float]:
        """Advance the virtual schedule by one request; return (its start, its width)."""
        width = cost / rate
        start = max(self._tat, earliest)
        cap = now + self.max_delay
        if start > cap:  # horizon at its cap: stop extending it, every newcomer gets the cap
            return cap, 0.0
        self._tat = start + width
        return start, width


class ScheduleSpread(_SlotBook):
    """Deterministic reservation schedule (GCRA-like): each rejection takes the next free slot.

    Slots are spaced ``cost/rate`` apart starting no earlier than ``earliest``, so a
    cohort comes back at exactly ``rate`` per second over the minimum window M/rate.
    ``max_retry_after`` caps how far ahead a slot may lie (seconds).
    """

    __slots__ = ()

    def __init__(self, max_retry_after: float = 120.0, max_keys: int = 100_000) -> None:
        super().__init__(max_retry_after, max_keys)

    def assign(self, key: Hashable | None, now: float, rate: float, earliest: float, cost: float) -> float:
        if key is not None:
            held = self.slot_of(key, now)
            if held is not None:
                return held
        slot, width = self._next(now, rate, earliest, cost)
        self._book_slot(key, slot, width, now)
        return slot


class JitterSpread(_SlotBook):
    """Uniform jitter over the safe window, as in the jitter design manual.

    With ``window`` set (seconds, e.g. from the planner's W >= M/H), each rejection
    draws its slot uniformly from ``[earliest, earliest + window]``. Without it the
    window is the current backlog horizon (pending slots / rate), learnt online as
    the cohort is rejected: early members of a cohort then see a shorter window than
    late ones, which front-loads returns; the schedule policy has no such bias.
    ``uniform`` is injectable for deterministic tests.
    """

    __slots__ = ("_uniform", "window")

    def __init__(
        self,
        window: float | None = None,
        max_retry_after: float = 120.0,
        max_keys: int = 100_000,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        super().__init__(max_retry_after, max_keys)
        self.window = None if window is None else positive("window", window)
        self._uniform = uniform

    def assign(self, key: Hashable | None, now: float, rate: float, earliest: float, cost: float) -> float:
        if key is not None:
            held = self.slot_of(key, now)
            if held is not None:
                return held
        _, width = self._next(now, rate, earliest, cost)  # keeps the backlog horizon up to date
        span = self.window if self.window is not None else self._tat - earliest
        slot = min(earliest + self._uniform(0.0, max(span, 0.0)), now + self.max_delay)
        self._book_slot(key, slot, width, now)
        return slot


def spread_from_name(name: str, max_retry_after: float, max_keys: int) -> SpreadPolicy:
    """Build a policy from its config name: ``"schedule"`` or ``"jitter"``."""
    if name == "schedule":
        return ScheduleSpread(max_retry_after, max_keys)
    if name == "jitter":
        return JitterSpread(None, max_retry_after, max_keys)
    raise ConfigError("spread", "unknown policy; known: 'schedule', 'jitter'", name)
