"""Tenants: a fair share of the capacity for each, and a retry schedule of its own.

Without a tenant key the gate is one pool, first come first served. With one (:class:`Tenancy`), every
established tenant has a pool: a :class:`~admitgate.core.gate.Gate` of its own (token pacer, retry schedule,
pacing and tarpit), whose rate the :class:`Tenants` table sets. Every ``interval`` seconds the table
measures what each pool asked for (requests/s, rejected retries included, except those of clients back
before the time they were told: they ignore Retry-After, and what they ask is not demand to serve) and
divides the capacity among them by weighted max-min water-filling (:func:`~admitgate.fair.fair_shares`): a tenant asking
for less than its share gets what it asks, the rest is divided among the others by weight, and a lone
tenant gets all of it. Critical requests are charged to the capacity first (never shed), and only what
they leave is divided.

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
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError, function, integer, number
from ..core.fair import fair_shares
from ..core.gate import ADMITTED, SPARE, Decision, Gate, Identify, Verdict
from ..core.keystore import BoundedExpiringMap
from ..core.pacer import EPOCH_CUT, TokenPacer
from ..core.priority import Priority
from ..core.probes import Probes
from ..core.rate import RateReading
from ..core.settings import MIN_RATE
from .identity import client_address, header_key

Scope = Any  # an ASGI scope
TenantFunc = Callable[[Scope], "str | None"]

#: The pool of keys not established yet (and of requests with no tenant key). Not a string: no key collides.
NEWCOMERS = ("newcomers",)
#: Tenant names longer than this (characters) are known by a digest of them.
MAX_NAME = 128
#: What a pool is counted to use (in the others' promises, and before a waking pool takes its unused rate): its
#: demand times this, plus one request/s (room for its demand to grow, and for random arrivals above their mean).
SLACK = 1.25
#: A pool's measured demand moves this fraction of the way to each interval's count (an exponential average:
#: a rate moved by noise would move its pacer's queued reservations, and cut the last of them short)...
SMOOTHING = 0.3
#: ... unless the newest interval's count is this many times the average (a surge: believed at once), or the
#: count over the last ``SPAN`` intervals is this many times less (a fall: believed at once).
SURGE = 1.5
#: ... but never from a single request: the cost asked over ``SPAN`` intervals must be more than this many times the
#: cost of the request that last woke the pool (a route's ``cost``: one request of cost 2 is one request).
LONE = 1.0
#: Intervals a fall is judged over: a tenant whose clients come in bursts (held together, sent back
#: together) asks nothing for an interval or two between them, and must not lose its share each time.
SPAN = 3
#: Reallocations whose counts a pool keeps: enough for ``SPAN`` intervals while the shares are recomputed every
#: tenth of one (wake-ups' and surges' early reallocations; see :func:`_rates`).
HISTORY = 32
#: ... or this many of its places' spacing at its entitlement, if that is longer: a pool whose clients hold
#: places and come back seconds apart still asks (see :meth:`Tenants.rebalance`).
RETURNS = 2.0
#: The golden ratio's fractional part: the step of :meth:`Tenants._start`'s sequence.
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
#: A pool that wakes up to find its share held by the others has the shares recomputed within this fraction
#: of the interval (so at most 1/EARLY reallocations per interval, however many pools wake).
EARLY = 0.1
#: A pool asking less often than every ``SPAN`` intervals keeps a token per period (its period between requests)
#: until this many periods pass without it asking (see :meth:`Tenants.rebalance`).
PERIODS = 1.5
#: A weight is a number in (0, MAX_WEIGHT].
MAX_WEIGHT = 1e6
#: Critical traffic never leaves less than this share of the capacity to divide among tenants.
MIN_SHARE = 0.05


def _name(value: str) -> str:
    return value if len(value) <= MAX_NAME else "#" + hashlib.blake2b(value.encode(), digest_size=16).hexdigest()


def _named(user: TenantFunc) -> TenantFunc:
    """A user's key function whose names are made what the built-in keys give: a string, long ones hashed."""

    def named(scope: Scope) -> str | None:
        found = user(scope)
        return _name(found) if isinstance(found, str) else None

    return named


def tenant_key(spec: str | TenantFunc, trusted_hops: int = 0, forwarded: str = "x-forwarded-for") -> TenantFunc:
    """``"header:<name>"`` (the header's value), ``"address"`` (the client address, behind ``trusted_hops``
    proxies) or a function ``scope -> tenant name or None``. A request with no tenant name is a newcomer."""
    if callable(spec):
        return function("tenant", spec, {}, kind="a function scope -> tenant name")  # type: ignore[return-value]
    if spec == "address":

        def address(scope: Scope) -> str | None:
            found = client_address(scope, trusted_hops, forwarded)
            return None if found is None else _name(found)

        return address
    if isinstance(spec, str) and spec.startswith("header:"):
        header_key(spec[len("header:") :])  # validates the header name
        raw = spec[len("header:") :].strip().lower().encode("ascii")

        def header(scope: Scope) -> str | None:
            value = None
            for k, v in scope.get("headers") or ():
                if k == raw:
                    value = v if value is None else value + b", " + v  # (several lines: one list, RFC 9110)
            if not value:
                return None
            name = value.decode("latin-1")
            return name if len(name) <= MAX_NAME else _name(name)  # (_name, inlined for the common case)

        header.raw = raw  # type: ignore[attr-defined]  # (the header's name, lower-case: Tenants.take reads it)
        return header
    raise ConfigError("key", "must be 'address', 'header:<name>' or a function scope -> tenant name", spec)


