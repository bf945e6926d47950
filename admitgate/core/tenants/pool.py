"""A tenant's pool (its gate and its demand meter), a key not established yet, and what a pool's history says
it asked."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

from ..gate import Gate
from ..settings import MIN_RATE
from .share import Share
from .tuning import FAIR, FairTuning


class Candidate:
    """A key not established yet: its ``requests`` within ``Tenancy.window`` since its first at ``since`` (seconds),
    the cost the newcomers' pool ``asked`` for them in reallocation interval number ``round``, and ``before`` it."""

    __slots__ = ("asked", "before", "requests", "round", "since")

    def __init__(self, round: int, since: float) -> None:
        self.requests, self.asked, self.round, self.since, self.before = 0, 0.0, round, since, 0.0


def asked_rates(counts: deque[float], spans: deque[float], interval: float, unit: float = 1.0,
                tuning: FairTuning = FAIR) -> tuple[float, float | None, bool]:  # fmt: skip
    """What a pool asked, requests/s, from the cost it asked between each of its last reallocations (``counts``,
    latest last) and their lengths (``spans``, seconds; the latest is never 0): ``(recent, span, lone)``.
    ``recent`` is over the latest of them back to ``interval`` seconds, or over all it has if less (a new pool's
    history, or one since the table closed); a surge is believed from it at once. ``span`` is over them back to
    ``tuning.span`` intervals, and a fall is judged from it; None with less history than that (a fall is not believed
    from it: cleared at a close, a pool asking every 0.5 s was judged on the 0.19 s since, and put to sleep).
    ``lone``: ``span`` is known and is of one request's cost at most (``tuning.lone`` × ``unit``, the cost of a request,
    in tokens): one request is no rate to believe at once (see :meth:`Tenants.rebalance`).

    Over the latest reallocation alone, a wake-up's (within a tenth of the interval) took a light tenant's one
    request in 0.05 s for 20/s, and believed it: fifty such tenants beside a busy one took its share.
    """
    count = length = 0.0
    recent: float | None = None
    for cost, seconds in zip(reversed(counts), reversed(spans), strict=True):
        count += cost
        length += seconds
        if recent is None and length >= interval:
            recent = count / length
        if length >= tuning.span * interval:
            return recent if recent is not None else count / length, count / length, count <= tuning.lone * unit
    return count / length if recent is None else recent, None, False


class Pool:
    """One tenant's gate and its demand meter (requests/s asked, rejected retries included)."""

    __slots__ = ("asked", "awake", "book", "counts", "demand", "gate", "name", "pacer", "period", "rejected", "seen",
                 "share", "spans", "take", "unit", "use", "weight")  # fmt: skip

    def __init__(self, name: Hashable, weight: float, gate: Gate, share: Share, history: int = FAIR.history) -> None:
        self.name, self.weight, self.gate, self.share = name, weight, gate, share
        # bound once for Tenants.try_take
        self.book, self.take, self.pacer = gate.schedule.book, gate.pacer.try_take, gate.pacer
        self.asked = 0.0  #: cost asked since the last reallocation, tokens
        self.demand = 0.0  #: requests/s asked, as of the last reallocation
        self.rejected = 0  #: rejections so far
        self.seen = -math.inf  #: the last reallocation that found it had asked, seconds
        self.period = 0.0  #: seconds between the reallocations that found it had asked (a moving average; 0: not known)
        self.awake = False  #: it has asked since it was last idle at a reallocation
        self.counts: deque[float] = deque(maxlen=history)  #: cost asked between each of the last reallocations
        self.spans: deque[float] = deque(maxlen=history)  #: and their lengths, seconds
        self.use = 0.0  #: requests/s the others' promises count it to take: its demand, at most its entitlement (told)
        self.unit = 1.0  #: the cost of the request that last woke it, tokens (one request's worth: see FairTuning.lone)

    def set_share(self, rate: float, entitlement: float, burst: float, now: float, promise: float = 0.0) -> None:
        """Refill at ``rate`` (of the capacity as of the last reallocation; scaled with it, see :class:`Share`); tell
        Retry-After at ``entitlement`` or ``promise`` (requests/s), whichever is more:
        ``promise`` is what it gets if it stays busy while the others use what they used."""
        share = self.share
        value = max(rate, MIN_RATE)
        split = share.split
        if split is not None:
            if share.kept:
                split.held += value - share.value
            else:
                split.rest += value - share.value
                split.low = min(split.low, value / self.weight)
        share.value, share.capacity = value, max(rate, entitlement, promise, MIN_RATE)
        share.entitlement = max(entitlement, MIN_RATE)
        if burst != self.gate.pacer.burst:
            self.gate.pacer.set_burst(burst, now)
        self.gate.next_refresh = now  # the next decision reads the new rate
