"""One budget for many replicas: token leases from a bucket in Redis.

Every replica keeps deciding locally, on its own :class:`~admitgate.core.pacer.TokenPacer`, so the admit
path never waits for the network. What is shared is where the local tokens come from. Every
``lease_interval`` seconds (0.1), a background task runs one Lua script in Redis. The script:

* refills the shared bucket at the fleet's rate, using Redis ``TIME`` as the one clock;
* grants this replica the tokens it may use in the next interval (twice its recent demand, so demand
  can double between leases without a refusal; while requests are held for tokens reserved ahead, at least
  the rate they were reserved at); when the replicas together want more
  than an interval's refill, each gets its demand-weighted share of it, so the first to ask does not
  starve the others;
* records the replica as alive for ``ttl`` seconds, with its own estimate of μ, its λ_new, the backlog
  of its retry schedule (clients holding a place, served or due or not) and its probe summary;
* forgets replicas whose TTL has passed (so a dead replica stops counting within ``ttl``, 3 s).

The fleet rate μ is the configured rate, or, with live estimators, the sum of the live replicas' μ.
The replica then paces its own admissions at ``granted / lease_interval`` for the interval.

**One retry schedule for the fleet.** Rejected clients come back to the replica that rejected them
(their keep-alive connection, their ticket), so each replica keeps its own schedule, but it runs at
its share of the *fleet's* H = μ_fleet − Σλ_new − √Σλ_new: its backlog over the fleet's backlog. The
replicas' queues then drain together, in ``Σbacklog / H_fleet``, whichever replica a herd hit and
however unevenly. Between leases a replica counts its own new places at once (its share can only be
larger than the last lease said, so clients are told early, never late). While a herd is still landing
(:meth:`RedisBudget.unsettled`) the gate holds a new place until the leases have published it and the
others', every replica having leased since the fleet's backlog last grew (leases are numbered in Redis), and
then wakes it (see ``Gate._unheard``). One round
trip per replica per interval, whatever the request rate: at 1,000 decisions/s per replica that is
10 round trips per 1,000 decisions. State in Redis is O(1) per bucket plus one entry per live replica.

**Over-admission bound.** Leased tokens are taken from the shared bucket when leased, and the bucket
may run one burst into debt (leases arrive a little early or late). A grant whose next lease is late goes on
refilling for up to ``GRACE`` intervals; the next lease pays back what it refilled beyond its interval, first
out of what the shared bucket spilt over its cap since this replica's last lease (tokens nobody was granted),
then out of the bucket. What a grant refills after a lease failed is not owed: from then on the replica runs on
its own, as with the fallback below. A replica whose lease is ``LATE`` intervals late while its grant is below
1/N of the fleet's rate (a herd landing on an idle replica whose event loop is busy with the herd's connections) refills
at that 1/N meanwhile, as it would with Redis unreachable, and that is paid back the same way. So in any
window of T seconds that ends after the late leases in it have paid, the fleet admits at most
``rate·T + 2·burst + N·local_burst``: the shared bucket's bound with its debt, plus one local bucket per
replica. The local burst is the fleet burst divided by the number of live replicas.

**Faults are a mode, not an error.** Each call has a deadline (``timeout``, 20 ms by default). A
loopback round trip takes about 0.1 ms, but under full load the event loop itself answers late. At 5
ms, leases timed out and the replica fell back while Redis was healthy. Raise it across a network.
After ``failures`` consecutive failures the circuit opens for ``cooldown`` seconds, and the replica
runs on its own. With ``on_failure="open"`` (the default) it keeps 1/N of the last fleet rate it
saw; with ``"closed"`` it admits nothing and rejects with a Retry-After. ``degraded`` and ``errors``
are exported as metrics, and the transition is logged. When Redis answers again, leasing resumes. A
restarted Redis has lost the script: redis-py's ``Script`` reloads it on ``NOSCRIPT``. All keys of
one budget share a hash tag, ``{name}``, so Redis Cluster keeps them on one slot. The script uses
only commands Redis 7 and Valkey share.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from importlib import resources
from typing import Any

from ..core.clock import Clock
from ..core.errors import ConfigError, integer, non_negative, positive
from ..core.gate import Gate

log = logging.getLogger("admitgate")

#: A grant goes on refilling for this many lease intervals if the next lease is late; what it refilled beyond
#: its own interval is paid back by that next lease. A busy replica's event loop delays its own leases by 0.3-3 s
#: on the fleet herd; at three intervals its refill stopped for most of each gap, its due clients were held and
#: told to come back in 1 s, and their returns delayed its leases further (four rounds in ten drained at
#: 1.6-2.2 times the bound; none at ten intervals).
GRACE = 10.0
#: A lease this many intervals late while the grant is below the replica's fail-open share (1/N of the fleet's
#: rate) refills at that share until it comes (see RedisBudget.overdue). A herd's first wave is decided within
#: about 0.3 s of landing while the event loop holds the next lease back for 0.9 s: at three intervals the
#: busy replica began refilling after its first wave was decided (no change on the fleet herd).
LATE = 1.5
#: The fleet's backlog has landed once a lease finds it grew by no more than this fraction (and one place) since the
#: one before (see RedisBudget.unsettled).
SETTLED = 0.1
STOP_RETRY = 0.05  # seconds between cancellations of a lease loop that did not end (see RedisBudget.stop)

#: The lease script (``lease.lua``, shipped beside this module as package data).
LEASE = (resources.files(__package__) / "lease.lua").read_text(encoding="utf-8")


def connect(url: str) -> Any:
    """A redis-py asyncio client for ``redis://``, ``rediss://``, ``unix://`` or ``redis+cluster://`` URLs."""
    try:
        import redis.asyncio as aioredis
    except ImportError:
        raise ConfigError("backend", "needs redis-py: pip install 'admitgate[redis]'") from None
    try:
        if url.startswith(("redis+cluster://", "rediss+cluster://")):
            from redis.asyncio.cluster import RedisCluster

            return RedisCluster.from_url(url.replace("+cluster", "", 1))
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError("backend", "expected memory://, redis://, rediss://, unix:// or redis+cluster://", url)
        return aioredis.Redis.from_url(url)
    except (ValueError, TypeError) as exc:  # redis-py parses the URL here: a bad port, an unknown option
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("backend", f"not a Redis URL redis-py accepts ({exc})", url) from None


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes to choose its slot: the text between its first ``{`` and the
    first ``}`` after it, if that is not empty, else the whole key."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if start >= 0 and end > start + 1 else key


