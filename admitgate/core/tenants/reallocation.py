"""The reallocation: every ``interval`` seconds, measure each pool's demand, divide the capacity among the pools by
weighted max-min water-filling, give each its share, and choose whether the table is open or closed.

A pool's demand is what it asked (requests/s, rejected retries included, except those of clients back before the
time they were told), smoothed, with its clients' places and holds counted as demand too. Critical requests are
charged to the capacity first, and only what they leave is divided. Each asking pool is told Retry-After at what it
gets if it stays busy: the capacity less what the others use, never less than its own entitlement.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..fair import fair_shares
from ..pacer import EPOCH_CUT
from ..settings import MIN_RATE
from .policy import NEWCOMERS
from .pool import Pool, asked_rates
from .state import TableState
from .tuning import ROUNDING


class Allocation(NamedTuple):
    """One reallocation's division of the capacity, by the asking pools' indexes (requests/s, the shares' units)."""

    shares: dict[int, float]  # each asking pool's rate
    entitlements: dict[int, float]  # its weighted share among the pools asking
    kept: set[int]  # the pools given all they asked
    uses: dict[int, float]  # what the others' promises count each to use
    used: float  # their sum
    weight: float  # the weight of the pools asking
    floor: int  # the newcomers' index if they were given their floor (Tenancy.newcomer_share), else -1


class Reallocation(TableState):
    """The reallocations of a tenants' table (see the module docstring), and its opening and closing."""

    def rebalance(self, now: float) -> None:
        """Measure each pool's demand and divide the capacity among them by weighted max-min water-filling.

        Each asking pool is given its fair share of the measured demands, and what they leave (when they
        ask for less than the capacity) is divided among them by weight: these rates sum to the capacity as of
        the reallocation (between reallocations they follow it: a rise in proportion, a cut first out of the pools not
        given all they ask, see :class:`Share`).
        Idle pools keep a rate of ``MIN_RATE`` until they ask (a pool asking every few seconds is not idle between:
        it keeps a token per period). (A pool given what it asks was given room to grow, up to what ``tuning.use``
        counts it to use, taken from nobody: the rates summed to more than the capacity, and light tenants woken
        together beside a busy one, each held for its room, were admitted beyond rate·t + burst. A pool's share
        grows at the next reallocation, or sooner: see :meth:`admit`.)
        """
        root, tenancy = self.root, self.tenancy
        elapsed = max(now - self._last, 1e-9)
        self._last, self.next_rebalance = now, now + tenancy.interval
        self._round += 1
        critical = (root.stats.critical - self._critical) / elapsed
        self._critical = root.stats.critical
        if not self.closed:  # open: nothing to share out until a request finds the replica's bucket empty
            # The pools keep their shares, and μ and the capacity they are parts of stand with them: a pool woken
            # as the table closes is given its part of that μ. (Taken anew here, after μ doubled the waking pool
            # was given half of the new capacity beside shares still summing to the old one, which had doubled.)
            # The pools that had asked before it opened are kept (expired after ``idle``, a small tenant met the
            # herd that closed a table open for 40 s as a newcomer).
            for pool in self._pools.values(now):
                if pool.awake:
                    self._pools.put(pool.name, pool, now + tenancy.idle, now)
            return
        self.follow(now)
        mu = self._mu = root.pacer.rate
        available = self._available = max(mu - critical, mu * self.tuning.critical_floor)
        if self._credit.burst != root.pacer.burst:
            self._credit.set_burst(root.pacer.burst, now)
        # With a shared budget μ is this replica's lease, which follows what it admitted lately (an idle
        # replica's is 10/s); its clients are told by its share of the fleet's H. Told by the lease, a herd
        # landing on an idle replica was told Retry-After at 10/s: up to 600 s where 12 s would do.
        told = max(available, root.promise - critical) if root.backend is not None else available
        self._scale, self._told = told / available, told
        pools = self.pools(now)
        demands, weights = self._measure(pools, elapsed, now)
        if root.backend is not None:  # its running counts, made exact (only a shared budget reads them)
            self._count_below(pools, now)
        self._apply(pools, self._allocate(available, demands, weights, len(pools) - 1), mu, now)
        self._choose_mode(pools, demands, available, now)

    def _measure(self, pools: list[Pool], elapsed: float, now: float) -> tuple[dict[int, float], dict[int, float]]:
        """Each pool's demand measured anew; the asking pools' wants (requests/s) and weights, by index."""
        demands: dict[int, float] = {}
        weights: dict[int, float] = {}
        for index, pool in enumerate(pools):
            self._meter(pool, elapsed, now)
            wanted = self._wants(pool, now)
            if wanted > MIN_RATE:
                demands[index] = wanted
                weights[index] = pool.weight
        return demands, weights

    def _meter(self, pool: Pool, elapsed: float, now: float) -> None:
        """``pool``'s demand (requests/s) from what it asked since the last reallocation, ``elapsed`` seconds ago."""
        t, tenancy = self.tuning, self.tenancy
        # A pool born since the last reallocation (no history, never seen) was born of the request it counts: over
        # the moment since the last one alone (a reallocation soon after a wake-up, 0.05 s), fifty light tenants
        # established at once with establish=1, one request each, were measured at 20/s, and the table admitted
        # 8-25 of 100/s for three seconds. Its first sample spans an interval at least if it is that one request:
        # it asked nothing before. (Any pool born so: obedient tenants asking more were under-measured, told to
        # wait by that, asked less for it, and stayed there: weights 3:1:1 read 0.47 / 0.28 / 0.28 of H.)
        newborn = not pool.counts and pool.seen == -math.inf
        if pool.asked:
            if pool.seen > -math.inf:
                gap = now - pool.seen
                pool.period = gap if not pool.period else pool.period + t.smoothing * (gap - pool.period)
            pool.seen = now
        pool.counts.append(pool.asked)
        alone = newborn and pool.asked <= t.lone * pool.unit
        pool.spans.append(max(elapsed, tenancy.interval) if alone else elapsed)
        asked, span, lone = asked_rates(pool.counts, pool.spans, tenancy.interval, pool.unit, t)
        # One request alone in `span` intervals is no surge: believed, a tenant asking once every 2 s was measured
        # at 2/s in the interval it asked, then at 0.67/s for two, and given 0.96/s on average for its 0.5/s;
        # fifty of them beside a busy tenant left it 49 of its 75/s, the rest unused. (Their surges believed, the
        # busy pool was cut by about what the light pools' first tokens, given from nothing as they woke (see
        # _start), let them admit beyond their rates; the replica's bucket (Parent.bucket) bounds that now.)
        if asked > pool.demand * t.surge and not lone:
            pool.demand = max(asked, span or 0.0)
        elif span is not None and span < pool.demand / t.surge:
            pool.demand = span
        else:
            pool.demand += t.smoothing * ((asked if span is None else span) - pool.demand)
        # A tenant asking less often than a fall is judged over (a request every few seconds) keeps a token per
        # period until a period and a half has passed without it: judged over `span` intervals alone, its pool
        # slept between its requests and woke to no rate, and where μ was cut so that nobody could lend it one,
        # fifty of them beside a busy one were served 1-3 requests a second of 25. A token, not what it asked
        # last: a tenant that sent a burst and stopped would hold a share it no longer uses for 1.5 periods.
        period = pool.period
        if period > t.span * tenancy.interval and now - pool.seen <= t.periods * period:
            pool.demand = max(pool.demand, 1.0 / period)
        if pool.asked and pool.name is not NEWCOMERS:
            self._pools.put(pool.name, pool, now + tenancy.idle, now)
        pool.asked = 0.0

    def _wants(self, pool: Pool, now: float) -> float:
        """What ``pool`` wants now, requests/s: its demand, its clients' places and its holds counted too."""
        t, tenancy = self.tuning, self.tenancy
        # Clients holding places in its schedule will be back: a backlog is demand too, as much as it can
        # be given (the rate they come back at follows the share they are told at: measured alone, it would
        # hold a herd's tenant to the entitlement it was first told at, and the rest would go unused). Only
        # while the pool still asks: clients who gave up are no demand. Still asks means within the last `span`
        # intervals, or within two of its places' spacing at its entitlement if that is longer: a tenant with
        # a few clients among hundreds of tenants is told to come back seconds apart, and taken for gone
        # between two returns it was put to sleep, its schedule's head stopped, and its clients were told
        # again and again (the simulator's herd across 500 tenants drained at 17-22 times its bound).
        recent = max(t.span * tenancy.interval, t.returns / max(pool.share.entitlement, MIN_RATE))
        backlog = pool.gate.schedule.waiting(now) if now - pool.seen <= recent else 0
        # Requests held for their tokens (paced) are demand too, whenever the pool last asked: every hold ends
        # within ``max_pacing_delay``. Left out, a herd's pool whose clients were all held asked nothing for an
        # interval, its rate was cut, and its holds (tokens reserved at the old rate) were turned away at their
        # ends: a herd across 100 tenants drained its last clients a second at a time (1.21-1.27 of its bound in
        # the simulator, now 1.08). The more of the two, not their sum: a held request was counted as asked when
        # it came (added, one hold lifted a pool asking 7.5/s to 9.5/s and back at each reallocation, and the
        # cuts between turned holds away).
        held = pool.gate.waiters / max(pool.gate.max_pacing_delay, tenancy.interval)  # (over a hold's span)
        wanted = max(pool.demand, held) + backlog / tenancy.interval
        if pool.gate.waiters:  # (never so deep a cut that its holds start a new epoch and are turned away)
            wanted = max(wanted, EPOCH_CUT * t.epoch_margin * pool.gate.pacer.epoch_rate / pool.share.scale)
        return wanted

    def _count_below(self, pools: list[Pool], now: float) -> None:
        """The root's ledger of what the pools carry, made exact (a shared budget reads it)."""
        below = self.root.ledger
        below.held = sum(pool.gate.schedule.holders for pool in pools)
        below.new = math.fsum(pool.gate.new_rate() for pool in pools)
        owed = [(max(0.0, -pool.gate.pacer.tokens(now)), pool.gate.pacer.rate) for pool in pools]
        below.owed = math.fsum(debt for debt, _ in owed)
        # (a reallocation comes only with a request: counted until the next, an idle replica leased for a
        # debt repaid long ago, at its last grant, for ever)
        below.owed_until = now + max(debt / rate for debt, rate in owed)

    def _allocate(self, available: float, demands: dict[int, float], weights: dict[int, float],
                  newcomers: int) -> Allocation:  # fmt: skip
        """Water-fill ``available`` (requests/s) over the pools' ``demands`` by ``weights``, the newcomers' pool (index
        ``newcomers``) given its floor; what the asking pools leave is divided among them by weight."""
        tenancy = self.tenancy
        # Room to grow (``tuning.slack``): what a pool asks is bounded by what it was given when its clients wait for
        # each answer before they ask again (a worker pool). Water-filled over its asks alone, such a pool given
        # exactly what it asked asked no more, however far below its share (five tenants of two workers each
        # asking 2.4 times their share beside an abusive one: 0.46-0.71 of it, the abuser 3.4 times its own).
        # Offered a quarter more, it asks for it if it wants it, and so reaches its share within a few
        # reallocations. The room is water-filled with the asks, out of the capacity: the rates still sum to it.
        slack = self.tuning.slack
        asks = {index: demand * slack for index, demand in demands.items()}
        shares = fair_shares(available, asks, weights)
        total = sum(weights.values())
        self._active_weight = total
        entitlements = {index: self._entitlement(weight, total) for index, weight in weights.items()}
        # The newcomers' floor (Tenancy.newcomer_share): beside many busy tenants their one weighted share was a
        # sliver (0.2 % of the capacity beside 500), and the new arrivals beside a herd across them were served
        # one time in ten. Below the floor they are given it, up to what they ask, and the tenants share the rest.
        # The floor is of their demand, given room as any pool's ask is (``slack``): a floor of their ask alone was
        # at their mean (20/s of Poisson arrivals beside a herd across 100 tenants), and it turned away what came
        # above it (0.87-0.94 of the new arrivals served, 1.0 beside a herd in one tenant, where they are given
        # their ask).
        floor = min(asks.get(newcomers, 0.0), tenancy.newcomer_share * available * slack, available)
        floored = shares.get(newcomers, floor) < floor
        if floored:
            shares = fair_shares(available - floor, {k: v for k, v in asks.items() if k != newcomers}, weights)
            shares[newcomers] = floor
            entitlements[newcomers] = sure = max(entitlements[newcomers], tenancy.newcomer_share * available)
            others = total - weights[newcomers]  # (the tenants are sure of their parts of the rest)
            for index, weight in weights.items():
                if index != newcomers:
                    entitlements[index] = (available - sure) * weight / others
        kept = {index for index, rate in shares.items() if rate >= demands[index] * (1.0 - ROUNDING)}  # all they ask
        left = max(0.0, available - math.fsum(shares.values()))
        for index in shares:
            shares[index] += left * weights[index] / total
        # Each asking pool is told Retry-After at what it gets if it stays busy: the capacity less what the
        # others use (their demand, at most their entitlement), never less than its own entitlement. A herd's
        # tenant beside a light one is told at nearly all of the capacity, not at half of it.
        scale = self._scale
        uses = {index: min(self.tuning.use(demands[index]), entitlements[index] * scale) for index in shares}
        used = self._used = math.fsum(uses.values())
        return Allocation(shares, entitlements, kept, uses, used, total, newcomers if floored else -1)

    def _apply(self, pools: list[Pool], allocation: Allocation, mu: float, now: float) -> None:
        """Give each pool its share of ``mu`` as ``allocation`` divided it (an asleep pool keeps a token's rate), and
        note what the wake-ups until the next reallocation take from: the pools with rate to spare, the lender, and
        the split a cut comes out of."""
        root = self.root
        shares, entitlements, kept, uses = allocation.shares, allocation.entitlements, allocation.kept, allocation.uses
        floor = allocation.floor
        self._assigned = 0.0
        self._lender, most = None, 0.0
        growth = root.growth  # the estimator's pace now (start-up's, then probing's): each schedule's forecast
        whole = root.whole
        spare: list[tuple[float, int, Pool]] = []
        for index, pool in enumerate(pools):
            pool.share.growth, pool.share.whole = growth, whole
            pool.share.basis = mu
            pool.share.kept = index not in shares or index in kept  # (asleep: it keeps its token's rate)
            if index in shares:
                # Awake: its weight is among the active ones. (A pool asleep whose clients' places made it ask
                # was given its share here and then, on its next request, woken anew to what the others left,
                # nothing when they held all of it: its clients were turned away at every turn.)
                woken, pool.awake = not pool.awake, True
                rate = shares[index]
                self._assigned += rate
                pool.use = uses[index]
                entitlement = entitlements[index]
                pool.set_share(rate, entitlement, self._burst(rate), now,
                               self._promise(entitlement, allocation.used - uses[index]))  # fmt: skip
                if woken:
                    self._start(pool, now)
                extra = rate - max(self.tuning.use(pool.demand), MIN_RATE)
                if extra > 0:
                    spare.append((extra, index, pool))
                if rate / pool.weight > most and index != floor:  # (_borrow: a floor lends none)
                    self._lender, most = pool, rate / pool.weight
            else:  # asleep: what its bucket held goes with its share (woken, it is given tokens anew: _start)
                pool.awake, pool.use = False, 0.0
                pool.set_share(MIN_RATE, self._entitlement(pool.weight, allocation.weight + pool.weight), 1.0, now)
                pool.gate.pacer.cap(0.0, now)
        self._resplit(pools, shares, floor)
        self._refill_credit(now)
        spare.sort(key=lambda item: (item[0], item[1]))
        self._spare = [pool for _, _, pool in spare]

    def _resplit(self, pools: list[Pool], shares: dict[int, float], floor: int) -> None:
        """The split a cut comes out of until the next reallocation (see :class:`Split`), from the shares given."""
        held = rest = high = 0.0
        low = math.inf
        for index, pool in enumerate(pools):
            value, share = pool.share.value, pool.share
            if share.kept:
                held += value
                if index in shares and index != floor:  # (a floor is no water level)
                    high = max(high, value / pool.weight)
            else:
                rest += value
                low = min(low, value / pool.weight)
        split = self._split
        split.held, split.rest, split.high, split.low = held, rest, high, low

    def _choose_mode(self, pools: list[Pool], demands: dict[int, float], available: float, now: float) -> None:
        """Open the table once the tenants have asked little for ``tuning.span`` reallocations in a row, nobody
        turned away, held or holding a place (see ``Tenancy.open_below``)."""
        tenancy = self.tenancy
        rejections, self._rejections = self.rejections - self._rejections, self.rejections
        quiet = math.fsum(demands.values()) < tenancy.open_below * available and not rejections and \
            not any(pool.gate.waiters or pool.gate.schedule.holders for pool in pools)  # fmt: skip
        self._calm = self._calm + 1 if quiet else 0
        if self._calm >= self.tuning.span and tenancy.open_below > 0:
            self._open(pools, now)

    def _open(self, pools: list[Pool], now: float) -> None:
        """Requests go to the replica's bucket until :meth:`_close`. The pools keep their shares and demands as
        this reallocation left them: put to sleep, a small tenant met the herd that closed the table as a
        waking pool beside it, and one of its requests in a hundred was turned away. The replica's bucket, which
        refilled while the pools admitted, keeps only what their buckets have left (as they keep only their parts
        of its own when it closes: the tokens pass from one to the other, and the bound stands)."""
        root = self.root
        held = math.fsum(max(0.0, pool.gate.pacer.tokens(now)) for pool in pools)
        bucket = self.parent.bucket
        if bucket is not None:  # (and never more than the replica's bucket the pools were charged to holds)
            held = min(held, max(0.0, bucket.tokens(now)))
        root.pacer.cap(held, now)
        # The replica's own λ_new counts the tenants' new requests from now (a shared budget reads both: left,
        # the pools' stood beside it, counted twice for as long as the table stayed open).
        root.ledger.new = 0.0
        self.closed = False

    def _close(self, now: float) -> None:
        """The open table's bucket is empty: from now on every request is decided in its tenant's pool, at the
        shares of the last reallocation before it opened (each a part of μ, followed as μ moves: see
        :class:`Share`); demand is measured from now. Their buckets refilled while the replica's admitted: they
        keep only their parts of what that one has left (the burst is spent; kept, a tenant that emptied the
        replica's bucket each time the table opened had its pool's burst too, and over a minute 1.28 times the
        capacity with a burst of 2 s of it, see :meth:`_open`)."""
        root = self.root
        left = max(0.0, root.pacer.tokens(now))
        if self.parent.bucket is not None:
            self.parent.bucket.cap(left, now)
        for pool in self.pools(now):
            pacer = pool.gate.pacer
            pacer.cap(left * pacer.burst / root.pacer.burst, now)
            pool.counts.clear()  # (what it asked before the table opened is no measure of it now)
            pool.spans.clear()
        self._credit.cap(left, now)  # (what pools woken from now on are given comes out of what is left too)
        self.closed = True
        self._last, self._calm = now, 0
        self.next_rebalance = now + self.tenancy.interval
