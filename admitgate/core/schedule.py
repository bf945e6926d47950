"""The retry schedule: where each rejected client stands, and when it is due back.

A rejected cohort of M requests must come back no faster than the headroom H allows, over at
least ∫H(t) dt = M. The schedule is a virtual queue on the axis of *work* (tokens): a rejected
request takes the next *position* at the tail, ``cost`` wide, and the *head* moves along the axis
at H (tokens/s), so ``head(t) = head(t0) + ∫ H dt``. A position is due when the head reaches it.

Storing positions rather than times is what lets the schedule follow a live H(t). When H moves,
only the head's speed changes (O(1)); every waiting client's due time moves with it, up or down,
in order. A client that comes back when its position is not yet due keeps its place: it is told
again when it will be due, and is never sent to the back.

What a client is *told* is a promise that cannot be recalled, and the two ways of being wrong do
not cost the same. A client told too early comes back, finds its position not yet due, and is told
again: one cheap 429. A client told too late leaves capacity unused that no one can get back, and a
gate that under-estimates H then never sees the demand it needs to learn the true H. So the time a
client is told is a forecast in which H may keep growing at ``growth`` per second (the estimator's
probing pace; 0 for a capacity that is typed in): the earliest time its position could be reached.

``placement="queue"`` (the default) gives consecutive positions, a flat stream of returns at H.
``placement="jitter"`` draws a position uniformly over the backlog (or over ``window`` seconds of H),
as the jitter design manual does; it front-loads returns when the window is learnt online.

The book maps a client key to ``(position, cost, told)``: its place, its width and the time it was
told to come back (seconds). It is bounded (``max_keys``) and every entry expires ``SLOT_GRACE``
seconds after the time the client was told, so a client that sleeps exactly Retry-After and comes
back on a slow network is still recognised.

One source (a key's ``source``: an address prefix) holds places in the common queue up to its share; its places
beyond it go behind everyone's, on a lane of their own that later places from other sources do not wait behind.
One source alone is placed as before, and one that floods the schedule with identities pushes others back by
its share at most, whether or not it ever claims its places.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sized

from .errors import ConfigError, positive
from .keystore import BoundedExpiringMap

#: A book entry is forgotten this long after the time its client was told to come back (seconds).
SLOT_GRACE = 5.0
PLACEMENTS = ("queue", "jitter")

#: A client's place: (position in tokens, its width in tokens, when it was told to come back in seconds).
Place = tuple[float, float, float]


class Schedule:
    """A virtual queue of rejected clients whose head advances at the shed rate H.

    ``rate``: H in tokens/s at ``now``. ``placement``: ``"queue"`` or ``"jitter"``; ``window``
    (seconds of H) fixes the jitter span, else it is the current backlog. ``max_keys`` bounds the
    book. Every method takes ``now`` (seconds) and does O(1) work (amortised, for the book).
    """

    __slots__ = ("_at", "_book", "_head", "_rate", "_sources", "_spill", "_tail", "_uniform", "placement", "window")

    def __init__(
        self,
        rate: float,
        now: float = 0.0,
        *,
        placement: str = "queue",
        window: float | None = None,
        max_keys: int = 100_000,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if placement not in PLACEMENTS:
            raise ConfigError("spread", f"unknown placement; known: {', '.join(PLACEMENTS)}", placement)
        self.placement = placement
        self.window = None if window is None else positive("spread_window", window)
        self._rate = positive("rate", rate)
        self._head = 0.0  # position of the head at _at
        self._at = now
        self._tail = 0.0  # the next free position (<= head when nobody waits)
        self._spill = 0.0  # the end of the places of sources beyond their share (behind the tail when they were made)
        self._book: BoundedExpiringMap[Place] = BoundedExpiringMap(max_keys)
        #: source -> [places it holds (at most: expired ones count until its last does), the end of its places
        #: beyond its share]
        self._sources: BoundedExpiringMap[list[float]] = BoundedExpiringMap(max_keys)
        self._uniform = uniform

    # -- the head ---------------------------------------------------------------------------
    @property
    def rate(self) -> float:
        """H: how fast the head moves, tokens/s."""
        return self._rate

    def head(self, now: float) -> float:
        """The position the head has reached at ``now`` (tokens)."""
        return self._head + self._rate * (now - self._at)

    def set_rate(self, rate: float, now: float) -> None:
        """From ``now`` on the head moves at ``rate`` (tokens/s, finite, > 0)."""
        if rate == self._rate:
            return
        if not 0 < rate < math.inf:
            raise ConfigError("rate", "must be a finite number > 0", rate)
        self._head = self.head(now)
        self._at = now
        self._rate = rate

    def due_in(self, position: float, now: float) -> float:
        """Seconds until the head reaches ``position`` at the current H (<= 0: due)."""
        return (position - self.head(now)) / self._rate

    @property
    def _end(self) -> float:
        """The end of the last place given (the common queue's, or a source's beyond its share)."""
        return self._tail if self._tail > self._spill else self._spill

    def backlog(self, now: float) -> float:
        """Tokens of places not yet due at ``now``."""
        return max(0.0, self._end - self.head(now))

    def horizon(self, now: float) -> float:
        """Seconds from ``now`` until the last waiting position is due, at the current H (0: nobody waits)."""
        return max(0.0, (self._end - self.head(now)) / self._rate)

    # -- places -----------------------------------------------------------------------------
    def take(self, cost: float, now: float, start: float = 0.0, source: Hashable | None = None,
             share: float = math.inf) -> float:  # fmt: skip
        """A new place, ``cost`` tokens wide, due no sooner than ``start`` seconds from now; its position.

        A ``source`` holding ``share`` tokens of places or more, or places beyond the common queue's tail already,
        gets it behind every place given so far, without moving that tail: places from elsewhere are not pushed
        back by it (and its own stay in their order: alone, a source is placed as if there were no rule)."""
        first = self.head(now) + self._rate * start
        entry = None if source is None else self._sources.get(source, now)
        if entry is not None and (entry[0] * cost >= share or entry[1] > self._tail):
            end = self._end
            position = end if end > first else first
            self._spill = entry[1] = position + cost
            return position
        position = self._tail if self._tail > first else first
        self._tail = position + cost
        if self.placement == "jitter":
            span = self.window * self._rate if self.window is not None else self._tail - first
            position = first + self._uniform(0.0, max(0.0, span))
        return position

    def release(self, position: float, cost: float, now: float) -> None:
        """A client got in before its position was due (a free token in the bucket): the head skips the hole
        it leaves, so every waiting place comes due ``cost`` sooner. (Shortening the tail instead left the
        hole in front of those already waiting: the head crossed it with nobody due and the bucket filled
        up unused, and a new place could land on one still held.)"""
        head = self.head(now)
        if position > head:
            self._head, self._at = min(head + cost, self._end), now

    # -- the book ---------------------------------------------------------------------------
    @property
    def book(self) -> Sized:
        """Keys holding a place (falsy when empty, so callers can skip identifying requests)."""
        return self._book.data

    @property
    def holders(self) -> int:
        """Keys holding a place, expired ones not yet dropped included (see :meth:`waiting`)."""
        return len(self._book)

    def waiting(self, now: float) -> int:
        """Keys holding a place at ``now``: the book without the places forgotten by the oldest end
        (amortised O(1)). Clients who gave up stop counting once their places are forgotten."""
        return self._book.sweep(now)

    @property
    def evicted(self) -> int:
        """Places dropped because the book was full (their clients will not be recognised)."""
        return self._book.evicted

    def place_of(self, key: Hashable, now: float) -> Place | None:
        """``(position, cost, told)`` of ``key``, or None."""
        return self._book.get(key, now)

    def hold(self, key: Hashable, place: Place, now: float) -> None:
        """Book ``key`` at ``place``; it is forgotten ``SLOT_GRACE`` s after it was told to come back. A new
        place is counted to the key's ``source`` (if it has one) until then."""
        source = getattr(key, "source", None)
        if source is not None and key not in self._book.data:
            entry = self._sources.get(source, now)
            expires = place[2] + SLOT_GRACE
            if entry is None:
                entry = [0.0, 0.0]
            else:
                expires = max(expires, self._sources.data[source][0])
            entry[0] += 1
            self._sources.put(source, entry, expires, now)
        self._book.put(key, place, place[2] + SLOT_GRACE, now)

    def forget(self, key: Hashable, now: float) -> Place | None:
        """Remove ``key``'s place (it was admitted); return it."""
        place = self._book.pop(key, now)
        source = getattr(key, "source", None)
        entry = None if place is None or source is None else self._sources.get(source, now)
        if entry is not None and entry[0] > 0:
            entry[0] -= 1
        return place

    def __repr__(self) -> str:
        return f"Schedule(H={self._rate:g}/s, head={self._head:.1f}@{self._at:.3f}, tail={self._tail:.1f})"


def forecast(seconds: float, growth: float) -> float:
    """Seconds until a place ``seconds`` away at the current H is reached if H grows by ``growth``/s.

    With H(t) = H·(1+g)^t the work done by time τ is H·((1+g)^τ − 1)/ln(1+g); setting it equal to
    H·seconds gives τ = ln(1 + seconds·ln(1+g)) / ln(1+g). With g = 0 it is ``seconds``.
    """
    if seconds <= 0 or growth < 1e-9:  # (no growth to speak of: and no denormal arithmetic)
        return seconds
    rate = math.log1p(growth)
    return math.log1p(seconds * rate) / rate