def budget_keys(name: object) -> list[str]:
    """The Redis keys of budget ``name``: its bucket, its replicas, their rates. ConfigError naming
    ``backend.name`` unless they share one hash tag: one lease script touches all three, and on a cluster keys
    in different slots fail every lease (an empty name, ``{}:bucket``, hashes each whole key)."""
    if not isinstance(name, str) or not name:
        raise ConfigError("backend.name", "must be a non-empty string", name)
    keys = [f"{{{name}}}:bucket", f"{{{name}}}:replicas", f"{{{name}}}:rates"]
    if len({hash_tag(key) for key in keys}) != 1:
        raise ConfigError("backend.name", "puts the budget's keys in different Redis Cluster slots (a name "
                          "starting with '}' leaves the hash tag empty)", name)  # fmt: skip
    return keys


class RedisBudget:
    """Lease this replica's tokens from a shared bucket in Redis. See the module docstring.

    ``url``: where Redis is. ``name``: the budget (replicas with the same name share it).
    ``lease_interval``: seconds between leases. ``ttl``: seconds a silent replica still counts.
    ``timeout``: seconds per Redis call. ``failures``/``cooldown``: the circuit breaker.
    ``on_failure``: ``"open"`` (keep 1/N of the last fleet rate) or ``"closed"`` (admit nothing).
    Attach to a gate with :meth:`attach`; the middleware does this for ``backend="redis://..."``.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "admitgate",
        lease_interval: float = 0.1,
        ttl: float = 3.0,
        timeout: float = 0.25,
        failures: int = 3,
        cooldown: float = 0.5,
        on_failure: str = "open",
        replica: str | None = None,
        client: Any = None,
    ) -> None:
        self.url = url
        self.name = name
        self.keys = budget_keys(name)
        self.lease_interval = positive("backend.lease_interval", lease_interval)
        self.ttl = positive("backend.ttl", ttl)
        self.timeout = positive("backend.timeout", timeout)
        integer("backend.failures", failures, 1)
        self.failures = failures
        self.cooldown = non_negative("backend.cooldown", cooldown)
        if on_failure not in ("open", "closed"):
            raise ConfigError("backend.on_failure", "must be 'open' or 'closed'", on_failure)
        self.on_failure = on_failure
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.client = client if client is not None else connect(url)
        self._script = self.client.register_script(LEASE)
        #: a lease asks for this many intervals' worth of recent demand: room for demand to double between
        #: leases without a refusal; what is not used goes back to the shared bucket at the next lease
        self.lease_margin = 2.0
        self._gate: Gate | None = None
        self.local_rate: float | None = None  # this replica's own μ (from its capacity source), published
        self.fleet_new = 0.0  # Σλ_new over the live replicas at the last lease, requests/s
        self.fleet_backlog = 0.0  # Σ backlog of the replicas' schedules at the last lease, tokens
        self._fleet_before = 0.0  # the same at the lease before
        self._backlog = 0.0  # this replica's backlog as published at the last lease, tokens
        self._landing_since: int | None = None  # the lease that last found the fleet's backlog growing, until landed
        self._grant_rate = self._grant_at = self._grant_until = 0.0  # the last grant: tokens/s, from, until
        self._borrowed_at: float | None = None  # since when it refills at its fail-open share (a late lease)
        self._borrowed_rate = 0.0
        self.fleet_rate: float | None = None  # what the shared bucket refills at
        self.replicas = 1
        self.degraded = False  # running on the local fallback
        self.errors = 0
        self.round_trips = 0
        self.granted = 0.0
        self._fixed = 0.0
        self._failed = 0
        self._retry_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._seen = 0  # the gate's decision count at the last lease

    def attach(self, gate: Gate, fixed_rate: float | None, clock: Clock = time.monotonic) -> None:
        """Take over ``gate``'s pacer. ``fixed_rate``: the fleet's configured rate (None: sum the replicas' μ).
        ``clock``: the gate's clock (seconds), for setting its pacer."""
        self._gate = gate
        self.clock = clock
        gate.backend = self
        self._fixed = fixed_rate or 0.0
        self.fleet_rate = fixed_rate or gate.pacer.rate
        self.local_rate = gate.pacer.rate
        self._burst = gate.pacer.burst  # the fleet's burst
        # Before the first lease (a few ms after start-up) only the local bucket's burst is admitted.
        gate.pacer.set_grant(0.0, clock())

    @property
    def gate(self) -> Gate:
        """The gate whose pacer this budget sets (an error before :meth:`attach`)."""
        if self._gate is None:
            raise RuntimeError("RedisBudget.attach(gate, ...) comes before leasing")
        return self._gate

    # -- the lease loop ------------------------------------------------------------------------
    def start(self) -> None:
        """Start leasing on the running event loop (idempotent; the middleware calls it per request)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="admitgate-lease")

    async def stop(self) -> None:
        """Stop leasing and close the client. The cancellation is repeated until the loop has ended:
        ``asyncio.wait_for`` can lose one that races its call's end (a Redis error at shutdown), and the
        loop would then sleep on for ever."""
        task = self._task
        if task is not None:
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=STOP_RETRY)
            if not task.cancelled() and task.exception() is not None:
                log.debug("admitgate: the lease loop ended with %r", task.exception())
        await self.client.aclose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.lease(started)
            await asyncio.sleep(max(0.0, self.lease_interval - (loop.time() - started)))

    def headroom(self, backlog: float) -> float | None:
        """This replica's share of the fleet's H, requests/s, for a schedule ``backlog`` tokens long now;
        None before the first lease (the replica's own H applies)."""
        if not self.fleet_rate or self.round_trips == 0:  # (no lease yet, or a fleet rate of 0)
            return None
        mu, new = self.fleet_rate, self.fleet_new
        fleet = max(mu - new - math.sqrt(new), mu * self.gate.tuning.min_share)
        total = self.fleet_backlog - self._backlog + backlog  # others as of the last lease, this one now
        return fleet * backlog / total if backlog > 0 and total > backlog else fleet

    def unsettled(self, backlog: float) -> bool:
        """Whether a herd is still landing on the fleet: this replica holds ``backlog`` places, more than its last
        lease published, by more than ``SETTLED`` of it and one place, or the leases have not yet found the fleet's
        backlog landed (see :meth:`_land`). A herd lands on every replica at once: a place told before the
        leases published the others' saw none of them and was told at all of the fleet's H (four times H clients
        told to come back in the same second, split 70/10/10/10 over four replicas)."""
        if self.degraded or self.round_trips == 0 or not self.fleet_rate:
            return False
        return self._landing or backlog - self._backlog > SETTLED * self._backlog + 1.0

    def _land(self, serial: int, stalest: int) -> None:
        """At lease number ``serial`` (Redis numbers them in turn), whether the fleet's backlog is still landing: it
        grew by more than ``SETTLED`` of it and one place since this replica's lease before, or it did at an earlier
        lease and some replica has not leased since (``stalest``: the number of the live replicas' oldest last
        lease). The replica a herd lands on most leases last (its event loop is busy with the herd's connections,
        1 s late on the fleet herd): found landed by their backlogs alone, the others told their herds as if it
        had none. Once it has landed, the places the gate held for it are woken, to be told."""
        if self.fleet_backlog - self._fleet_before > SETTLED * self._fleet_before + 1.0:
            self._landing_since = serial
        elif self._landing_since is not None and stalest > self._landing_since:
            self._landing_since = None
        if self._landing_since is None:
            self.gate.landed()

    @property
    def _landing(self) -> bool:
        return self._landing_since is not None

    def overdue(self, now: float) -> None:
        """The gate's refresh at ``now``: if the next lease is more than ``LATE`` intervals late (an event loop busy
        with a herd's connections) and the grant is below this replica's fail-open share (1/N of the fleet's
        rate), refill at that share until it comes; that lease pays back what was refilled beyond the grant, as
        for any late lease. A replica granted the 10/s of an idle one when a herd lands on it otherwise admits
        10/s until its next lease, 0.9 s later on the fleet herd, while it would run at 1/N of the fleet's rate
        with Redis unreachable."""
        if self._borrowed_at is not None or self.degraded or self.round_trips == 0 or self._gate is None:
            return
        if now - self._grant_at <= LATE * self.lease_interval or now >= self._grant_until:
            return
        share = (self.fleet_rate or 0.0) / max(1, self.replicas)
        if share > self._grant_rate:
            self._borrowed_at, self._borrowed_rate = now, share
            self._gate.pacer.set_grant(share, now, self._grant_until)

    def _demand(self) -> float:
        """Tokens per second this replica's requests asked for since the last lease: taken at once, asked to
        reserve (granted or not), or charged (critical), in the gate or in its tenants' pools. A client told
        to come back later because its place is not due asks for none."""
        gate = self.gate
        seen = gate.pacer.taken + gate.pacer.asked + gate.stats.critical + gate.ledger.delegated
        demand, self._seen = (seen - self._seen) / self.lease_interval, seen
        return demand

    async def lease(self, now: float) -> bool:
        """One lease. Returns False if Redis could not be reached (the fallback is in force then)."""
        gate = self.gate
        demand = self._demand()
        if self.degraded and now < self._retry_at:
            return False
        # What the next interval will ask for: the recent demand, or what this replica's share of the fleet's
        # schedule will bring back plus its new arrivals, whichever is more (a herd's returners come at their
        # places, not at the rate they were turned away).
        at = self.clock()
        backlog, new = gate.backlog()  # (its tenants' pools' included)
        share = self.headroom(backlog) if backlog else None
        if share is not None:  # its share of the fleet's schedule, and its new arrivals
            want = (share + new + math.sqrt(new)) * self.lease_interval
        else:
            want = max(1.0, demand * self.lease_interval * self.lease_margin)
        # Requests held for tokens reserved ahead (the pacer's debt) were given their times at the rate of the
        # last grant, and that rate is asked for again while they are owed. Leased by the schedule's share alone,
        # the grant fell as the schedule emptied (to 10/s with 80 tokens owed at the end of the fleet herd), and
        # the last holds, their tokens late, were told to come back in a second.
        owed = max(0.0, -gate.pacer.tokens(at))
        below = gate.ledger
        if at < below.owed_until:  # (its tenants' pools' too, as of the last reallocation, until it is repaid)
            owed += below.owed
        want = max(want, min(owed, self._grant_rate * self.lease_interval))
        mine = self.local_rate if self.local_rate is not None else gate.pacer.rate
        probes = gate.probes
        summary = f"{mine:.6g}"
        if probes is not None and probes.ring:
            last = probes.ring[-1]
            summary += f" completed={last.completed} latency={last.latency / max(1, last.completed):.6g}"
        pacer = gate.pacer
        args = [want, self.replica, summary, self._fixed, self._burst, self.ttl, self.lease_interval, backlog,
                new, self._overdraft(at)]  # fmt: skip
        try:
            self.round_trips += 1
            reply = await asyncio.wait_for(self._script(keys=self.keys, args=args), self.timeout)
        except Exception as exc:  # timeouts, connection errors, NOSCRIPT that could not be fixed, ...
            # What the grant refills from now on is the fault's, as the fallback's is: not owed. Paid back by the
            # first lease after a 5 s outage, it was 0.9 s of the grant, and the fleet admitted 9 of 60 in that
            # second.
            self._grant_until = min(self._grant_until, at)
            self._fail(now, exc)
            return False
        granted, rate, replicas = float(reply[0]), float(reply[1]), int(reply[2])
        self._fleet_before = self.fleet_backlog
        self.fleet_backlog, self.fleet_new, self._backlog = float(reply[4]), float(reply[5]), backlog
        self._land(int(reply[6]), int(reply[7]))
        if self.degraded:
            log.warning("admitgate: backend %s is back; leasing from the shared budget again", self.url)
        self.degraded, self._failed = False, 0
        self.granted += granted
        self.fleet_rate, self.replicas = rate, max(1, replicas)
        at = self.clock()
        pacer.set_burst(max(1.0, self._burst / self.replicas), at)
        self._grant_rate, self._grant_at, self._borrowed_at = granted / self.lease_interval, at, None
        self._grant_until = at + self.lease_interval * GRACE
        pacer.set_grant(self._grant_rate, at, self._grant_until)
        return True

    def _overdraft(self, at: float) -> float:
        """Tokens owed to the shared bucket at ``at``: the last grant went on refilling past its interval while this
        lease was late (a busy event loop), up to the first failed lease if one failed, and what it refilled at its
        fail-open share beyond the grant."""
        end = min(at, self._grant_until)
        overdraft = self._grant_rate * max(0.0, end - self._grant_at - self.lease_interval)
        if self._borrowed_at is not None:
            overdraft += (self._borrowed_rate - self._grant_rate) * max(0.0, end - self._borrowed_at)
        return overdraft

    def _fail(self, now: float, exc: BaseException) -> None:
        self.errors += 1
        self._failed += 1
        if self._failed < self.failures and not self.degraded:
            return
        if not self.degraded:
            log.warning("admitgate: backend %s failing (%s); running on the local %s fallback", self.url,
                        type(exc).__name__ or exc, self.on_failure)  # fmt: skip
        self.degraded = True
        self._retry_at = now + self.cooldown
        self._borrowed_at = None
        pacer = self.gate.pacer
        if self.on_failure == "open":
            share = (self.fleet_rate or pacer.rate) / max(1, self.replicas)
            pacer.set_grant(share, self.clock())
        else:
            pacer.set_grant(0.0, self.clock())

    def __repr__(self) -> str:
        mode = "degraded" if self.degraded else "leasing"
        return f"RedisBudget({self.url!r}, {self.name!r}, fleet={self.fleet_rate}/s, replicas={self.replicas}, {mode})"


def backend_from_url(url: str | None, **options: Any) -> RedisBudget | None:
    """``None`` or ``memory://`` -> no shared budget; a Redis URL -> :class:`RedisBudget`."""
    if url is None or url == "memory://" or url.startswith("memory://"):
        return None
    return RedisBudget(url, **options)
