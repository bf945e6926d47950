"""A pool waking between reallocations: what the others leave (or lend) it at once, and the tokens it starts with.

A pool idle until now asks: it is given what the others leave unused until the next reallocation (which comes
sooner if that is less than it wants), its clients are told Retry-After by what the others leave, and its bucket
starts with the tokens the pools it took its rate from gave up. The sum of the pools' rates stays within μ.
"""

from __future__ import annotations

import math

from ..pacer import EPOCH_CUT
from ..settings import MIN_RATE
from .pool import Pool
from .state import TableState
from .tuning import ROUNDING


class Waking(TableState):
    """The wake-ups of a tenants' table (see the module docstring)."""

    def _activate(self, pool: Pool, now: float) -> None:
        """A pool idle until now asks: what the others leave unused until the next reallocation (the others keep
        what they use, and the sum of the rates stays within the capacity), which comes within
        ``tuning.early × interval`` if that is less than it wants (its entitlement; what it asks, if it is known to ask
        less, see :meth:`_borrow`). Its clients are told Retry-After at what the
        others leave (at least its entitlement, which its share reaches then).

        All of what they leave, not its entitlement of it: a herd's tenant waking beside a small tenant and the
        newcomers' pool was given a third of the capacity, held a third as many of its first wave in its pacing
        window (reserved at that rate), and had nobody to admit at the rate the next reallocation gave it until
        the first wave came back a second later (in the simulator's tenant herd, 73 requests served in the
        herd's first second where one pool served 132).
        """
        pool.awake = True
        self._active_weight += pool.weight
        pool.share.unkeep(pool.weight)  # (what it is given is not known to be all it asks until the next reallocation)
        entitlement = self._entitlement(pool.weight, self._active_weight)
        passed = self._reclaim(pool, math.inf, now)
        borrowed, wanted = 0.0, entitlement
        if pool.seen > -math.inf and pool.demand < entitlement:  # (known to ask less than its entitlement)
            wanted = min(entitlement, self.tuning.use(pool.demand) / pool.share.scale)  # (in the shares' units)
            borrowed, given = self._borrow(pool, wanted, now)
            passed += given
        rate = max(0.0, self._available - self._assigned) + borrowed
        self._assigned += rate - borrowed  # (the lender's rate is less by as much)
        self._refill_credit(now)
        promise = self._promise(entitlement, self._used)  # (what the others use stands)
        # What the others' promises count it to take: what it has been seen to use, at most its entitlement, as
        # at a reallocation. Counted as its whole entitlement, the newcomers' pool woken by a herd's first two
        # requests held half of the capacity out of the herd's promise until the next reallocation, and the
        # herd was told Retry-After at 86 of 200/s. Optimistic, as every promise is: a tenant that does wake
        # up to use its share makes the others' clients come back early once (a second 429, not lost capacity).
        pool.use = min(self.tuning.use(pool.demand), entitlement * self._scale)
        self._used += pool.use
        pool.set_share(rate, entitlement, self._burst(rate), now, promise)
        self._start(pool, now, passed)
        # What it does not use a tenant waking after it takes back (its use is measured as it asks). Left out of
        # ``_spare`` until the next reallocation, the first pool to wake after an idle spell (the newcomers', on a
        # key's first requests) held all of the capacity, and the key's own pool, established on its third
        # request, was given nothing: rejected at a rate of 1e9/s, on a server's first 32 requests.
        self._spare.append(pool)
        # The others hold what it asks (its share, if what it asks is not known): reallocate soon, not a whole
        # interval from now. (Also when a light tenant took what it asks: fifty of them beside a busy one had the
        # shares recomputed about twelve times a second, and each time a waking pool's rate was cut back to its
        # measured demand, its held request was turned away at its end.)
        if rate < wanted * (1.0 - ROUNDING):
            self.next_rebalance = min(self.next_rebalance, now + self.tenancy.interval * self.tuning.early)

    def _borrow(self, pool: Pool, wanted: float, now: float) -> tuple[float, float]:
        """A light tenant waking (known to ask less than its entitlement, which max-min fairness gives all it asks)
        whose rate the others hold: take what it asks, ``wanted`` (in the shares' units: see :class:`Share`), beyond
        what no pool is assigned, from the pool given the most per weight at the last reallocation, down to that
        pool's entitlement now. A rate moves, so the rates still sum to what they summed to. Returns the rate taken
        (in the shares' units), and the tokens the lender's bucket gave up with it.

        Without it, a tenant asking once every 2 s beside a busy one woke to no rate at each request, and was told
        Retry-After 1 before the shares were recomputed a moment later: 97 % of its first tries in
        ``bench/light_tenants.py``. (Lent tokens instead, as a debt in the lender's bucket: a deep cut to the lender
        at the next reallocation forgave the debt, and light tenants waking together were admitted beyond
        rate·t + burst.) A new pool takes nothing: its demand is not known (a
        herd's tenants are new)."""
        lender = self._lender
        if lender is None or lender is pool or not lender.awake:
            return 0.0, 0.0
        share = lender.share
        short = wanted - max(0.0, self._available - self._assigned)
        # Never below its entitlement, nor so deep a cut that its pacer starts a new epoch (its holds, the deepest
        # queue of all, would reserve again and the tail be turned away).
        least = max(self._entitlement(lender.weight, self._active_weight),
                    EPOCH_CUT * self.tuning.epoch_margin * lender.gate.pacer.epoch_rate / share.scale)  # fmt: skip
        cut = min(short, share.value - least)
        if cut <= 0:
            return 0.0, 0.0
        return cut, self._cut(lender, cut, now)

    def _reclaim(self, waking: Pool, wanted: float, now: float) -> float:
        """Take back up to ``wanted`` requests/s from pools whose rate exceeds what they use (their measured
        demand, or what they asked so far this interval, whichever is more, as ``tuning.use`` counts it): a share
        nobody uses is no reason to turn a waking tenant away until the next reallocation. The sum of the
        rates stays within the capacity. The pools are those the last reallocation found with a rate above what
        they use, most to spare last, then those woken since (latest last): each is looked at until it has
        nothing left to give, so the cost is amortised O(1) per wake-up, however many pools exist.

        Returns the tokens their buckets gave up with their rates (a bucket is its part of the burst): they pass
        to the waking pool (see :meth:`_cut`)."""
        passed = 0.0
        elapsed = max(now - self._last, self.tenancy.interval * self.tuning.early)
        spare = self._spare
        while wanted > 0 and spare:
            other = spare[-1]
            using = self.tuning.use(max(other.demand, other.asked / elapsed))  # requests/s now: in the shares' units
            left = other.share.value - max(using / other.share.scale, MIN_RATE)
            if other is waking or not other.awake or left <= 0:
                spare.pop()  # nothing (more) to take from it until the next reallocation
                continue
            cut = min(left, wanted)
            passed += self._cut(other, cut, now)
            self._assigned -= cut
            wanted -= cut
        return passed

    def _cut(self, pool: Pool, cut: float, now: float) -> float:
        """Lower ``pool``'s share by ``cut`` (in the shares' units) from ``now``, its part of the burst with it, and
        refresh its gate at once, so it refills at its new rate from now, not at the old one until its next request
        (a bucket that refilled at a rate taken from it had tokens to pass again). Returns the tokens its bucket
        gave up, which pass to the pool the rate goes to."""
        share = pool.share
        rate = share.value - cut
        held = max(0.0, pool.gate.pacer.tokens(now))
        pool.set_share(rate, share.entitlement, self._burst(rate), now, share.capacity)
        pool.gate.refresh(now)
        return held - max(0.0, pool.gate.pacer.tokens(now))
