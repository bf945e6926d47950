"""The fair share's tuning: the constants of how a tenants' table measures demand and moves shares, each stated once.

Not settings an application chooses (those are :class:`~admitgate.core.tenants.policy.Tenancy`): the rules' own
numbers, chosen with the benchmarks and pinned by the tests. A :class:`~admitgate.core.tenants.table.Tenants`
takes one (``tuning``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Relative float rounding allowed where two rates are compared (a rate "at" another is within it).
ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class FairTuning:
    """How demand is measured and what it is counted to use. Rates in requests/s; spans in reallocation intervals.

    ``slack``, ``room``: a pool's demand is water-filled at ``slack`` times what it asked (room to grow: a pool whose
    clients wait for each answer asks no more than it is given), and it is counted to use (in the others' promises, and
    before a waking pool takes its unused rate) its demand times ``slack`` plus ``room``: room for its demand to grow,
    and for random arrivals above their mean (:meth:`use`). ``smoothing``: a pool's measured demand moves this fraction
    of the way to each interval's count (an exponential average: a rate moved by noise would move its pacer's queued
    reservations, and cut the last of them short), unless the newest count is ``surge`` times the average (a surge:
    believed at once) or the count over the last ``span`` intervals is ``surge`` times less (a fall: believed at once);
    never from a single request: the cost asked over ``span`` intervals must be more than ``lone`` times the cost of the
    request that last woke the pool. ``span``: intervals a fall is judged over (a tenant whose clients come in bursts
    asks nothing for an interval or two between them, and must not lose its share each time). ``history``: reallocations
    whose counts a pool keeps (enough for ``span`` intervals while the shares are recomputed every tenth of one).
    ``returns``: a pool whose clients hold places still asks within this many of its places' spacing at its entitlement,
    if that is longer than ``span`` intervals. ``early``: a pool that wakes to find its share held by the others has the
    shares recomputed within this fraction of the interval (so at most 1/``early`` reallocations per interval).
    ``periods``: a pool asking less often than every ``span`` intervals keeps a token per period (its period between
    requests) until this many periods pass without it asking. ``critical_floor``: critical traffic never leaves less
    than this share of the capacity to divide among tenants. ``epoch_margin``: a share is never cut below this many
    times the cut that would start a new epoch in its pool's pacer (its holds would reserve again, the tail turned
    away).
    """

    slack: float = 1.25
    room: float = 1.0
    smoothing: float = 0.3
    surge: float = 1.5
    lone: float = 1.0
    span: int = 3
    history: int = 32
    returns: float = 2.0
    early: float = 0.1
    periods: float = 1.5
    critical_floor: float = 0.05
    epoch_margin: float = 1.01

    def use(self, demand: float) -> float:
        """What a pool asking ``demand`` requests/s is counted to use, requests/s."""
        return demand * self.slack + self.room


#: The fair share's tuning as chosen (every table's unless one is given).
FAIR = FairTuning()
