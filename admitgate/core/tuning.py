"""The gate's tuning: the constants of its algorithm, each named and stated once.

These are not settings an application chooses (those are :class:`~admitgate.core.settings.Settings`): they are
the rules' own numbers, chosen with the benchmarks and pinned by the tests. A :class:`~admitgate.core.gate.Gate`
takes one (``tuning``); every gate of a tenants' table takes its root's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GateTuning:
    """How the gate admits, paces and tells. Times in seconds; shares are fractions of a rate or a burst.

    ``min_share``: the shed rate H never drops below this share of the rate, so places stay finite.
    ``early_slack``: a client back this long before the time it was told ignores Retry-After (its 429 may be held:
    the tarpit). ``lead``: how long before its place is due a client is told to come back (Retry-After is in whole
    seconds), held until its place is due; a returning client is held that long, however short the pacing window
    of new requests (none with pacing off). ``recheck``: a hold on a rate that can change wakes at
    least this often to see whether a risen rate has brought its token or its place due sooner (the reservation's
    place on the refill axis and the client's place in the schedule move in with the rate). ``room_wait``: a request
    whose token is due waits this long before it looks again for room in flight (the in-flight limit is full).
    ``spare``: in a tenants' pool, a request whose own bucket is short goes in on the replica's bucket alone while
    that would still hold this share of its burst (or a reserving class's share, if more) and ``spare_costs`` times
    the request's cost (its own and two more): the refill the other pools left unused piles up there, and what piles
    up beyond the burst is lost. ``collapse``: μ below this share of its recent peak has collapsed (an outage, until a
    λ_new window after it is back), and H below it is waited out at its peak. ``peak_memory``: the recent peaks of H
    and μ decay with this time constant, but not for the first ``peak_memory`` seconds of an outage or of a collapsed
    H (the capacity before an outage is the best guess for after it). ``burst_divisor``: with no burst configured the
    bucket holds the initial rate over this many (a tenth of a second of it), at least one token.
    ``min_waiters``, ``waiter_windows``: with no ``max_waiters`` configured, at most this many pacing windows at the
    initial rate are held at once, and at least ``min_waiters``. ``room_latencies``: a request is held for room in
    flight up to this many of the service's latencies (room comes at the service's pace: the in-flight limit
    doubles each latency), and no less than a pacing window; while no capacity is known, no less than ``lead``.
    ``unknown``: how fast the schedule's head moves while no capacity is known, tokens/s (as good as not at all:
    places keep their order until it is measured). ``source_share``, ``source_places``: one source (an address
    prefix) holds places in the schedule's common queue up to this many seconds of the promised H, and at least
    this many tokens of them; its places beyond that go behind everyone's (see
    :meth:`~admitgate.core.schedule.Schedule.take`). ``landing_hold``: a new place taken while a herd lands on a fleet
    is held up to this long, from its request's arrival, for the fleet's backlog to land (see
    :meth:`~admitgate.core.gate.Gate._unheard`); up to ``landing_waiters`` times ``max_waiters`` such holds at once,
    beside the pacing holds.
    """

    min_share: float = 0.05
    early_slack: float = 0.1
    lead: float = 1.0
    recheck: float = 0.25
    room_wait: float = 0.02
    spare: float = 0.5
    spare_costs: float = 3.0
    collapse: float = 0.25
    peak_memory: float = 30.0
    burst_divisor: float = 10.0
    min_waiters: int = 1000
    waiter_windows: float = 2.0
    room_latencies: float = 4.0
    unknown: float = 1e-6
    source_share: float = 2.0
    source_places: float = 20.0
    landing_hold: float = 2.0
    landing_waiters: float = 5.0


#: The gate's tuning as chosen (every gate's unless one is given).
GATE = GateTuning()