@dataclass(frozen=True, slots=True)
class Tenancy:
    """Who the tenants are and how the capacity is divided among them. Times in seconds.

    ``key``: ``"header:<name>"`` (such as an API key), ``"address"`` or a function ``scope -> name``.
    ``weights``: tenant name or class name -> weight (default 1). ``classify``: a function ``name -> class
    name`` (or None) whose class's weight applies when the name itself has none. ``max_tenants``: most pools
    at once. ``establish``: requests within ``window`` that make a key a tenant (until then it is a
    newcomer). ``newcomer_weight``: the weight of the newcomers' pool. ``newcomer_share``: under overload the
    newcomers' pool is given at least this share of the capacity, up to what it asks, however many tenants there
    are (its one weighted share may be less), and the tenants share the rest. ``interval``: how often the shares
    are recomputed. ``idle``: a pool that asks nothing for this long expires. ``label``: a function ``name ->
    label`` naming a tenant in metrics (the most rejected ones are exported); by default a digest of the name,
    since a tenant key is often a secret (an API key): ``label=str`` shows names as they are.
    ``open_below``: while the tenants together ask for less than this share of the capacity (for ``SPAN``
    intervals, nobody turned away, held or holding a place), the table is *open*: a request is admitted from
    the replica's bucket without looking its tenant up (there is nothing to share out), until one finds that
    bucket empty. 0 keeps the table closed: every request is decided in its tenant's pool.

        Tenancy(key="header:x-api-key", weights={"premium": 3}, classify=lambda name: plans.get(name))
    """

    key: str | TenantFunc = "header:x-api-key"
    weights: Mapping[str, float] = field(default_factory=dict)
    classify: Callable[[str], str | None] | None = None
    max_tenants: int = 10_000
    establish: int = 3
    window: float = 5.0
    newcomer_weight: float = 1.0
    newcomer_share: float = 0.1
    interval: float = 0.5
    idle: float = 30.0
    label: Callable[[str], str] | None = None
    open_below: float = 0.5

    def __post_init__(self) -> None:
        tenant_key(self.key)
        if not isinstance(self.weights, Mapping):
            raise ConfigError("weights", "must be a mapping of tenant or class name -> weight", self.weights)
        for name, weight in self.weights.items():
            if not isinstance(name, str):
                raise ConfigError("weights", "names must be strings", name)
            number(f"weights[{name!r}]", weight, 0.0, MAX_WEIGHT, above=True)
        object.__setattr__(self, "weights", dict(self.weights))
        if self.classify is not None:
            function("classify", self.classify, "", kind="a function tenant name -> class name")
        if self.label is not None:
            function("label", self.label, "", kind="a function tenant name -> label")
        integer("max_tenants", self.max_tenants, 1, 10_000_000)
        integer("establish", self.establish, 1, 1_000_000)
        number("window", self.window, 0.0, 3600.0, above=True, unit="seconds")
        number("newcomer_weight", self.newcomer_weight, 0.0, MAX_WEIGHT, above=True)
        number("newcomer_share", self.newcomer_share, 0.0, 0.9)
        number("interval", self.interval, 0.0, 60.0, above=True, unit="seconds")
        number("idle", self.idle, 0.0, 86_400.0, above=True, unit="seconds")
        number("open_below", self.open_below, 0.0, 1.0)

    def weight(self, name: str) -> float:
        """The weight of tenant ``name``: its own, else its class's, else 1."""
        weight = self.weights.get(name)
        if weight is None and self.classify is not None:
            try:
                kind = self.classify(name)
            except Exception:  # a user function must not fail a request: the tenant weighs 1
                kind = None
            weight = self.weights.get(kind) if isinstance(kind, str) else None
        return 1.0 if weight is None else weight


