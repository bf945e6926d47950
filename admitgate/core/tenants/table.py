"""Tenants: a fair share of the capacity for each, and a retry schedule of its own.

Without tenants the gate is one pool, first come first served. With a
:class:`~admitgate.core.tenants.policy.Tenancy`, every established tenant has a pool: a
:class:`~admitgate.core.gate.Gate` of its own (token pacer, retry schedule, pacing and tarpit), whose rate the
:class:`Tenants` table sets. Tenants are known by name: the shell names each request once
(:mod:`admitgate.asgi.keys`), and the simulator names its clients' tenants itself. Every ``interval`` seconds the
table measures what each pool asked for (requests/s, rejected retries included, except those of clients back
before the time they were told: they ignore Retry-After, and what they ask is not demand to serve) and divides the
capacity among them by weighted max-min water-filling (:func:`~admitgate.core.fair.fair_shares`): a tenant asking
for less than its share gets what it asks, the rest is divided among the others by weight, and a lone tenant gets
all of it. Critical requests are charged to the capacity first (never shed), and only what they leave is divided.

A rejected client's Retry-After comes from its own pool: its place in its tenant's schedule, told at what
the tenant gets while it stays busy: the capacity less what the others use (their demand, at most their
*entitlement*, the weighted share of the capacity among the tenants asking), never less than its own
entitlement, which its share reaches as soon as its demand is measured. The clients holding places are
demand too. A tenant whose thousand clients stampede is spread over its own window, at what the others
leave; the tenant beside it that sent ten is not pushed back.

State is bounded. A key becomes a tenant with a pool once it has sent ``establish`` requests within
``window`` seconds and fewer than ``max_tenants`` pools exist; until then it shares one *newcomers*
pool, which competes as one tenant. A flood of a million new keys therefore takes one share, not the
established tenants' shares, and the keys it counts live in a bounded store (evicted oldest first).
Pools idle for ``idle`` seconds expire.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
from collections.abc import Callable, Hashable, Sized

from ..decision import ADMITTED, Decision, Identify, Verdict
from ..gate import Gate
from ..pacer import TokenPacer
from ..priority import Priority
from .policy import MAX_NAME, NEWCOMERS
from .pool import Candidate, Pool
from .reallocation import Reallocation
from .tuning import ROUNDING
from .waking import Waking


class Tenants(Reallocation, Waking):
    """The table of pools behind one :class:`~admitgate.core.gate.Gate` (the *root*, whose rate is the capacity μ).

    ``tenancy``: the settings; ``reserve``: the largest reserve among the classes in use (a fraction of a burst; the
    middleware passes its classes'), which a request going in on the replica's bucket alone leaves there (see
    :class:`~admitgate.core.ledger.Parent`); ``tuning``: the fair share's constants. A
    :class:`~admitgate.core.decision.Decider`: :meth:`admit` decides a request like :meth:`Gate.admit`, in its
    tenant's pool, and :meth:`end_hold` ends the holds it returns.
    """

    # -- decisions ------------------------------------------------------------------------
    def admit(self, cost: float, priority: Priority, now: float, identify: Identify,
              tenant: str | None = None) -> Decision:  # fmt: skip
        """Decide one request in the pool of its ``tenant`` (critical ones on the root: never shed, charged first)."""
        root = self.root
        if now >= root.next_refresh:
            root.refresh(now)
            self.follow(now)
        if priority.critical:  # (charged first: the pools' shares are what it leaves, and so is the replica's bucket)
            bucket = self.parent.bucket
            if bucket is not None:
                bucket.charge(cost, now)
            return root.admit(cost, priority, now, identify)
        if now >= self.next_rebalance:
            self.rebalance(now)
        if not self.closed:  # open: the replica's bucket, as Gate.admit's first branch takes it, or close
            pacer = root.pacer
            if not root.full and pacer.try_take(cost, now, priority.reserve * pacer.burst):
                return ADMITTED
            self._close(now)  # (no token, or no room in flight: contended either way, so the pools decide)
        name = tenant
        pool = self.pool_of(name, now)
        if not pool.awake:
            pool.unit = cost  # (what one request of it costs: see FairTuning.lone)
            self._activate(pool, now)
        stats, pacer, schedule = pool.gate.stats, pool.gate.pacer, pool.gate.schedule
        early, overflow, seen, held = stats.early, stats.overflow, pacer.taken + pacer.asked, schedule.holders
        spare = stats.spare
        decision = pool.gate.admit(cost, priority, now, identify)
        below = root.ledger
        below.delegated += pacer.taken + pacer.asked - seen  # (none on spare: a shared budget has no bucket here)
        self.spare += stats.spare - spare
        below.held += schedule.holders - held  # (a shared budget leases for the pools' places)
        if stats.early == early:  # a client back before its time ignores Retry-After: that is no demand to serve
            pool.asked += cost
            if pool is self.newcomers and name is not None:
                self._asked_for(name, cost, now)
        if decision.verdict is Verdict.REJECT:
            pool.rejected += 1
            self.rejections += 1
            root.stats.overflow += stats.overflow - overflow  # counted with the root's, as pacing is (metrics)
            if pool.demand <= pool.share.value * pool.share.scale * (1.0 + ROUNDING):
                # It turns clients away at or below the demand it was measured at: its demand has surged since (a
                # herd landing on it). Measure it again soon, not up to a whole interval from now: until then it
                # keeps the rate of its old demand (a herd's tenant woke at a third of the capacity, beside the
                # newcomers' pool and a small tenant, and held the first wave at that rate; a pool kept awake at a
                # token per period, given exactly what it asks, waited for the regular reallocation).
                soon = self._last + self.tenancy.interval * self.tuning.early
                self.next_rebalance = min(self.next_rebalance, max(now, soon))
        return dataclasses.replace(decision, pool=pool.gate) if decision.delay else decision

    def try_take(self, cost: float, now: float, tenant: str | None = None) -> bool:
        """:meth:`admit`'s answer for a plain request of ``tenant`` that its pool admits at once (a token free,
        nobody holding a place, no refresh or reallocation due), without the Decision: True when taken. While the
        table is open, the replica's bucket's answer (as :meth:`Gate.try_take`). False for anything else, having
        changed nothing :meth:`admit` would not (a refill): :meth:`admit` decides it then.
        This is the admit path with tenants; it must agree with :meth:`admit` (tested side by side)."""
        root = self.root
        bound = root.bound  # (root.full, inlined)
        if now >= root.next_refresh or (bound is not None and bound.inflight - bound.answered >= bound.limit):
            return False
        if not self.closed:  # open: the replica's bucket, as Gate.admit's first branch takes it
            return root.pacer.try_take(cost, now)
        if now >= self.next_rebalance:
            return False
        if tenant is None:
            pool = self.newcomers
        else:  # (self._pools.get, inlined, by subscript, not a call: an expired entry is left for admit to drop)
            try:
                expiry, pool = self._entries[tenant]
            except KeyError:
                return False
            if expiry <= now:
                return False
        if not pool.awake or now >= pool.gate.next_refresh or pool.book:
            return False
        guard = self.parent.bucket  # (the replica's bucket too: see Parent)
        if guard is None:
            if not pool.take(cost, now):
                return False
        else:  # a token from each bucket or from neither: guard.try_take, then the pool's, inlined (a Python call
            # costs some 400 instructions: with two, the closed table read 0.923 of bare). Each refills as try_take
            # refills it; the replica's bucket counts no `taken` (nobody reads it).
            if now >= guard._until:  # (beyond a shared budget's grant: admit decides)
                return False
            theirs = guard._tokens + (now - guard._updated) * guard._rate
            if theirs > guard._burst:
                theirs = guard._burst
            guard._updated = now
            spare = theirs - cost
            if spare < 0.0:  # (the pool's bucket untouched, as when guard.try_take declined)
                guard._tokens = theirs
                return False
            me = pool.pacer
            if now >= me._until:
                guard._tokens = theirs
                return False
            mine = me._tokens + (now - me._updated) * me._rate
            if mine > me._burst:
                mine = me._burst
            me._updated = now
            left = mine - cost
            if left < 0.0:  # (the replica's token given back: guard.give)
                me._tokens, guard._tokens = mine, theirs
                return False
            me._tokens, guard._tokens = left, spare
            me.taken += 1
        pool.asked += cost
        self._below.delegated += 1
        return True

    def end_hold(self, decision: Decision, now: float, gone: bool = False) -> Decision | None:
        """End a hold the table returned (see :meth:`Gate.end_hold`): its pool's gate ends it, after the root's rate
        is refreshed when due (the pools' shares follow it), and the root's ledger counts what it asked."""
        root, pool = self.root, decision.pool
        if not isinstance(pool, Gate) or pool is root:
            return root.end_hold(decision, now, gone)
        if now >= root.next_refresh:
            root.refresh(now)
        bucket = pool.parent.bucket if pool.parent is not None else None  # (the replica's, at the root's rate)
        if bucket is not None and bucket.rate != root.pacer.rate and root.backend is None:
            bucket.set_grant(root.pacer.rate, now)
        overflow, pacer, held = pool.stats.overflow, pool.pacer, pool.schedule.holders
        seen = pacer.taken + pacer.asked
        after = pool.end_hold(decision, now, gone)
        root.stats.overflow += pool.stats.overflow - overflow  # counted with the root's, as pacing is
        below = root.ledger
        below.delegated += pacer.taken + pacer.asked - seen  # (a returner let in reserves its token now)
        below.held += pool.schedule.holders - held
        return dataclasses.replace(after, pool=pool) if after is not None and after.delay else after

    def pool_of(self, name: str | None, now: float) -> Pool:
        """``name``'s pool, established on its ``establish``-th request within ``window``; else the newcomers'."""
        if name is None:
            return self.newcomers
        pool = self._pools.get(name, now)
        if pool is not None:
            return pool
        tenancy = self.tenancy
        candidate = self._candidates.get(name, now)
        if candidate is None:
            candidate = Candidate(self._round, now)
            self._candidates.put(name, candidate, now + tenancy.window, now)
        candidate.requests += 1
        if candidate.requests < tenancy.establish or len(self._pools) >= tenancy.max_tenants:
            return self.newcomers
        self._candidates.pop(name, now)
        pool = self._pool(name, tenancy.weight(name), now)
        self._pools.put(name, pool, now + tenancy.idle, now)
        # What the newcomers' pool asked for its requests before this one in this interval is its own demand.
        # Left there, a herd's first requests made the newcomers' pool ask as much as the herd's tenant for a
        # reallocation or two, and the herd was told Retry-After by what that left (up to 22 s where 11 s does,
        # in a test). Only that: its requests in an earlier interval were measured there already, and its early
        # returns were never counted (taken by their number instead, a key took the other newcomers' demand).
        if candidate.round == self._round:
            newcomers = self.newcomers
            moved = min(newcomers.asked, candidate.asked)
            newcomers.asked -= moved
            pool.asked += moved
        else:
            candidate.before += candidate.asked
        # What it asked before this interval, since its first request, is the start of its history: a new pool's
        # demand is measured over it, not over the moment since the last reallocation alone. (Without it, fifty light
        # tenants established beside a busy one, each one request in 0.05 s, were measured at 20/s: the busy pool was
        # cut to its entitlement, and the table admitted 30 % of the capacity for three seconds.)
        if candidate.before > 0 and self._last > candidate.since:
            pool.counts.append(candidate.before)
            pool.spans.append(self._last - candidate.since)
        return pool

    def _asked_for(self, name: str, cost: float, now: float) -> None:
        """The newcomers' pool asked ``cost`` for candidate key ``name`` (its pool, once established, takes it)."""
        candidate = self._candidates.get(name, now)
        if candidate is None:  # (forgotten: evicted, or the table is full)
            return
        if candidate.round != self._round:
            candidate.before += candidate.asked
            candidate.asked, candidate.round = 0.0, self._round
        candidate.asked += cost

    def wait_room(self, wake: Callable[[], bool]) -> None:
        """A hold in any pool waits for the replica's room in flight (the pools' gates read the root's probes)."""
        self.root.wait_room(wake)

    def room_freed(self) -> None:
        self.root.room_freed()

    def wait_landing(self, wake: Callable[[], bool], position: float) -> None:
        """A hold in any pool waits for the replica's shared budget (the root's) to find the fleet's backlog landed."""
        self.root.wait_landing(wake, position)

    @property
    def waiting_for_room(self) -> Sized:
        return self.root.waiting_for_room

    def limit_of(self, tenant: str | None, now: float) -> tuple[TokenPacer, float]:
        """The bucket of ``tenant`` and its entitlement, requests/s (an admitted response's fields)."""
        if not self.closed:  # (the replica's bucket decides: its fields)
            return self.root.pacer, self.root.pacer.rate
        pool = (None if tenant is None else self._pools.get(tenant, now)) or self.newcomers
        return pool.gate.pacer, pool.share.entitlement

    def top(self, k: int, now: float) -> list[tuple[str, int, float]]:
        """The ``k`` tenants with the most rejections: (name, rejections, share in requests/s), the newcomers'
        pool as ``"newcomers"``. O(n log k) in the pools, for a scrape, never per request."""
        pools = (*self._pools.live(now), self.newcomers)  # read-only: a scrape may run on another thread
        ranked = heapq.nlargest(k, (p for p in pools if p.rejected), key=lambda pool: pool.rejected)
        return [(self.label(p.name), p.rejected, p.share.value) for p in ranked]

    def label(self, name: Hashable) -> str:
        """How metrics name tenant ``name``: ``Tenancy.label`` of it, else a digest (a name may be a secret)."""
        if name is NEWCOMERS:
            return "newcomers"
        label = self.tenancy.label
        if label is not None:
            try:
                return str(label(str(name)))[:MAX_NAME]
            except Exception:  # a user function must not fail a scrape: fall back to the digest
                pass
        return "#" + hashlib.blake2b(str(name).encode(), digest_size=6).hexdigest()

    def __len__(self) -> int:
        return len(self._pools)

    def __repr__(self) -> str:
        return f"Tenants({len(self._pools)} pools, {self._available:g}/s to share)"
