"""A gate's state and its rates: μ read from its source on a cadence, λ_new, the shed rate H, and the outage verdict.

:class:`GateRates` is what :class:`~admitgate.core.gate.Gate` decides on: its token pacer (refilling at μ), its
retry schedule (whose head moves at H = μ − λ_new), its counters, and :meth:`GateRates.refresh`, which pulls μ from
the rate source (:mod:`admitgate.core.source`), or this replica's share from a shared budget, on the gate's cadence.
It reads no clock: every call takes ``now`` (seconds).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Hashable, Sized

from .budget import Budget
from .decision import GateStats, Stranger
from .errors import ConfigError, number
from .ledger import Ledger, Parent
from .newrate import NewRate
from .pacer import TokenPacer
from .probes import Probes
from .schedule import PLACEMENTS, Place, Schedule
from .settings import MAX_RATE, MIN_RATE, Settings
from .source import Capacity, RateOf, RateReading, RateSource, StaticCapacity
from .strays import Strays
from .tuning import GATE, GateTuning

log = logging.getLogger("admitgate")


class GateRates:
    """The state of a :class:`~admitgate.core.gate.Gate` and its rates (see the module docstring); the gate's
    arguments are its own."""

    def __init__(self, rate: float | RateSource | Capacity, settings: Settings | None = None, *, now: float = 0.0,
                 tuning: GateTuning = GATE) -> None:  # fmt: skip
        if settings is None:
            settings = Settings()
        elif not isinstance(settings, Settings):
            raise ConfigError("settings", "must be an admitgate.Settings", settings)
        self.settings, self.tuning = settings, tuning
        self.capacity_source: RateSource = _capacity_source(rate)
        initial = _initial_rate(self.capacity_source, now)
        s = settings
        burst = max(1.0, initial / tuning.burst_divisor) if s.burst is None else s.burst
        self._take(s, initial)
        # Paced reservations may run the bucket into debt by up to one pacing delay of tokens.
        self.pacer = TokenPacer(initial, burst, now=now, max_debt=max(burst, initial * self.max_pacing_delay))
        placement = PLACEMENTS[s.spread == "jitter"]
        self.schedule = Schedule(initial, now, placement=placement, window=s.spread_window, max_keys=s.max_keys)
        self._book = self.schedule.book  # (who holds a place: the live mapping, bound once for the admit path)
        self._new = NewRate(s.new_window, now)
        self._strays = Strays(s.max_keys)  # places of lapsing keys not come back for, by kind and source
        self.stats = GateStats()
        #: probe aggregates the middleware records into, if the capacity source reads them (else None)
        self.probes: Probes | None = self.capacity_source.probes
        #: the probes whose in-flight limit bounds what this gate admits (a live capacity's), or None
        self.bound: Probes | None = self.probes if self.probes is not None and self.probes.floor is not None else None
        #: a shared budget (admitgate.backends.shared.RedisBudget) that leases this replica's tokens, or None
        self.backend: Budget | None = None
        #: what the gates this one's capacity is divided among (a tenants' table's pools) carry
        self.ledger = Ledger(owed_until=now)
        #: in a tenants' pool, its tie to the replica (its bucket, and what going in on it alone leaves); None elsewhere
        self.parent: Parent | None = None
        self.waiters = 0  #: requests held by pacing now
        self._room_waiters: deque[Callable[[], bool]] = deque()  # holds waiting for room in flight, oldest first
        self.landing = 0  #: new places held now while a herd lands on the fleet (not counted in ``waiters``)
        #: their wake-ups, by their places' positions: (position, order, wake), a heap
        self._landing_waiters: list[tuple[float, int, Callable[[], bool]]] = []
        self._landing_order = itertools.count()
        self.tarpitted = 0  #: 429s held by the tarpit now
        self._queue_since = now  # when the current queue of paced new requests began
        self._clear_at = now  # when the bucket's debt will have been repaid, as of the last reservation
        self._overflowing = False
        self._peak, self._peak_at = 0.0, now  # recent peak of H (decaying), and when it was last updated
        self._top = 0.0  # recent peak of μ (decaying as the peak of H does)
        self._down_at = -math.inf  # the last refresh at which μ had collapsed
        self._struck = False  # μ was cut under `collapse` of its peak since the gate was last calm (see _reject)
        #: an outage, as of the last refresh: from μ falling below ``tuning.collapse`` of its recent peak until a
        #: λ_new window (``new_window`` seconds) after it is back (with a shared budget the fleet's μ, and the time
        #: before the first lease); in a tenants' pool, its root's
        self.collapsed = False
        self._calm_at = now  # the last refresh in no outage, with H at `collapse` of its peak or more
        self._believed: float | None = None  # μ as the source believed it at the last refresh (None: the rate)
        self.known = True  #: the source has measured a capacity (see RateReading.known), as of the last refresh
        self._forecast = 0.0  # the source's forecast growth at the last refresh, per second
        self._promise = initial  # H as promised: from the capacity μ (the head moves at H from the rate)
        self._level = initial  # the H an outage expects back: the promise's, or with a shared budget the fleet's
        self.next_refresh = now
        self.refresh(now)

    def _take(self, s: Settings, initial: float) -> None:
        """The settings' values the gate reads on its paths, and what follows from them at the ``initial`` rate."""
        self.max_pacing_delay = s.max_pacing_delay
        #: how early before its place a client is told to come back (none with pacing off: nobody is held)
        self.lead = self.tuning.lead if self.max_pacing_delay > 0 else 0.0
        #: the longest a returning client is held for its place, and a request for room in flight (see _judge_room)
        self.place_hold = self.room_hold = max(self.max_pacing_delay, self.lead)
        windows = math.ceil(self.tuning.waiter_windows * initial * s.max_pacing_delay)
        self.max_waiters = max(self.tuning.min_waiters, windows) if s.max_waiters is None else s.max_waiters
        self.max_retry_after = s.max_retry_after
        self._cap = int(self.max_retry_after)
        self.refresh_interval = s.refresh_interval
        self.tarpit = s.tarpit
        self.max_tarpitted = s.max_tarpitted
        self.standing_queue = s.standing_queue
        self.fresh_pacing_delay = s.fresh_pacing_delay
        self._growth = s.growth

    @property
    def static_rate(self) -> float | None:
        """The capacity in requests/s if it was typed in (a number, not a live source), else None."""
        return self.capacity_source.value if isinstance(self.capacity_source, StaticCapacity) else None

    # -- rates ----------------------------------------------------------------------------
    def refresh(self, now: float) -> None:
        """Pull μ from the capacity source, update λ_new, and move the schedule at H (call at any rate)."""
        if now < self.next_refresh:
            return
        self.next_refresh = now + self.refresh_interval
        reading = self.capacity_source.read(now)
        rate = reading.rate
        self._believed = reading.capacity
        self._forecast = 0.0 if reading.growth is None else reading.growth
        self.known = reading.known
        self._judge_room(reading)
        backend = self.backend
        self._new.update(self.new_requests, now)
        shared = fleet = None
        fleet_mu = rate  # μ of the fleet, with a shared budget
        if backend is not None:  # a shared budget sets the pacer and this replica's share of the fleet's H
            backend.local_rate = rate
            backend.overdue(now)
            shared = backend.headroom(self.backlog()[0])
            fleet = backend.headroom(0.0)  # (its share with nothing scheduled: all of the fleet's H)
            fleet_mu = backend.fleet_rate or rate
        elif rate != self.pacer.rate and 0 < rate < math.inf:
            self.pacer.set_rate(rate, now)
            if self.settings.burst is None:  # (the burst is a share of a second of the rate in force)
                self.pacer.set_burst(max(1.0, rate / self.tuning.burst_divisor), now)
        if shared is not None:  # promised at the fleet's share; the head moves at what this replica is granted
            self.schedule.set_rate(min(shared, self._room(self.pacer.rate)), now)
            self._promise = shared
            # In an outage the fleet's H is expected back, not this replica's share of it: the share falls whenever
            # a herd lands on the others (judged on it, their herd was an outage here, every client told to come
            # back in a second: 11,000 of 20,000 answers on the fleet herd).
            self._level = fleet or shared
        elif not self.known:  # no capacity measured: the places wait in their order (clients ask again, _reject)
            self.schedule.set_rate(self.tuning.unknown, now)
            self._promise = self.headroom(now)
        else:  # (never faster than promised: a rate above μ is a probe, for the requests that come, not for places)
            self.schedule.set_rate(self._room(min(self.pacer.rate, self.capacity)), now)
            self._promise = self.headroom(now)
            whole = reading.whole  # (a tenants' pool: its root's, see Share)
            self._level = self._promise * whole if whole is not None else self._promise
        mu = fleet_mu if backend is not None else self.capacity
        self._judge(now, mu, reading.collapsed, backend is not None and shared is None)
        if self._landing_waiters:
            self._landing_due(now)
        if self._overflowing and self.schedule.horizon(now) < self._cap:
            self._overflowing = False  # the episode is over: log the next one again

    def _judge_room(self, reading: RateReading) -> None:
        """How long a request may be held for room in flight (``room_hold``): ``room_latencies`` of the service's
        latency as the source reads it, no less than a pacing window, and while no capacity is known no less than
        the lead (the capacity is being measured: a herd held a moment is placed by it, not told to ask again)."""
        if self.max_pacing_delay <= 0:
            return
        hold = self.max_pacing_delay
        if reading.latency is not None:
            hold = max(hold, self.tuning.room_latencies * reading.latency)
        if not reading.known:
            hold = max(hold, self.lead)
        self.room_hold = hold

    @property
    def new_requests(self) -> int:
        """Requests so far from clients holding no place (first attempts), critical ones included."""
        s = self.stats
        return self.pacer.taken + s.spare + s.critical + s.contended - s.returning

    def _came_back(self, key: Hashable, place: Place) -> None:
        """A client came back for ``place`` (its own, or one of its kind its source's clients left): counted as
        returning, not new."""
        self.stats.returning += 1
        if isinstance(key, Stranger):  # (a stranger's place: strangers claim no other kind)
            self._new.claimed(place[2])
        self._strays.drop(key)  # (any key: a connection's client back with its ticket is known by it)

    def new_rate(self) -> float:
        """λ_new: the measured rate of new requests, requests/s."""
        return self._new.rate

    @property
    def promise(self) -> float:
        """H as Retry-After is told by, requests/s, as of the last refresh: from the capacity μ, or with a shared
        budget this replica's share of the fleet's H (its pools' schedules counted), not the lease it holds."""
        return self._promise

    @property
    def whole(self) -> float:
        """How many times :attr:`promise` the H an outage expects back is: with a shared budget, the fleet's H
        over this replica's share of it (a tenants' pool's gate is told it by its table); 1 otherwise."""
        return self._level / self._promise

    def backlog(self) -> tuple[int, float]:
        """What this gate and the gates below it carry: the clients holding places in their retry schedules,
        and their λ_new summed (requests/s). What a shared budget leases for and publishes."""
        below = self.ledger
        return self.schedule.holders + below.held, self._new.rate + below.new

    def _overflow(self, retry_after: int) -> int:
        """A place beyond the cap: fold it into [1, cap] (it comes back early, keeps its place, is told again).

        Folding the schedule's seconds modulo the cap fills every value of Retry-After equally: each is
        given to at most ``ceil(M / (H·cap))·H`` clients, the fewest any spread within the cap allows.
        """
        self.stats.overflow += 1
        if not self._overflowing:
            self._overflowing = True
            log.warning("admitgate: the retry schedule reaches past max_retry_after (%d s): clients beyond it are "
                        "told values folded into it and will ask again", self._cap)  # fmt: skip
        return 1 + (retry_after - 1) % self._cap

    def wait_room(self, wake: Callable[[], bool]) -> None:
        """Call ``wake`` when room in flight may have come (see :meth:`room_freed`)."""
        self._room_waiters.append(wake)

    @property
    def waiting_for_room(self) -> Sized:
        return self._room_waiters

    def room_freed(self) -> None:
        """Room in flight may have come: wake as many holds waiting for it as fit, the newest first (Facebook's
        adaptive LIFO: while a queue stands, the newest requests' clients are the ones still waiting)."""
        waiting, bound = self._room_waiters, self.bound
        if not waiting or bound is None:
            return
        free = bound.limit - (bound.inflight - bound.answered)
        while waiting and free >= 1:
            if waiting.pop()():
                free -= 1

    def wait_landing(self, wake: Callable[[], bool], position: float) -> None:
        """Call ``wake`` when the fleet's backlog has landed (see :meth:`landed`), or at the first refresh that finds
        the place at ``position`` due. (Woken at the time it was due when held, a place whose head sped up as the
        leases came slept past it, its tokens unused: 300 of one replica's 500 clients were due at once when the
        backlog landed, and were told to come back every other second.)"""
        heapq.heappush(self._landing_waiters, (position, next(self._landing_order), wake))

    def _landing_due(self, now: float) -> None:
        """Wake the places held while a herd lands that are due at ``now`` (see :meth:`wait_landing`)."""
        waiting, head = self._landing_waiters, self.schedule.head(now)
        while waiting and waiting[0][0] <= head:
            heapq.heappop(waiting)[2]()

    def landed(self) -> None:
        """The shared budget found the fleet's backlog landed: wake every new place held for it (see
        :meth:`Gate._unheard`), to be told now."""
        waiting, self._landing_waiters = self._landing_waiters, []
        for _, _, wake in waiting:
            wake()

    def headroom(self, now: float) -> float:
        """H: the rate returning clients may come back at, requests/s (what they are told by).

        H = μ − λ_new − √λ_new, floored at a small share of μ. New requests arrive at random (about
        Poisson): in a second they vary by about √λ_new. Scheduling returns at exactly μ − λ_new would
        run the bucket at utilisation 1, where the wait of a new request drifts without bound; the
        allowance keeps it short. The schedule's head moves at the same H computed from the rate in
        force, which is lower while a live estimator drains a queue: places then come due later than
        told, and their clients, back early, keep their places.
        """
        return self._room(self.capacity)

    def _room(self, rate: float) -> float:
        new = self._new.rate
        return max(rate - new - math.sqrt(new), rate * self.tuning.min_share)

    @property
    def capacity(self) -> float:
        """μ, requests/s: what the capacity source believes the service can take.

        For a live source this is the estimator's belief, not the rate it sets the pacer to while it
        drains a queue: the schedule is timed by what the service can take, not by a moment's dip.
        """
        return self._believed or self.pacer.rate

    @property
    def growth(self) -> float:
        """How fast H may rise per second in the forecast that times Retry-After (see the class docstring)."""
        return self._growth if self._growth is not None else self._forecast

    def _flooded(self) -> bool:
        """New requests alone fill the capacity (λ_new at least ``1 − min_share`` of it): sustained overload, not a
        herd. λ_new alone, without H's allowance √λ_new: at a small rate that allowance is a large part of it, and a
        tenants' pool given a quarter more than it asks (20/s asked of 25/s: 24.5 with it) read as flooded."""
        new = self._new.rate
        return new >= self.capacity * (1 - self.tuning.min_share)

    def state(self, now: float) -> dict[str, float | str | None]:
        """What the gate believes now: μ, λ_new and H (requests/s; None while no capacity is known), plus the
        estimator's state."""
        new = self._new.rate
        out: dict[str, float | str | None] = {"rate": self.pacer.rate, "lambda_new": new}
        headroom = self.headroom(now) if self.known else None  # (no capacity measured yet: no H either)
        out.update(headroom=headroom, waiters=float(self.waiters), horizon=self.schedule.horizon(now))
        live = self.capacity_source.state()
        if live is not None:
            out.update(estimator=live.estimator, estimator_state=live.state, mu=live.mu, background=live.background,
                       baseline_latency=live.baseline, latency=live.latency, completion_rate=live.completion_rate,
                       inflight=float(live.inflight))  # fmt: skip
        else:
            out.update(mu=self.pacer.rate)
        return out

    def _judge(self, now: float, mu: float, root: bool | None, unleased: bool) -> None:
        """Whether μ (requests/s; the fleet's, with a shared budget) has collapsed, and the recent peaks of H and μ.
        ``root``: a pool's root's verdict (None: judged here); ``unleased``: a shared budget has granted nothing yet."""
        # An outage is the capacity collapsing: μ (the fleet's, with a shared budget). It ends a λ_new window after μ
        # is back: the clients that arrived during it are new arrivals in λ_new's median for seconds after μ returns
        # (ended with μ, the outage-recovery herd's clients were told at H's floor: drain 1.24, against 1.02). Before
        # a shared budget's first lease the grant is 0 and so is the promise: the replica's clients expect its recent
        # H back (at a rate of 0, folded under the cap, a herd's were told 1-3599 s). H falling while μ stands is
        # not an outage: see _reject. A tenants' pool is in one with its root.
        t = self.tuning
        cut = mu < t.collapse * self._top
        if root is None and cut:
            self._down_at = now
        collapsed = (now - self._down_at < self._new.span or unleased) if root is None else root
        # The peaks stand for the first `peak_memory` s of an outage, and of H under `collapse` of its peak while μ
        # stands: new arrivals taking it for a while say nothing of the H to come.
        calm = not collapsed and self._level >= t.collapse * self._peak
        if calm:
            self._calm_at = now
        self._struck = cut or (self._struck and not calm)  # (see _reject)
        if not self.known:  # (no capacity measured: no peak to remember, nor an outage to judge by it)
            self._peak = self._top = 0.0
            self._struck = False
        elif calm or now - self._calm_at >= t.peak_memory:
            fade = math.exp((self._peak_at - now) / t.peak_memory)
            self._peak = max(self._level, self._peak * fade)
            self._top = max(mu, self._top * fade)
        self._peak_at = now
        self.collapsed = collapsed

    @property
    def _guard(self) -> TokenPacer | None:
        """In a tenants' pool, the replica's bucket (see :class:`~admitgate.core.ledger.Parent`); None elsewhere."""
        parent = self.parent
        return None if parent is None else parent.bucket

    @property
    def full(self) -> bool:
        """The in-flight limit is reached (see :mod:`admitgate.core.probes`): nothing more goes in until the
        service answers (False without a limit). Requests whose response has begun are not counted."""
        bound = self.bound
        return bound is not None and bound.inflight - bound.answered >= bound.limit

    @property
    def recheck(self) -> float:
        """Seconds a hold sleeps at most before it looks again: ``tuning.recheck`` where the rate can move (a live
        source, a tenant's share, a shared budget's grants), else no limit (a typed-in rate: nothing to see)."""
        moves = self.backend is not None or not isinstance(self.capacity_source, StaticCapacity)
        return self.tuning.recheck if moves else math.inf


def _capacity_source(rate: object) -> RateSource:
    """``rate`` as a rate source: a number (requests/s, at most MAX_RATE), a RateSource, or a Capacity."""
    if isinstance(rate, RateSource) and callable(rate.read):
        return rate
    if isinstance(rate, Capacity) and callable(rate.rate):
        return RateOf(rate)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ConfigError("rate", "must be requests/s (a number) or a Capacity such as LiveCapacity", rate)
    return StaticCapacity(rate)


def _initial_rate(source: RateSource, now: float) -> float:
    """What ``source`` reads at ``now``: a rate in (0, MAX_RATE] requests/s, else ConfigError."""
    try:
        initial = source.read(now).rate
    except Exception as exc:
        raise ConfigError("rate", f"the rate source failed: {exc!r}") from exc
    return number("rate", initial, MIN_RATE, MAX_RATE, unit="requests/s")