class Share:
    """A pool's rate source (a :class:`~admitgate.limit.capacity.Capacity` its gate reads): ``value``, its share
    of the capacity ``basis`` (both requests/s, as of the last reallocation), which its pacer refills at scaled
    by what the ``root``'s rate is now over ``basis``; the ``capacity`` its Retry-After is told at (see
    :meth:`Pool.set_share`), its ``entitlement`` (its weighted share among the tenants asking: the ``q`` its
    rate-limit fields show), and ``whole``: how many times the replica's share the fleet's H is, with a shared
    budget (1 without), so that in an outage the pool expects back its part of the fleet's H (see
    :attr:`Gate.whole`).

    A live estimator's start-up doubles μ in a second: pools that followed it only at each reallocation held
    admissions below the rate it was testing, so it grew on (to 1.5 times the capacity in the simulator's
    tenant herd) and then drained the queue it had built. With a shared budget the root's rate is its lease,
    which moves with every grant (10/s between herds): there the pools keep their shares until the next
    reallocation (followed, the fleet's tenant herd drained at 1.17-1.19 where it drains at 1.13-1.14).

    A cut follows max-min fairness, not the proportion: it comes out of the pools the last reallocation could not
    give all they asked (``kept`` False), and a pool given all it asked keeps its rate while those pools, per weight,
    are still left more than it has (see :class:`Split`). Cut in proportion, a small tenant beside a herd's was cut
    below what it asked at each of the estimator's re-measurements (¾ of μ for a few tenths of a second) and drains,
    its paced requests outran their window, and one was turned away."""

    __slots__ = ("basis", "capacity", "entitlement", "growth", "kept", "root", "split", "value", "whole")

    def __init__(self, value: float, capacity: float, growth: float, root: Gate, basis: float,
                 split: Split | None = None) -> None:  # fmt: skip
        self.value, self.capacity, self.entitlement, self.growth = value, capacity, capacity, growth
        self.root, self.basis = root, basis
        self.whole = 1.0
        self.split = split
        self.kept = False  #: the last reallocation gave it all it asked

    def rate(self, now: float) -> float:
        return self.value * self.scale

    def read(self, now: float) -> RateReading:
        """Its pool's reading: its rate now; in an outage when the root is (see :attr:`Gate.collapsed`: a pool's share
        cut as other tenants wake is none, but its low H is waited out at its peak as an outage's is, since the share
        comes back as they drain)."""
        return RateReading(self.value * self.scale, self.capacity, self.growth, self.root.collapsed, self.whole)

    def state(self) -> None:
        return None

    @property
    def probes(self) -> Probes | None:
        """The root's: one service (a pool that paces or rejects tells the estimator so)."""
        return self.root.probes

    @property
    def scale(self) -> float:
        """What turns a share into requests/s now (1 with a shared budget): the root's rate now over ``basis``, but
        for a cut, which comes out of the pools not ``kept`` first (see :class:`Split`)."""
        root = self.root
        if self.basis <= 0 or root.backend is not None:
            return 1.0
        ratio = root.pacer.rate / self.basis
        split = self.split
        if ratio >= 1.0 or split is None or split.rest <= 0 or split.held <= 0:
            return ratio
        left = 1.0 - (split.held + split.rest) * (1.0 - ratio) / split.rest  # what the others keep of theirs
        if not left > 0 or left * split.low < split.high:  # less per weight than a kept pool has: in proportion
            return ratio
        return 1.0 if self.kept else left

    def unkeep(self, weight: float) -> None:
        """Count it (of ``weight``) among the pools a cut comes out of (see :class:`Split`)."""
        split = self.split
        if self.kept and split is not None:
            split.held -= self.value
            split.rest += self.value
            split.low = min(split.low, self.value / weight)
        self.kept = False


class Split:
    """The pools' shares as the last reallocation gave them, requests/s in the shares' units: ``held`` in the pools
    given all they asked (:attr:`Share.kept`), ``rest`` in the others; ``high``, the most a kept pool was given per
    weight, and ``low``, the least any other was. Between reallocations the pools' rates sum to the root's rate
    (their sum scaled by it) as before, but a cut comes out of ``rest``: the kept pools keep theirs while the
    others are left at least ``high`` per weight (max-min fairness's water level, which a cut lowers, stays above
    them), and below that all are cut in proportion. ``held`` and ``rest`` follow each share set between
    reallocations (:meth:`Pool.set_share`); whatever they miss (a pool dropped from the table) the replica's bucket
    (:attr:`Gate.guard`) bounds, as every pool's admissions are charged there too."""

    __slots__ = ("held", "high", "low", "rest")

    def __init__(self) -> None:
        self.held = self.rest = self.high = 0.0
        self.low = math.inf


class Candidate:
    """A key not established yet: its ``requests`` within ``Tenancy.window`` since its first at ``since`` (seconds),
    the cost the newcomers' pool ``asked`` for them in reallocation interval number ``round``, and ``before`` it."""

    __slots__ = ("asked", "before", "requests", "round", "since")

    def __init__(self, round: int, since: float) -> None:
        self.requests, self.asked, self.round, self.since, self.before = 0, 0.0, round, since, 0.0


def _rates(
    counts: deque[float], spans: deque[float], interval: float, unit: float = 1.0
) -> tuple[float, float | None, bool]:
    """What a pool asked, requests/s, from the cost it asked between each of its last reallocations (``counts``,
    latest last) and their lengths (``spans``, seconds; the latest is never 0): ``(recent, span, lone)``.
    ``recent`` is over the latest of them back to ``interval`` seconds, or over all it has if less (a new pool's
    history, or one since the table closed); a surge is believed from it at once. ``span`` is over them back to
    ``SPAN`` intervals, and a fall is judged from it; None with less history than that (a fall is not believed
    from it: cleared at a close, a pool asking every 0.5 s was judged on the 0.19 s since, and put to sleep).
    ``lone``: ``span`` is known and is of one request's cost at most (``LONE`` × ``unit``, the cost of a request, in
    tokens): one request is no rate to believe at once (see :meth:`Tenants.rebalance`).

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
        if length >= SPAN * interval:
            return recent if recent is not None else count / length, count / length, count <= LONE * unit
    return count / length if recent is None else recent, None, False


class Pool:
    """One tenant's gate and its demand meter (requests/s asked, rejected retries included)."""

    __slots__ = ("asked", "awake", "book", "counts", "demand", "gate", "name", "pacer", "period", "rejected", "seen",
                 "share", "spans", "take", "unit", "use", "weight")  # fmt: skip

    def __init__(self, name: Hashable, weight: float, gate: Gate, share: Share) -> None:
        self.name, self.weight, self.gate, self.share = name, weight, gate, share
        # bound once for Tenants.take, as the middleware binds the root's
        self.book, self.take, self.pacer = gate.schedule.book, gate.pacer.try_take, gate.pacer
        self.asked = 0.0  #: cost asked since the last reallocation, tokens
        self.demand = 0.0  #: requests/s asked, as of the last reallocation
        self.rejected = 0  #: rejections so far
        self.seen = -math.inf  #: the last reallocation that found it had asked, seconds
        self.period = 0.0  #: seconds between the reallocations that found it had asked (a moving average; 0: not known)
        self.awake = False  #: it has asked since it was last idle at a reallocation
        self.counts: deque[float] = deque(maxlen=HISTORY)  #: cost asked between each of the last reallocations
        self.spans: deque[float] = deque(maxlen=HISTORY)  #: and their lengths, seconds
        self.use = 0.0  #: requests/s the others' promises count it to take: its demand, at most its entitlement (told)
        self.unit = 1.0  #: the cost of the request that last woke it, tokens (one request's worth: see LONE)

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


