"""``AdmitGate``: the pure-ASGI admission middleware.

    app.add_middleware(AdmitGate, rate=200, routes={"/search": {"cost": 2}})

Per HTTP request it admits, paces (holds the request until its reserved token
exists, at most ``max_pacing_delay`` s), or rejects with 429 (or 503), a computed
Retry-After that spreads the rejected cohort, rate-limit fields and a problem body.
Lifespan and other scope types pass straight through; websocket handshakes are
gated only with ``gate_websockets=True``; CORS preflights are never gated, and rejections carry
what the app's own CORS policy adds (:mod:`admitgate.asgi.cors`). Exceptions from the app propagate unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping

import anyio
from prometheus_client import CollectorRegistry

from ..backends.shared import RedisBudget, backend_from_url
from ..core.clock import Clock
from ..core.decision import Decider, Decision, Verdict
from ..core.errors import ConfigError, async_function, flag, instance, integer, reading
from ..core.gate import Gate
from ..core.priority import Priority, Rule
from ..core.probes import Probes
from ..core.rate import Capacity
from ..core.settings import Settings
from ..core.tenants import Tenancy, Tenants
from ..metrics import (
    ABANDONED,
    AFTER_PACING,
    AT_ONCE,
    REJECTED,
    TALLY,
    GateCollector,
    MultiprocessSync,
    multiprocess_dir,
)
from .cors import is_preflight
from .headers import HeaderPolicy
from .identity import Identity, Recogniser
from .keys import TenantFunc, naming
from .pacing import hold
from .quota import Quota, QuotaGuard
from .responses import Responder
from .routing import Router
from .startup import built_by_starlette, fail_startup
from .ticket import RetryTicket
from .types import ASGIApp, Message, Receive, Scope, Send
from .workers import Server, detect, worker_secret

log = logging.getLogger("admitgate")


#: Paths never gated unless told otherwise: probes and scrapes must get through while the gate rejects.
DEFAULT_EXEMPT = ("/health", "/healthz", "/metrics")


class AdmitGate:
    """Admission control for an ASGI app.

        app.add_middleware(AdmitGate, rate=200, settings=Settings(burst=20))

    ``rate``: the capacity μ of the service in requests/s; None (default) learns it live; a
    :class:`~admitgate.limit.capacity.Capacity` (such as ``LiveCapacity``) for a tuned estimator.
    ``routes``: route template -> ``{"cost": tokens, "class": name, "exempt": bool}``. ``exempt``:
    templates never gated, each covering the paths below it. ``classes``: name ->
    :class:`~admitgate.priority.Priority` (default: critical, default, sheddable); ``default_class``: the
    class of unlisted routes. ``settings``: the gate's knobs (:class:`~admitgate.core.settings.Settings`).
    ``identity``: who a client is (:class:`~admitgate.asgi.identity.Identity`). ``headers``: the rejection's
    status and fields (:class:`~admitgate.asgi.headers.HeaderPolicy`). ``metrics``: a prometheus-client
    ``CollectorRegistry`` to export to (None: no metrics). ``backend``: ``"memory://"`` or None (this
    process only), a Redis URL or a :class:`~admitgate.backends.shared.RedisBudget`: then ``rate`` is the whole
    fleet's, shared through Redis. ``workers``: how many processes of one server share ``rate`` (each
    admits its share; default: counted from the server's command line, see :mod:`admitgate.asgi.workers`).
    ``tenants``: who the tenants are (:class:`~admitgate.Tenancy`): each gets its weighted fair share
    of the capacity and a retry schedule of its own (None: one pool for all, the default). ``quota``: a hard
    limit per key (:class:`~admitgate.asgi.quota.Quota`, such as ``Quota("100/minute")``), checked before the
    gate: a request over it is refused without taking a token; with a Redis ``backend`` the count is the fleet's.
    ``gate_websockets``: gate websocket handshakes too. ``gate``: a prebuilt
    :class:`~admitgate.core.gate.Gate` (the simulator and tests), instead of ``rate``, ``settings`` and
    ``workers``. ``clock`` (monotonic seconds), ``wall_clock`` (Unix seconds, for ticket expiry) and
    ``sleep`` (an async function of seconds: pacing and the tarpit) are injected, so tests run on
    virtual time. Every bad value is a :class:`~admitgate.core.errors.ConfigError` naming it, raised here
    (under Starlette's lazy build: a failed lifespan start-up, see :mod:`admitgate.asgi.startup`).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        rate: float | Capacity | None = None,
        routes: Mapping[str, Mapping[str, object] | Rule] | None = None,
        exempt: Iterable[str] = DEFAULT_EXEMPT,
        classes: Mapping[str, Priority] | None = None,
        default_class: str = "default",
        settings: Settings | None = None,
        identity: Identity | None = None,
        headers: HeaderPolicy | None = None,
        metrics: CollectorRegistry | None = None,
        backend: str | RedisBudget | None = None,
        workers: int | None = None,
        tenants: Tenancy | None = None,
        quota: Quota | None = None,
        gate_websockets: bool = False,
        gate: Gate | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        try:
            now = reading("clock", clock)
            reading("wall_clock", wall_clock)
            self.sleep = async_function("sleep", sleep)
            self.gate_websockets = flag("gate_websockets", gate_websockets)
            identity = instance("identity", identity, Identity)
            self.headers = instance("headers", headers, HeaderPolicy)
            if metrics is not None and not isinstance(metrics, CollectorRegistry):
                raise ConfigError("metrics", "must be a prometheus_client CollectorRegistry, or None", metrics)
            backend = backend_from_url(backend) if isinstance(backend, str) else backend
            if backend is not None and not isinstance(backend, RedisBudget):
                raise ConfigError("backend", "must be a URL (memory://, redis://...) or a RedisBudget", backend)
            server = detect()
            self.gate = gate_of(gate, rate, settings, workers, server, backend is not None, now)
            if metrics is not None and self.gate.probes is None:  # a typed-in rate learns nothing, but the latency,
                self.gate.probes = Probes(now=now)  # in-flight and response series are exported in every mode
            # With metrics, paths no rule names are labelled by the app's own route templates.
            labels_from = app if metrics is not None else None
            self.router = Router(routes, exempt, default_class=default_class, classes=classes, app=labels_from)
            self.router.check_burst(self.gate.pacer.burst)
            reserve = max((c.reserve for c in self.router.classes.values()), default=0.0)  # (see Gate.keep)
            self.tenants = None if tenants is None else Tenants(tenants, self.gate, reserve=reserve, now=now)
            #: the request's tenant's name, read once per request (None without tenants)
            self._tenant_of: TenantFunc | None = None if tenants is None else naming(
                tenants.key, identity.trusted_hops, identity.forwarded)  # fmt: skip
            if quota is not None and not isinstance(quota, Quota):
                raise ConfigError("quota", "must be an admitgate.Quota (or None)", quota)
            self._quota = None if quota is None else QuotaGuard(quota, clock, identity.trusted_hops,
                                                                identity.forwarded, backend)  # fmt: skip
        except ConfigError as error:
            if not built_by_starlette():
                raise
            self.__class__ = _Misconfigured  # Starlette's lazy build would hide the error: fail the start-up
            self.app, self.error = app, error
            return
        self.app = app
        self.clock = clock
        self.wall_clock = wall_clock
        self.key_func = identity.key_func
        shared = identity.secret
        if identity.ticket is True and (server is not None or (workers or 1) > 1):
            shared = worker_secret()  # the workers of one server must know each other's tickets
        self.ticket = None if identity.ticket is False else RetryTicket(shared, always_secure=identity.secure_cookie)
        self._recognise = Recogniser(self.key_func, self.ticket, wall_clock)
        # Bound once so the admit path does no attribute chasing.
        self._cached_rule = self.router.cache.get
        #: what decides each request: the tenants' table, or the gate
        self.decider: Decider = self.tenants if self.tenants is not None else self.gate
        self._take = self.decider.try_take
        self._on_admit = self.headers.on_admit
        self._probes = self.gate.probes
        # Metrics are read at scrape time (admitgate.metrics.GateCollector); here only plain tallies.
        self.tally: dict[tuple[str, str], list[int]] = {}  # (route template, class) -> counts, see metrics.TALLY
        self.responses = Responder(self, self.headers, self.gate, self.decider, self._quota, self.ticket, clock,
                                   wall_clock)  # fmt: skip
        self.backend = backend
        if backend is not None:  # one budget for the fleet: a typed-in rate is the fleet's rate
            backend.attach(self.gate, self.gate.static_rate, clock)
            if self.tenants is not None:  # (the lease bounds the replica: the pools need no bucket of its own)
                self.tenants.follow(clock())
        self._tally_on = metrics is not None
        # Nothing to do around an admitted request but call the app: one check on the admit path, not three.
        self._bare = not self._tally_on and not self._on_admit and self._probes is None
        self._sync: MultiprocessSync | None = None
        if metrics is not None:
            if multiprocess_dir():
                self._sync = MultiprocessSync(self)  # started at the lifespan start-up (or the first request)
            else:
                metrics.register(GateCollector(self))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket" and self.gate_websockets:
                await self._websocket(scope, receive, send)
            elif scope["type"] == "lifespan" and (self.backend is not None or self._sync is not None):
                await self.app(scope, self._lifespan(receive), send)
            else:
                await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and is_preflight(scope):  # the app's CORS layer answers it; no route runs
            await self.app(scope, receive, send)
            return
        # Callables kept on the instance are read as attributes, then called: `self.f(...)` would look f up
        # as a method first (on the class, in vain) on every request.
        cached_rule, clock, take = self._cached_rule, self.clock, self._take
        rule = cached_rule(scope["path"]) or self.router.resolve(scope["path"], scope)
        if self._quota is not None and not rule.exempt:  # before the gate: a refusal must not take a token
            answer = await self._quota.answer(scope)
            if answer is not None:
                if answer.wait > 0:
                    await self._over_quota(scope, send, rule, self._quota.retry_after(answer))
                    return
                if self._on_admit:  # the quota's fields too (the gate's own are added as it admits)
                    send = self.responses.with_quota_fields(scope, send, answer)
        now = clock()
        tenant = None if self._tenant_of is None else self._tenant_of(scope)  # (the request's tenant, named once)
        if rule.fast and take(rule.cost, now, tenant):  # admitted at once: nobody holds a place, a token is free
            if self._bare:
                app = self.app
                await app(scope, receive, send)
                return
            outcome = AT_ONCE
        elif rule.exempt:
            await self.app(scope, receive, send)
            return
        else:
            decision = self._decide(scope, rule, now, tenant)
            if decision.delay or decision.verdict is Verdict.REJECT:
                settled = await self._settle(scope, receive, send, rule, decision)
                if settled is None:  # answered (rejected) or abandoned
                    return
                outcome, receive, now = settled
            else:
                outcome = AT_ONCE
        if self._tally_on:
            self._count(rule, outcome)
        if self._on_admit:
            send = self.responses.with_limit_fields(scope, send, tenant)
        probes = self._probes
        if probes is None:
            app = self.app
            await app(scope, receive, send)
        else:  # (let in after a hold: in flight already, see _settle)
            await self._probed(scope, receive, send, now, probes, outcome == AFTER_PACING)

    # The slow path and the probed path are methods of their own: a closure in __call__ would make its
    # captured variables cells, allocated on every request, the fast path's included.

    def _decide(self, scope: Scope, rule: Rule, now: float, tenant: str | None) -> Decision:
        """The gate's (or the tenant pools') decision on a request the inlined fast path did not admit.

        A plain method, not a coroutine: a request admitted here is served without an await of its own;
        only a hold or a rejection goes on to :meth:`_settle`.
        """
        if self._sync is not None:
            self._sync.start()
        if self.backend is not None:
            self.backend.start()
        identify = lambda: self.identify(scope, now)  # noqa: E731
        return self.decider.admit(rule.cost, rule.priority, now, identify, tenant)

    async def _settle(
        self, scope: Scope, receive: Receive, send: Send, rule: Rule, decision: Decision
    ) -> tuple[int, Receive, float] | None:
        """Hold ``decision``'s request for its delay, or reject it.

        Returns ``(outcome, receive, now)`` for a request to serve (``receive`` is wrapped while it was
        held, ``now`` is the time it was let in), or None once it is answered or its client went away. A request
        let in (``AFTER_PACING``) is in flight in the probes already: the hold put it there as it let it in.
        """
        if decision.delay:
            paced = decision.verdict is Verdict.PACE
            probes = self._probes if paced else None  # (a tarpit's hold ends in its 429)
            after, receive = await hold(self.decider, self.clock, self.sleep, decision, scope, receive, probes)
            if after is None:  # the client went away while held
                if self._tally_on:
                    self._count(rule, ABANDONED)
                return None
            decision = after
            if decision.verdict is not Verdict.REJECT:
                return AFTER_PACING if paced else AT_ONCE, receive, self.clock()
        if self._tally_on:
            self._count(rule, REJECTED)
        await self.responses.reject(scope, send, decision.retry_after, decision.rate, decision.key)
        return None

    async def _probed(self, scope: Scope, receive: Receive, send: Send, now: float, probes: Probes,
                      entered: bool = False) -> None:  # fmt: skip
        """Serve an admitted request under ``probes`` (a live capacity).

        In flight from ``now`` (``entered``: put in flight already, by its hold), and answered from its
        response's start (the in-flight limit leaves it out from then: see :class:`Probes`); latency until the
        app has finished its response (the app returns after its last body chunk, so streaming counts in full),
        and the outcome. An app that raises is an error; a cancelled one (the client went away) gives no sample.
        """
        if not entered:
            probes.admit(now)
        status = 0

        def probe_send(message: Message) -> Awaitable[None]:  # returns send's awaitable: no extra coroutine
            nonlocal status
            if not status:  # the first message is http.response.start
                status = message.get("status", 0)
                if status:  # answered: its body may stream on, but the in-flight limit leaves it out
                    probes.answered += 1
            return send(message)

        try:
            await self.app(scope, receive, probe_send)
        except Exception:
            probes.fail(self.clock(), bool(status))
            raise
        except BaseException:
            probes.cancel(self.clock(), bool(status))
            raise
        end = self.clock()
        if status:
            probes.complete(end - now, status, end, True)
        else:  # returned without a response
            probes.cancel(end)

    def _lifespan(self, receive: Receive) -> Receive:
        """Start the lease loop and the metrics sync at start-up (not at the first request); stop at shutdown."""

        async def lifespan_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.backend is not None:
                    self.backend.start()
                if self._sync is not None:
                    self._sync.start()
            elif message["type"] == "lifespan.shutdown":
                if self.backend is not None:
                    await self.backend.stop()
                if self._sync is not None:
                    self._sync.stop()
            return message

        return lifespan_receive

    def _count(self, rule: Rule, index: int) -> None:
        key = (rule.template, rule.priority.name)
        counts = self.tally.get(key)
        if counts is None:
            counts = self.tally[key] = [0] * len(TALLY)
        counts[index] += 1

    @property
    def retry_after_counts(self) -> list[int]:
        """429s per :data:`~admitgate.metrics.RETRY_AFTER_BOUNDS` bucket of their Retry-After (for metrics)."""
        return self.responses.retry_after_counts

    @property
    def retry_after_sum(self) -> int:
        """Seconds of Retry-After given out (for metrics)."""
        return self.responses.retry_after_sum

    @property
    def quota_refused(self) -> int:
        """Requests refused over their key's quota so far (0 without a quota): for metrics."""
        return 0 if self._quota is None else self._quota.refused

    # -- identity -------------------------------------------------------------------------
    def identify(self, scope: Scope, now: float) -> Hashable | None:
        """The booking key (:class:`~admitgate.asgi.identity.Recogniser`): a valid retry ticket's id, else a keyed
        digest of ``key_func(scope)``, else a fresh id for the ticket cookie to carry (None without tickets)."""
        return self._recognise(scope)

    async def _over_quota(self, scope: Scope, send: Send, rule: Rule, retry_after: int) -> None:
        """Refuse a request over its key's quota: the rejection's status, the quota's fields and body."""
        if self._tally_on:
            self._count(rule, REJECTED)
        await self.responses.send_rejection(scope, send, retry_after, *self.responses.quota_rejection(retry_after))

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        rule = self.router.resolve(scope["path"])
        if rule.exempt:
            await self.app(scope, receive, send)
            return
        if self._quota is not None:  # before the gate, as for HTTP: a refusal must not take a token
            answer = await self._quota.answer(scope)
            if answer is not None and answer.wait > 0:
                retry_after = self._quota.retry_after(answer)
                await self.responses.refuse_handshake(
                    scope, receive, send, *self.responses.quota_rejection(retry_after)
                )
                return
        decider = self.decider
        now = self.clock()
        identify = lambda: self.identify(scope, now)  # noqa: E731
        tenant = None if self._tenant_of is None else self._tenant_of(scope)
        decision: Decision | None = decider.admit(rule.cost, rule.priority, now, identify, tenant)
        while decision is not None and decision.delay:  # a handshake has no body to watch: just wait
            try:
                await self.sleep(decision.delay)
            except BaseException:
                decider.end_hold(decision, self.clock(), gone=True)
                raise
            decision = decider.end_hold(decision, self.clock())
        if decision is None or decision.verdict is not Verdict.REJECT:
            await self.app(scope, receive, send)
            return
        rejection = self.headers.rejection(decision.retry_after, decision.rate)
        await self.responses.refuse_handshake(scope, receive, send, *rejection)


class _Misconfigured(AdmitGate):
    """An AdmitGate whose configuration failed while Starlette built its middleware stack: it fails the
    lifespan start-up with the error, so the server exits (see :mod:`admitgate.asgi.startup`)."""

    error: ConfigError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await fail_startup(self.error, scope, receive, send)


def gate_of(gate: object, rate: object, settings: Settings | None, workers: object, server: Server | None,
            shared: bool, now: float) -> Gate:  # fmt: skip
    """The middleware's :class:`Gate`: ``gate`` as given, or built from ``rate`` and ``settings``.

    A typed-in rate is the server's: when ``workers`` processes (declared, else counted from the
    ``server``'s command line) each run a gate, each admits its share of the rate and of an explicit
    burst. A learnt rate is learnt by each worker from its own traffic, and a ``shared`` budget (Redis)
    splits the rate itself: neither is divided.
    """
    if gate is not None:
        if rate is not None or settings is not None or workers is not None:
            raise ConfigError("gate", "a prebuilt Gate carries its own rate and settings: pass gate alone")
        if not isinstance(gate, Gate):
            raise ConfigError("gate", "must be an admitgate.core.gate.Gate", gate)
        return gate
    settings = instance("settings", settings, Settings)
    count = integer("workers", workers, 1, 1024) if workers is not None else None
    if rate is None:  # nobody typed in a capacity: learn it (the default estimator, no hint)
        from ..config import capacity_from_config

        return Gate(capacity_from_config({}, now=now), settings, now=now)
    if count is not None and server is not None and server.workers not in (None, count):
        log.warning("admitgate: workers=%d, but the server runs %d (%s)", count, server.workers, server.how)
    if count is None and server is not None:
        count = server.workers
        if count is None and not shared:
            log.warning("admitgate: this process is one of several workers of %s, and each admits rate=%r on its "
                        "own; declare how many share it (workers=N, or ADMITGATE_WORKERS) or share one budget "
                        "(backend='redis://...')", server.how, rate)  # fmt: skip
    if not count or count == 1 or shared or isinstance(rate, Capacity):
        return Gate(rate, settings, now=now)  # type: ignore[arg-type]  # (Gate checks rate's type)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ConfigError("rate", "must be requests/s (a number) or a Capacity such as LiveCapacity", rate)
    log.info("admitgate: %d workers share rate=%g requests/s: this one admits %g", count, rate, rate / count)
    burst = None if settings.burst is None else max(1.0, settings.burst / count)  # a request needs a whole token
    return Gate(rate / count, dataclasses.replace(settings, burst=burst), now=now)
