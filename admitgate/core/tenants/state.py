"""What a tenants' table keeps, and the rules every part of it shares: a pool's entitlement, promise, burst and
first tokens, and the replica's bucket following μ. :class:`~admitgate.core.tenants.table.Tenants` is built on it,
with the reallocation (:mod:`~admitgate.core.tenants.reallocation`) and the wake-ups between reallocations
(:mod:`~admitgate.core.tenants.waking`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable

from ..errors import ConfigError
from ..gate import Gate
from ..keystore import BoundedExpiringMap
from ..ledger import Parent
from ..pacer import TokenPacer
from ..settings import MIN_RATE
from .policy import NEWCOMERS, Tenancy
from .pool import Candidate, Pool
from .share import Share, Split
from .tuning import FAIR, FairTuning

#: The golden ratio's fractional part: the step of the low-discrepancy sequence of a waking pool's first token.
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


class TableState:
    """The pools behind one root :class:`~admitgate.core.gate.Gate`, and what their shares are measured against.
    See :class:`~admitgate.core.tenants.table.Tenants` for the arguments."""

    def __init__(self, tenancy: Tenancy, root: Gate, *, reserve: float = 0.5, now: float = 0.0,
                 tuning: FairTuning = FAIR) -> None:  # fmt: skip
        if not isinstance(tenancy, Tenancy):
            raise ConfigError("tenants", "must be an admitgate.Tenancy", tenancy)
        self.tenancy, self.root, self.tuning = tenancy, root, tuning
        self._below = root.ledger  # (what the pools carry, as the root's shared budget reads it; bound once)
        self._pools: BoundedExpiringMap[Pool] = BoundedExpiringMap(tenancy.max_tenants)
        self._entries = self._pools.data  # (for try_take: a pool's entry by subscript, its expiry checked there)
        self._candidates: BoundedExpiringMap[Candidate] = BoundedExpiringMap(tenancy.max_tenants)
        self._phase = 0.0  # the last fraction _start gave
        #: what pools waking (or new) are given their first tokens from (see _start): the root's burst, refilled
        #: at what no pool is assigned (see _refill_credit)
        self._credit = TokenPacer(root.pacer.rate, root.pacer.burst, now=now)
        #: the pools' tie to the replica, one for all (see :class:`~admitgate.core.ledger.Parent`): its bucket, for the
        #: pools and critical requests (the pools' rates sum to μ, but their buckets, each at least a token, may hold
        #: more between them than the replica's burst), and what going in on it alone leaves there: ``reserve`` is
        #: the largest class reserve in use (the default classes': ``sheddable``'s 0.5)
        debt = max(root.pacer.burst, root.pacer.rate * root.max_pacing_delay)  # (reservations: within their windows)
        bucket = TokenPacer(root.pacer.rate, root.pacer.burst, now=now, max_debt=debt)
        self.parent = Parent(bucket, max(root.tuning.spare, reserve))
        self._round = 0  # reallocations so far (the interval the newcomers' pool's ``asked`` is of)
        self._settings = dataclasses.replace(root.settings, burst=None)
        self._active_weight = 0.0  # the weight of the pools that asked in the last interval
        self._assigned = 0.0  # the sum of the pools' rates, requests/s
        self._used = 0.0  # the sum of the pools' uses (Pool.use), requests/s, in what Retry-After is told by
        self._mu = root.pacer.rate  # μ as of the last reallocation, requests/s (the pools' shares are of it)
        self._available = root.pacer.rate  # μ less critical traffic, requests/s, as of the last reallocation
        #: what Retry-After is told by over ``_available`` (see rebalance), as of the last reallocation
        self._scale = 1.0
        self._told = self._available  # what Retry-After is told by, as of the last reallocation (see rebalance)
        self._split = Split()  # the pools' shares, kept and not (see Share.scale)
        self._critical = root.stats.critical
        self._last = now
        self.next_rebalance = now + tenancy.interval
        self.newcomers = self._pool(NEWCOMERS, tenancy.newcomer_weight, now)
        #: pools whose rate was above what they use at the last reallocation, most to spare last (a waking
        #: pool takes back from them); at first the newcomers' pool, which holds all of the capacity
        self._spare: list[Pool] = [self.newcomers]
        #: the awake pool given the most per weight at the last reallocation: a light tenant waking takes its rate
        #: from it (see _borrow)
        self._lender: Pool | None = None
        #: False while the table is open (``Tenancy.open_below``): the replica's bucket decides. It starts closed:
        #: the tenants are established and measured before it first opens, so that a herd closing it finds them
        #: there (opened at once, a small tenant met the herd as a newcomer).
        self.closed = True
        self.rejections = 0  #: requests the pools rejected so far
        #: requests the pools admitted on the replica's bucket alone, what the others left there, so far
        self.spare = 0
        self._rejections = 0  # as of the last reallocation
        self._calm = 0  # reallocations in a row that found the tenants asking little, nobody turned away or held

    def _pool(self, name: Hashable, weight: float, now: float) -> Pool:
        entitlement = max(self._entitlement(weight, self._active_weight + weight), MIN_RATE)
        share = Share(entitlement, entitlement, self.root.growth, self.root, self._mu, self._split)
        self._split.rest += entitlement
        self._split.low = min(self._split.low, entitlement / weight)
        gate = Gate(share, self._settings, now=now, tuning=self.root.tuning)  # (its probes: the root's, see Share)
        if name is not NEWCOMERS:  # (the first pool holds the root's burst; the others are given theirs as they wake)
            gate.pacer.cap(0.0, now)
        gate.parent = self.parent  # (what it admits is the replica's too; its rate moves with the shares)
        gate.stats.pacing = self.root.stats.pacing  # and its holds are counted with the root's (metrics read it)
        return Pool(name, weight, gate, share, self.tuning.history)

    def _entitlement(self, weight: float, total: float) -> float:
        return self._available * weight / total if total > 0 else self._available

    def _promise(self, entitlement: float, others: float) -> float:
        """What a pool is told Retry-After by, requests/s: what the replica's clients are told by less what the
        ``others`` use (requests/s: their demand, at most their entitlement, scaled to what is told), or its own
        ``entitlement`` (in the capacity's units) scaled likewise, whichever is more. With a shared budget a pool
        is thus told what it would be told without one, were the capacity the replica's share of the fleet's H.
        (With the others' use capped in the lease's units and then scaled, a herd whose first requests made the
        newcomers' pool ask 6/s of an idle 10/s lease was told by half of the share: 200 of 400/s on the fleet
        herd, which drained at 1.4-1.5 of its bound.)"""
        return max(entitlement * self._scale, self._told - others)

    def _refill_credit(self, now: float) -> None:
        """From ``now`` the wake-up credit refills at what no pool is assigned (``_available`` less ``_assigned``,
        requests/s, at least ``MIN_RATE``), as of the last reallocation or wake-up: the pools' buckets refill at
        their rates, which sum to what is assigned, and the credit is the rest of the one bucket, not a second.

        Refilled at all of μ beside them, it would be a second bucket: tenants waking one after another would each
        be given up to a burst from it, together admitted beyond rate·t + burst. The cost: while the pools hold all
        of the capacity, used or not, the credit stays empty,
        and a tenant waking then has its first request held for less than one token's time at its rate."""
        self._credit.set_rate(max(MIN_RATE, self._available - self._assigned), now)

    def follow(self, now: float) -> None:
        """The replica's bucket (``parent.bucket``) refills at μ now, with the replica's burst (its debt, the holds
        reserved on it, stands: a rate cut starts no epoch there); with a shared budget there is none (the lease
        bounds the replica, and the pools keep their shares until the next reallocation). Called as the root
        refreshes, and by the middleware once a shared budget is attached."""
        guard, pacer = self.parent.bucket, self.root.pacer
        if guard is None:
            return
        if self.root.backend is not None:
            self.parent.bucket = None  # (for every pool: they share this parent)
            return
        if guard.rate != pacer.rate:
            guard.set_grant(pacer.rate, now)
        if guard.burst != pacer.burst:
            guard.set_burst(pacer.burst, now)

    def _burst(self, rate: float) -> float:
        """A pool's bucket: its part of the root's burst, at least one token. ``rate`` is a share of μ as of the
        last reallocation (see :class:`Share`): its part is of that μ, not of the root's rate now (after μ halved,
        a pool woken between reallocations and the one it reclaimed from were given twice their parts)."""
        return max(1.0, self.root.pacer.burst * rate / self._mu)

    def gates(self, now: float) -> list[Gate]:
        """Every live pool's gate, the newcomers' last (read-only: for a metrics scrape)."""
        return [pool.gate for pool in (*self._pools.live(now), self.newcomers)]

    def pools(self, now: float) -> list[Pool]:
        """Every live pool, the newcomers' last."""
        return [*self._pools.values(now), self.newcomers]

    def _start(self, pool: Pool, now: float, passed: float = 0.0) -> None:
        """Give a pool woken (or new) the tokens it starts with: those ``passed`` to it by the pools it took its
        rate from (see :meth:`_reclaim`), then its part of the burst from the table's wake-up credit (see
        :meth:`_refill_credit`) if the credit holds a token, else a fraction of one token, the next of a
        low-discrepancy sequence.

        Not a full bucket of its own: 500 tenants' first requests at once were each admitted from its own pool's
        bucket, beyond rate·t + burst (520 in a second at 200/s, in the simulator's herd across 500 tenants:
        300-500 5xx). Not an empty one either: pools woken together at equal shares would all have their first
        token at the same instant, and their clients' first places with them (a schedule's first place comes due
        when its bucket's debt is repaid), so their returns came back as one wave (1,000 5xx). Staggered, the
        first tokens of pools woken together are spread over their spacing."""
        pacer, credit = pool.gate.pacer, self._credit
        pacer.cap(0.0, now)
        pacer.give(passed, now)  # (what the pools it took its rate from gave up: see _reclaim)
        part = min(pacer.burst - pacer.tokens(now), credit.tokens(now))
        if part >= 1.0 and credit.try_take(part, now):
            pacer.give(part, now)
        else:
            self._phase = (self._phase + GOLDEN) % 1.0
            pacer.give(self._phase, now)