class Tenants:
    """The table of pools behind one :class:`~admitgate.core.gate.Gate` (the *root*, whose rate is the capacity μ).

    ``tenancy``: the settings; ``trusted_hops``, ``forwarded``: how ``"address"`` finds the client (from
    :class:`~admitgate.identity.Identity`); ``reserve``: the largest reserve among the classes in use (a fraction of
    a burst; the middleware passes its classes'), which a request going in on the replica's bucket alone leaves
    there (see :attr:`Gate.keep`). :meth:`admit` decides a request like :meth:`Gate.admit`, in its tenant's pool;
    the root's :meth:`Gate.end_hold` ends the holds it returns.
    """

    def __init__(self, tenancy: Tenancy, root: Gate, *, trusted_hops: int = 0, forwarded: str = "x-forwarded-for",
                 reserve: float = 0.5, now: float = 0.0) -> None:  # fmt: skip
        if not isinstance(tenancy, Tenancy):
            raise ConfigError("tenants", "must be an admitgate.Tenancy", tenancy)
        self.tenancy = tenancy
        self.root = root
        #: what a request going in on the replica's bucket alone leaves there (see Gate.keep): ``reserve`` is the
        #: largest class reserve in use (the default classes': ``sheddable``'s 0.5)
        self._keep = max(SPARE, reserve)
        key = tenant_key(tenancy.key, trusted_hops, forwarded)
        self._key = _named(key) if callable(tenancy.key) else key  # (the built-in keys give names already)
        self._pools: BoundedExpiringMap[Pool] = BoundedExpiringMap(tenancy.max_tenants)
        self._raw: bytes | None = getattr(self._key, "raw", None)  # a header key's name (take reads it inline)
        self._entries = self._pools.data  # (for take: a pool's entry by subscript, its expiry checked there)
        self._candidates: BoundedExpiringMap[Candidate] = BoundedExpiringMap(tenancy.max_tenants)
        self._phase = 0.0  # the last fraction _start gave
        #: what pools waking (or new) are given their first tokens from (see _start): the root's burst, refilled
        #: at what no pool is assigned (see _refill_credit)
        self._credit = TokenPacer(root.pacer.rate, root.pacer.burst, now=now)
        #: the replica's bucket for the pools (and critical requests): every admission in a pool is charged to it, and
        #: a request whose own token is free while it is short waits for its token there, in turn (see Gate.guard).
        #: The pools' rates sum to μ, but their buckets, each at least a token, may hold more between them than the
        #: replica's burst: light tenants coming back in turn beside a busy one were admitted up to about a request
        #: per light tenant beyond rate·t + burst (found in review). None with a shared budget: the lease bounds it.
        debt = max(root.pacer.burst, root.pacer.rate * root.max_pacing_delay)  # (reservations: within their windows)
        self._guard: TokenPacer | None = TokenPacer(root.pacer.rate, root.pacer.burst, now=now, max_debt=debt)
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
        #: empty while the table is open (``Tenancy.open_below``), else one item. The middleware's admit path
        #: reads its truthiness as it reads a schedule's book: while it is empty, the replica's bucket decides.
        #: It starts closed: the tenants are established and measured before it first opens, so that a herd
        #: closing it finds them there (opened at once, a small tenant met the herd as a newcomer).
        self.closed: list[bool] = [True]
        self.rejections = 0  #: requests the pools rejected so far
        #: requests the pools admitted on the replica's bucket alone, what the others left there, so far (see SPARE)
        self.spare = 0
        self._rejections = 0  # as of the last reallocation
        self._calm = 0  # reallocations in a row that found the tenants asking little, nobody turned away or held

    # -- decisions ------------------------------------------------------------------------
    def admit(self, cost: float, priority: Priority, now: float, identify: Identify, scope: Scope) -> Decision:
        """Decide one request in its tenant's pool (critical ones on the root: never shed, charged first)."""
        root = self.root
        if now >= root.next_refresh:
            root.refresh(now)
            self.follow(now)
        if priority.critical:  # (charged first: the pools' shares are what it leaves, and so is the replica's bucket)
            if self._guard is not None:
                self._guard.charge(cost, now)
            return root.admit(cost, priority, now, identify)
        if now >= self.next_rebalance:
            self.rebalance(now)
        if not self.closed:  # open: the replica's bucket, as Gate.admit's first branch takes it, or close
            pacer = root.pacer
            if not root.full and pacer.try_take(cost, now, priority.reserve * pacer.burst):
                return ADMITTED
            self._close(now)  # (no token, or no room in flight: contended either way, so the pools decide)
        name = self.name(scope)
        pool = self.pool_of(name, now)
        if not pool.awake:
            pool.unit = cost  # (what one request of it costs: see LONE)
            self._activate(pool, now)
        stats, pacer, schedule = pool.gate.stats, pool.gate.pacer, pool.gate.schedule
        early, overflow, seen, held = stats.early, stats.overflow, pacer.taken + pacer.asked, schedule.holders
        spare = stats.spare
        decision = pool.gate.admit(cost, priority, now, identify)
        root.delegated += pacer.taken + pacer.asked - seen  # (none on spare: with a shared budget there is no guard)
        self.spare += stats.spare - spare
        root.held_below += schedule.holders - held  # (a shared budget leases for the pools' places)
        if stats.early == early:  # a client back before its time ignores Retry-After: that is no demand to serve
            pool.asked += cost
            if pool is self.newcomers and name is not None:
                self._asked_for(name, cost, now)
        if decision.verdict is Verdict.REJECT:
            pool.rejected += 1
            self.rejections += 1
            root.stats.overflow += stats.overflow - overflow  # counted with the root's, as pacing is (metrics)
            if pool.demand <= pool.share.value * pool.share.scale * (1.0 + 1e-9):
                # It turns clients away at or below the demand it was measured at: its demand has surged since (a
                # herd landing on it). Measure it again soon, not up to a whole interval from now: until then it
                # keeps the rate of its old demand (a herd's tenant woke at a third of the capacity, beside the
                # newcomers' pool and a small tenant, and held the first wave at that rate; a pool kept awake at a
                # token per period, given exactly what it asks, waited for the regular reallocation).
                self.next_rebalance = min(self.next_rebalance, max(now, self._last + self.tenancy.interval * EARLY))
        return dataclasses.replace(decision, pool=pool.gate) if decision.delay else decision

    def _close(self, now: float) -> None:
        """The open table's bucket is empty: from now on every request is decided in its tenant's pool, at the
        shares of the last reallocation before it opened (each a part of μ, followed as μ moves: see
        :class:`Share`); demand is measured from now. Their buckets refilled while the replica's admitted: they
        keep only their parts of what that one has left (the burst is spent; kept, a tenant that emptied the
        replica's bucket each time the table opened had its pool's burst too, and over a minute 1.28 times the
        capacity with a burst of 2 s of it, see :meth:`_open`)."""
        root = self.root
        left = max(0.0, root.pacer.tokens(now))
        if self._guard is not None:
            self._guard.cap(left, now)
        for pool in self.pools(now):
            pacer = pool.gate.pacer
            pacer.cap(left * pacer.burst / root.pacer.burst, now)
            pool.counts.clear()  # (what it asked before the table opened is no measure of it now)
            pool.spans.clear()
        self._credit.cap(left, now)  # (what pools woken from now on are given comes out of what is left too)
        self.closed.append(True)
        self._last, self._calm = now, 0
        self.next_rebalance = now + self.tenancy.interval

    def _open(self, pools: list[Pool], now: float) -> None:
        """Requests go to the replica's bucket until :meth:`_close`. The pools keep their shares and demands as
        this reallocation left them: put to sleep, a small tenant met the herd that closed the table as a
        waking pool beside it, and one of its requests in a hundred was turned away. The replica's bucket, which
        refilled while the pools admitted, keeps only what their buckets have left (as they keep only their parts
        of its own when it closes: the tokens pass from one to the other, and the bound stands)."""
        root = self.root
        held = math.fsum(max(0.0, pool.gate.pacer.tokens(now)) for pool in pools)
        if self._guard is not None:  # (and never more than the replica's bucket the pools were charged to holds)
            held = min(held, max(0.0, self._guard.tokens(now)))
        root.pacer.cap(held, now)
        # The replica's own λ_new counts the tenants' new requests from now (a shared budget reads both: left,
        # the pools' stood beside it, counted twice for as long as the table stayed open).
        root.new_below = 0.0
        self.closed.clear()

    def _activate(self, pool: Pool, now: float) -> None:
        """A pool idle until now asks: what the others leave unused until the next reallocation (the others keep
        what they use, and the sum of the rates stays within the capacity), which comes within
        ``EARLY × interval`` if that is less than it wants (its entitlement; what it asks, if it is known to ask
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
            wanted = min(entitlement, (pool.demand * SLACK + 1.0) / pool.share.scale)  # (in the shares' units)
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
        pool.use = min(pool.demand * SLACK + 1.0, entitlement * self._scale)
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
        if rate < wanted * (1.0 - 1e-9):
            self.next_rebalance = min(self.next_rebalance, now + self.tenancy.interval * EARLY)

    def _borrow(self, pool: Pool, wanted: float, now: float) -> tuple[float, float]:
        """A light tenant waking (known to ask less than its entitlement, which max-min fairness gives all it asks)
        whose rate the others hold: take what it asks, ``wanted`` (in the shares' units: see :class:`Share`), beyond
        what no pool is assigned, from the pool given the most per weight at the last reallocation, down to that
        pool's entitlement now. A rate moves, so the rates still sum to what they summed to. Returns the rate taken
        (in the shares' units), and the tokens the lender's bucket gave up with it.

        Without it, a tenant asking once every 2 s beside a busy one woke to no rate at each request, and was told
        Retry-After 1 before the shares were recomputed a moment later: 97 % of its first tries in
        ``bench/light_tenants.py``. (Lent tokens instead, as a debt in the lender's bucket: a deep cut to the lender
        at the next reallocation forgave the debt, and sixty light tenants waking together were admitted 64
        requests beyond rate·t + burst; found in review.) A new pool takes nothing: its demand is not known (a
        herd's tenants are new)."""
        lender = self._lender
        if lender is None or lender is pool or not lender.awake:
            return 0.0, 0.0
        share = lender.share
        short = wanted - max(0.0, self._available - self._assigned)
        # Never below its entitlement, nor so deep a cut that its pacer starts a new epoch (its holds, the deepest
        # queue of all, would reserve again and the tail be turned away).
        least = max(self._entitlement(lender.weight, self._active_weight),
                    EPOCH_CUT * 1.01 * lender.gate.pacer.epoch_rate / share.scale)  # fmt: skip
        cut = min(short, share.value - least)
        if cut <= 0:
            return 0.0, 0.0
        return cut, self._cut(lender, cut, now)

    def _reclaim(self, waking: Pool, wanted: float, now: float) -> float:
        """Take back up to ``wanted`` requests/s from pools whose rate exceeds what they use (their measured
        demand, or what they asked so far this interval, whichever is more, times ``SLACK`` plus one): a share
        nobody uses is no reason to turn a waking tenant away until the next reallocation. The sum of the
        rates stays within the capacity. The pools are those the last reallocation found with a rate above what
        they use, most to spare last, then those woken since (latest last): each is looked at until it has
        nothing left to give, so the cost is amortised O(1) per wake-up, however many pools exist.

        Returns the tokens their buckets gave up with their rates (a bucket is its part of the burst): they pass
        to the waking pool (see :meth:`_cut`)."""
        passed = 0.0
        elapsed = max(now - self._last, self.tenancy.interval * EARLY)
        spare = self._spare
        while wanted > 0 and spare:
            other = spare[-1]
            using = max(other.demand, other.asked / elapsed) * SLACK + 1.0  # requests/s now: in the shares' units
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

    def name(self, scope: Scope) -> str | None:
        """The request's tenant name, or None (a newcomer). Never raises."""
        try:
            return self._key(scope)
        except Exception:  # a user function or a mangled scope must not fail the request
            return None

    def take(self, scope: Scope, cost: float, now: float) -> bool:
        """:meth:`admit`'s answer for a plain request that its tenant's pool admits at once (a token free,
        nobody holding a place, no refresh or reallocation due), without the Decision: True when taken.
        False for anything else, having changed nothing :meth:`admit` would not (a refill, an expired pool
        dropped): :meth:`admit` decides it then.
        This is the admit path with tenants; it must agree with :meth:`admit` (tested side by side)."""
        root = self.root
        bound = root.bound  # (root.full, inlined)
        if (now >= root.next_refresh or now >= self.next_rebalance or not self.closed
                or (bound is not None and bound.inflight - bound.answered >= bound.limit)):  # fmt: skip
            return False  # (open: the replica's bucket decides, in admit; its pools are not to be taken from)
        raw = self._raw
        if raw is None:
            try:  # (self.name, inlined)
                name = self._key(scope)
            except Exception:
                return False
        else:  # (the header's value, as tenant_key's function reads it, inlined: a sixth of this path's cost)
            value = None
            try:
                for k, v in scope["headers"]:  # (no headers: admit decides)
                    if k == raw:
                        value = v if value is None else value + b", " + v
                name = value.decode("latin-1") if value else None
            except Exception:  # (a mangled scope: admit names it a newcomer; raised here, it failed the request)
                return False
            # (a name longer than MAX_NAME is a digest's in the table: never found as it is, so admit names it)
        if name is None:
            pool = self.newcomers
        else:  # (self._pools.get, inlined, by subscript, not a call: an expired entry is left for admit to drop)
            try:
                expiry, pool = self._entries[name]
            except KeyError:
                return False
            if expiry <= now:
                return False
        if not pool.awake or now >= pool.gate.next_refresh or pool.book:
            return False
        guard = self._guard  # (the replica's bucket too: see Gate.guard)
        if guard is None:
            if not pool.take(cost, now):
                return False
        else:  # a token from each bucket or from neither: guard.try_take, then the pool's, inlined (a Python call
            # costs about 470 instructions: with two, the closed table read 0.923 of bare, docs/fairness.md). Each
            # refills as try_take refills it; the replica's bucket counts no `taken` (nobody reads it).
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
        root.delegated += 1
        return True

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

    def limit_of(self, scope: Scope, now: float) -> tuple[TokenPacer, float]:
        """The bucket of the request's tenant and its entitlement, requests/s (an admitted response's fields)."""
        if not self.closed:  # (the replica's bucket decides: its fields)
            return self.root.pacer, self.root.pacer.rate
        name = self.name(scope)
        pool = (None if name is None else self._pools.get(name, now)) or self.newcomers
        return pool.gate.pacer, pool.share.entitlement

    def _pool(self, name: Hashable, weight: float, now: float) -> Pool:
        entitlement = max(self._entitlement(weight, self._active_weight + weight), MIN_RATE)
        share = Share(entitlement, entitlement, self.root.growth, self.root, self._mu, self._split)
        self._split.rest += entitlement
        self._split.low = min(self._split.low, entitlement / weight)
        gate = Gate(share, self._settings, now=now)
        if name is not NEWCOMERS:  # (the first pool holds the root's burst; the others are given theirs as they wake)
            gate.pacer.cap(0.0, now)
        gate.releases = True  # (its rate moves with the shares: see Gate.end_hold)
        gate.guard = self._guard  # (and what it admits is the replica's too)
        gate.keep = self._keep
        gate.probes = self.root.probes  # one service: a pool that paces or rejects tells the estimator so
        gate.bound = self.root.bound  # and what it has in flight is the service's
        gate.stats.pacing = self.root.stats.pacing  # and its holds are counted with the root's (metrics read it)
        return Pool(name, weight, gate, share)

    # -- shares ---------------------------------------------------------------------------
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

    def _refill_credit(self, now: float) -> None:
        """From ``now`` the wake-up credit refills at what no pool is assigned (``_available`` less ``_assigned``,
        requests/s, at least ``MIN_RATE``), as of the last reallocation or wake-up: the pools' buckets refill at
        their rates, which sum to what is assigned, and the credit is the rest of the one bucket, not a second.

        Refilled at all of μ beside them, it was a second bucket: 30 tenants each sending 20 requests at once every
        3 s, staggered, on a 100/s replica with a burst of 10, were each given up to a burst from it as they woke
        (1,758 tokens in 60 s) and admitted 6,836 requests where the bound is 6,010 (6,023 before the credit;
        found in review). The cost: while the pools hold all of the capacity, used or not, the credit stays empty,
        and a tenant waking then has its first request held for less than one token's time at its rate."""
        self._credit.set_rate(max(MIN_RATE, self._available - self._assigned), now)

    def follow(self, now: float) -> None:
        """The replica's bucket (``_guard``) refills at μ now, with the replica's burst (its debt, the holds reserved
        on it, stands: a rate cut starts no epoch there); with a shared budget there is none (the lease bounds the
        replica, and the pools keep their shares until the next reallocation). Called as the root refreshes, and by
        the middleware once a shared budget is attached."""
        guard, pacer = self._guard, self.root.pacer
        if guard is None:
            return
        if self.root.backend is not None:
            self._guard = None
            for pool in self.pools(now):
                pool.gate.guard = None
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

    def rebalance(self, now: float) -> None:
        """Measure each pool's demand and divide the capacity among them by weighted max-min water-filling.

        Each asking pool is given its fair share of the measured demands, and what they leave (when they
        ask for less than the capacity) is divided among them by weight: these rates sum to the capacity as of
        the reallocation (between reallocations they follow it: a rise in proportion, a cut first out of the pools not
        given all they ask, see :class:`Share`).
        Idle pools keep a rate of ``MIN_RATE`` until they ask (a pool asking every few seconds is not idle between:
        it keeps a token per period). (A pool given what it asks was given room to
        grow, up to ``demand × SLACK + 1``, taken from nobody: the rates summed to more than the capacity, and
        sixty light tenants woken together beside a busy one, each held for its room, were admitted 26 requests
        beyond rate·t + burst; found in review. A pool's share grows at the next reallocation, or sooner: see
        :meth:`admit`.)
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
        available = self._available = max(mu - critical, mu * MIN_SHARE)
        if self._credit.burst != root.pacer.burst:
            self._credit.set_burst(root.pacer.burst, now)
        # With a shared budget μ is this replica's lease, which follows what it admitted lately (an idle
        # replica's is 10/s); its clients are told by its share of the fleet's H. Told by the lease, a herd
        # landing on an idle replica was told Retry-After at 10/s: up to 600 s where 12 s would do.
        told = max(available, root.promise - critical) if root.backend is not None else available
        self._scale, self._told = told / available, told
        pools = self.pools(now)
        demands: dict[int, float] = {}
        weights: dict[int, float] = {}
        for index, pool in enumerate(pools):
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
                    pool.period = gap if not pool.period else pool.period + SMOOTHING * (gap - pool.period)
                pool.seen = now
            pool.counts.append(pool.asked)
            alone = newborn and pool.asked <= LONE * pool.unit
            pool.spans.append(max(elapsed, tenancy.interval) if alone else elapsed)
            asked, span, lone = _rates(pool.counts, pool.spans, tenancy.interval, pool.unit)
            # One request alone in SPAN intervals is no surge: believed, a tenant asking once every 2 s was measured
            # at 2/s in the interval it asked, then at 0.67/s for two, and given 0.96/s on average for its 0.5/s;
            # fifty of them beside a busy tenant left it 49 of its 75/s, the rest unused. (Their surges believed, the
            # busy pool was cut by about what the light pools' first tokens, given from nothing as they woke (see
            # _start), let them admit beyond their rates; the replica's bucket (Gate.guard) bounds that now.)
            if asked > pool.demand * SURGE and not lone:
                pool.demand = max(asked, span or 0.0)
            elif span is not None and span < pool.demand / SURGE:
                pool.demand = span
            else:
                pool.demand += SMOOTHING * ((asked if span is None else span) - pool.demand)
            # A tenant asking less often than a fall is judged over (a request every few seconds) keeps a token per
            # period until a period and a half has passed without it: judged over SPAN intervals alone, its pool
            # slept between its requests and woke to no rate, and where μ was cut so that nobody could lend it one,
            # fifty of them beside a busy one were served 1-3 requests a second of 25. A token, not what it asked
            # last: a tenant that sent a burst of 300 and stopped held half of 100/s unused for 1.5 periods (review).
            period = pool.period
            if period > SPAN * tenancy.interval and now - pool.seen <= PERIODS * period:
                pool.demand = max(pool.demand, 1.0 / period)
            if pool.asked and pool.name is not NEWCOMERS:
                self._pools.put(pool.name, pool, now + tenancy.idle, now)
            pool.asked = 0.0
            # Clients holding places in its schedule will be back: a backlog is demand too, as much as it can
            # be given (the rate they come back at follows the share they are told at: measured alone, it would
            # hold a herd's tenant to the entitlement it was first told at, and the rest would go unused). Only
            # while the pool still asks: clients who gave up are no demand. Still asks means within the last SPAN
            # intervals, or within two of its places' spacing at its entitlement if that is longer: a tenant with
            # a few clients among hundreds of tenants is told to come back seconds apart, and taken for gone
            # between two returns it was put to sleep, its schedule's head stopped, and its clients were told
            # again and again (the simulator's herd across 500 tenants drained at 17-22 times its bound).
            recent = max(SPAN * tenancy.interval, RETURNS / max(pool.share.entitlement, MIN_RATE))
            backlog = pool.gate.schedule.waiting(now) if now - pool.seen <= recent else 0
            # Requests held for their tokens (paced) are demand too, whenever the pool last asked: every hold ends
            # within ``max_pacing_delay``. Left out, a herd's pool whose clients were all held asked nothing for an
            # interval, its rate was cut, and its holds (tokens reserved at the old rate) were turned away at their
            # ends: a herd across 100 tenants drained its last clients a second at a time (1.21-1.27 of its bound in
            # the simulator, now 1.08). The more of the two, not their sum: a held request was counted as asked when
            # it came (added, one hold lifted a pool asking 7.5/s to 9.5/s and back at each reallocation, and the
            # cuts between turned holds away: 84.5 of 100/s admitted, found in review).
            held = pool.gate.waiters / max(pool.gate.max_pacing_delay, tenancy.interval)  # (over a hold's span)
            wanted = max(pool.demand, held) + backlog / tenancy.interval
            if pool.gate.waiters:  # (never so deep a cut that its holds start a new epoch and are turned away)
                wanted = max(wanted, EPOCH_CUT * 1.01 * pool.gate.pacer.epoch_rate / pool.share.scale)
            if wanted > MIN_RATE:
                demands[index] = wanted
                weights[index] = pool.weight
        if root.backend is not None:  # its running counts, made exact (only a shared budget reads them)
            root.held_below = sum(pool.gate.schedule.holders for pool in pools)
            root.new_below = math.fsum(pool.gate.new_rate() for pool in pools)
            owed = [(max(0.0, -pool.gate.pacer.tokens(now)), pool.gate.pacer.rate) for pool in pools]
            root.owed_below = math.fsum(debt for debt, _ in owed)
            # (a reallocation comes only with a request: counted until the next, an idle replica leased for a
            # debt repaid long ago, at its last grant, for ever)
            root.owed_until = now + max(debt / rate for debt, rate in owed)
        shares = fair_shares(available, demands, weights)
        total = sum(weights.values())
        self._active_weight = total
        entitlements = {index: self._entitlement(weight, total) for index, weight in weights.items()}
        # The newcomers' floor (Tenancy.newcomer_share): beside many busy tenants their one weighted share was a
        # sliver (0.2 % of the capacity beside 500), and the new arrivals beside a herd across them were served
        # one time in ten. Below the floor they are given it, up to what they ask, and the tenants share the rest.
        newcomers = len(pools) - 1
        floor = min(demands.get(newcomers, 0.0), tenancy.newcomer_share * available)
        floored = shares.get(newcomers, floor) < floor
        if floored:
            shares = fair_shares(available - floor, {k: v for k, v in demands.items() if k != newcomers}, weights)
            shares[newcomers] = floor
            entitlements[newcomers] = sure = max(entitlements[newcomers], tenancy.newcomer_share * available)
            others = total - weights[newcomers]  # (the tenants are sure of their parts of the rest)
            for index, weight in weights.items():
                if index != newcomers:
                    entitlements[index] = (available - sure) * weight / others
        kept = {index for index, rate in shares.items() if rate >= demands[index] * (1.0 - 1e-9)}  # all they ask
        left = max(0.0, available - math.fsum(shares.values()))
        for index in shares:
            shares[index] += left * weights[index] / total
        # Each asking pool is told Retry-After at what it gets if it stays busy: the capacity less what the
        # others use (their demand, at most their entitlement), never less than its own entitlement. A herd's
        # tenant beside a light one is told at nearly all of the capacity, not at half of it.
        scale = self._scale
        uses = {index: min(demands[index] * SLACK + 1.0, entitlements[index] * scale) for index in shares}
        used = self._used = math.fsum(uses.values())
        self._assigned = 0.0
        self._lender, most = None, 0.0
        growth = root.growth  # the estimator's pace now (start-up's, then probing's): each schedule's forecast
        whole = root.whole
        spare: list[tuple[float, int, Pool]] = []
        held = rest = high = 0.0
        low = math.inf
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
                               self._promise(entitlement, used - uses[index]))  # fmt: skip
                if woken:
                    self._start(pool, now)
                extra = rate - max(pool.demand * SLACK + 1.0, MIN_RATE)
                if extra > 0:
                    spare.append((extra, index, pool))
                if rate / pool.weight > most and not (floored and index == newcomers):  # (_borrow: a floor lends none)
                    self._lender, most = pool, rate / pool.weight
            else:  # asleep: what its bucket held goes with its share (woken, it is given tokens anew: _start)
                pool.awake, pool.use = False, 0.0
                pool.set_share(MIN_RATE, self._entitlement(pool.weight, total + pool.weight), 1.0, now)
                pool.gate.pacer.cap(0.0, now)
            value, share = pool.share.value, pool.share
            if share.kept:
                held += value
                if index in shares and not (floored and index == newcomers):  # (a floor is no water level)
                    high = max(high, value / pool.weight)
            else:
                rest += value
                low = min(low, value / pool.weight)
        split = self._split
        split.held, split.rest, split.high, split.low = held, rest, high, low
        self._refill_credit(now)
        spare.sort(key=lambda item: (item[0], item[1]))
        self._spare = [pool for _, _, pool in spare]
        rejections, self._rejections = self.rejections - self._rejections, self.rejections
        quiet = math.fsum(demands.values()) < tenancy.open_below * available and not rejections and \
            not any(pool.gate.waiters or pool.gate.schedule.holders for pool in pools)  # fmt: skip
        self._calm = self._calm + 1 if quiet else 0
        if self._calm >= SPAN and tenancy.open_below > 0:
            self._open(pools, now)

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
