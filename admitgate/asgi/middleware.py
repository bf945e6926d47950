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

import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from functools import partial

import anyio
from prometheus_client import CollectorRegistry

from ..backends.shared import RedisBudget
from ..core.clock import Clock
from ..core.decision import Decider, Decision, Verdict
from ..core.errors import ConfigError
from ..core.gate import Gate
from ..core.priority import Priority, Rule
from ..core.settings import Settings
from ..core.source import Capacity
from ..core.tenants import Tenancy
from ..metrics import ABANDONED, AFTER_PACING, AT_ONCE, REJECTED, TALLY
from .build import alone, attach, build, ticket_of, wire_metrics
from .cors import AppCors, is_preflight
from .exchange import Exchange, Flight, Watch
from .headers import HeaderPolicy
from .identity import Identity, Recogniser
from .lag import lag_monitor
from .limits import Limits, Refusal
from .pacing import hold
from .quota import Quota
from .responses import Responder
from .routing import metrics_mounts
from .startup import built_by_starlette, fail_startup
from .types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("admitgate")


#: Paths never gated unless told otherwise: probes and scrapes must get through while the gate rejects.
DEFAULT_EXEMPT = ("/health", "/healthz", "/metrics")


class AdmitGate:
    """Admission control for an ASGI app.

        app.add_middleware(AdmitGate, rate=200, settings=Settings(burst=20))

    ``rate``: the capacity μ of the service in requests/s; None (default) learns it live; a
    :class:`~admitgate.core.source.Capacity` (such as ``LiveCapacity``) for a tuned estimator.
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
    limit per key on every route (:class:`~admitgate.asgi.quota.Quota`, such as ``Quota("100/minute")``); a
    route's own comes from ``routes`` or is declared on the app's route (``Depends(Quota(...))``,
    :func:`~admitgate.asgi.quota.limited`). Quotas are checked before the gate: a request over one is refused
    without taking a token; with a Redis ``backend`` the count is the fleet's.
    A second AdmitGate around the same app is refused (a ConfigError at start-up): every request would be
    decided twice, by two buckets and two retry schedules.
    ``gate_websockets``: gate websocket handshakes too. ``gate``: a prebuilt
    :class:`~admitgate.core.gate.Gate` (the simulator and tests), instead of ``rate``, ``settings`` and
    ``workers``. ``clock`` (monotonic seconds), ``wall_clock`` (Unix seconds, for ticket expiry) and
    ``sleep`` (an async function of seconds: pacing and the tarpit) are injected, so tests run on
    virtual time. Every bad value is a :class:`~admitgate.core.errors.ConfigError` naming it, raised here
    (under Starlette's lazy build: a failed lifespan start-up, see :mod:`admitgate.asgi.startup`); the parts are
    built by :mod:`admitgate.asgi.build`.

    Each request is decided by one :class:`~admitgate.core.decision.Decider`: the gate, or with ``tenants`` the
    table of its tenants' pools, the request's tenant named once.
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
            alone(app, AdmitGate)
            parts = build(app, rate=rate, routes=routes, exempt=exempt, classes=classes, default_class=default_class,
                          settings=settings, identity=identity, headers=headers, metrics=metrics, backend=backend,
                          workers=workers, tenants=tenants, quota=quota, gate_websockets=gate_websockets, gate=gate,
                          clock=clock, wall_clock=wall_clock, sleep=sleep)  # fmt: skip
        except ConfigError as error:
            if not built_by_starlette():
                raise
            self.__class__ = _Misconfigured  # Starlette's lazy build would hide the error: fail the start-up
            self.app, self.error = app, error
            return
        self.app, self.clock, self.wall_clock, self.sleep = app, clock, wall_clock, parts.sleep
        self.gate, self.tenants, self.router, self.backend = parts.gate, parts.tenants, parts.router, parts.backend
        self._quota: Limits | None = parts.limits  # every quota; None once the app is known to have none
        self.headers, self.gate_websockets = parts.headers, parts.gate_websockets
        self.key_func = parts.identity.key_func
        self.ticket = ticket_of(parts.identity, parts.server, workers)
        self._recognise = Recogniser.of(parts.identity, self.ticket, wall_clock)
        #: what decides each request (the tenants' table, or the gate), and how a request's tenant is named
        self.decider: Decider = parts.tenants if parts.tenants is not None else parts.gate
        self._tenant_of = parts.tenant_of
        # Bound once so the admit path does no attribute chasing.
        self._cached_rule, self._take = self.router.cache.get, self.decider.try_take
        self._on_admit, self._probes = self.headers.on_admit, self.gate.probes
        self._lag = lag_monitor(self.gate, clock)  # (started at the lifespan's start-up, or by the first request)
        self._lag_idle = self._lag is not None  # (the monitor is to start: see _start_lag)
        self._watch = None if self._probes is None else Watch(self._probes, self.decider)  # (what responses tell)
        self.tally: dict[tuple[str, str], list[int]] = {}  # (route template, class) -> counts read at scrape time
        self.responses = Responder(self.headers, AppCors(self.headers.exposed, self), self.decider, self.ticket,
                                   clock, wall_clock, self.gate.max_pacing_delay, self._recognise.untied)  # fmt: skip
        self._metrics_mounts: frozenset[str] | None = None  # paths of the app's mounts of a metrics app
        attach(parts.backend, self.gate, parts.tenants, clock)
        self._tally_on = metrics is not None
        # Nothing to do around an admitted request but call the app: one check on the admit path, not three.
        self._bare = not self._tally_on and not self._on_admit and self._probes is None
        self._sync = wire_metrics(self, metrics)

    # Callables kept on the instance are read as attributes, then called: `self.f(...)` would look f up as a method
    # first (on the class, in vain) on every request. An admitted request is served here, not by a coroutine of its
    # own: the default gate's probes follow every request, and its send wrapper is made without a call.
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "OPTIONS" and is_preflight(scope)):  # (the app's CORS layer
            await self._not_http(scope, receive, send)  # answers a preflight; no route runs)
            return
        cached_rule, clock, take, tenant_of = self._cached_rule, self.clock, self._take, self._tenant_of
        rule = cached_rule(scope["path"]) or self.router.resolve(scope["path"], scope)
        exchange = None
        if self._quota is not None and not rule.exempt:  # before the gate: a refusal must not take a token
            refused, exchange = await self._by_quota(scope, send, rule)
            if refused:
                return
        now = clock()
        tenant = None if tenant_of is None else tenant_of(scope)  # (the request's tenant, named once)
        if rule.fast and take(rule.cost, now, tenant):  # admitted at once: nobody holds a place, a token is free
            if self._bare:
                app = self.app
                await app(scope, receive, send)
                return
            outcome = AT_ONCE
        elif rule.exempt:
            await self.app(self._exempt(scope), receive, send)
            return
        else:
            decision = self._decide(scope, rule, now, tenant)
            if decision.delay or decision.verdict is Verdict.REJECT:
                sent = send if exchange is None else exchange.send  # (the quota's fields on a rejection too)
                settled = await self._settle(scope, receive, sent, rule, decision)
                if settled is None:  # answered (rejected) or abandoned
                    return
                outcome, receive, now = settled
            else:
                outcome = AT_ONCE
        if self._tally_on:
            self._count(rule, outcome)
        watch = self._watch
        if exchange is not None or self._on_admit:  # the response gains fields: through its exchange
            exchange = self._wrap(scope, send, exchange, tenant)
        if watch is None:  # no probes to tell
            await self.app(scope, receive, send if exchange is None else exchange.send)
            return
        wrapped = Flight() if exchange is None else exchange
        if exchange is None:
            wrapped.downstream, wrapped.status, wrapped.watch = send, 0, watch
        probes = watch.probes
        if outcome != AFTER_PACING:  # (a request let in by its hold is in flight already)
            probes.admit(now)
        if self._lag_idle:  # (no lifespan: the first request served starts the lag monitor)
            self._start_lag()
        try:
            await self.app(scope, receive, wrapped.send)
        except BaseException as error:
            wrapped.ended(error, clock())
            raise
        end = clock()
        if wrapped.status:  # its latency until the app has finished its response: a streamed body counts in full
            probes.complete(end - now, wrapped.status, end, True)
        else:  # returned without a response
            probes.cancel(end)
        if watch.waiting:
            watch.room()

    # The slow path is a method of its own: a closure in __call__ would make its captured variables cells, allocated
    # on every request, the fast path's included.

    def _decide(self, scope: Scope, rule: Rule, now: float, tenant: str | None) -> Decision:
        """The decider's decision on a request the admit path did not admit at once.

        A plain method, not a coroutine: a request admitted here is served without an await of its own;
        only a hold or a rejection goes on to :meth:`_settle`.
        """
        if self._sync is not None:
            self._sync.start()
        if self.backend is not None:
            self.backend.start()
        identify = lambda: self.identify(scope, now)  # noqa: E731
        return self.decider.admit(rule.cost, rule.priority, now, identify, tenant)

    def _wrap(self, scope: Scope, send: Send, exchange: Exchange | None, tenant: str | None) -> Exchange:
        """The exchange of an admitted request whose response gains fields (a quota's, the rate-limit fields of
        ``tenant``), made now if it has none, reporting to the probes if there are any."""
        if exchange is None:
            exchange = self.responses.exchange(scope, send)
        if self._on_admit:
            exchange.limit = partial(self.responses.limit_fields, tenant)
        exchange.watch = self._watch
        return exchange

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

    def _lifespan(self, receive: Receive) -> Receive:
        """Start the lease loop, the metrics sync and the lag monitor at start-up (not at the first request); stop
        them at shutdown."""

        async def lifespan_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._lag is not None:
                    self._start_lag()
                if self.backend is not None:
                    self.backend.start()
                if self._sync is not None:
                    self._sync.start()
            elif message["type"] == "lifespan.shutdown":
                if self._lag is not None:
                    self._lag.stop()
                if self.backend is not None:
                    await self.backend.stop()
                if self._sync is not None:
                    self._sync.stop()
            return message

        return lifespan_receive

    def _start_lag(self) -> None:
        """Start the lag monitor on the running event loop (it stays idle where there is no asyncio loop)."""
        assert self._lag is not None
        self._lag.start()
        self._lag_idle = not self._lag.running

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
    def untied_counts(self) -> tuple[int, int, int]:
        """Requests nothing tied to a client, tickets handed to such clients, and those that came back: for
        metrics (see :mod:`admitgate.asgi.untied`)."""
        return self._recognise.untied.counts

    @property
    def quota_refused(self) -> int:
        """Requests refused over their key's quota so far (0 without a quota): for metrics."""
        return 0 if self._quota is None else self._quota.refused

    # -- identity -------------------------------------------------------------------------
    def identify(self, scope: Scope, now: float) -> Hashable | None:
        """The booking key (:class:`~admitgate.asgi.identity.Recogniser`): a valid retry ticket's id, else a keyed
        digest of ``key_func(scope)``, else a fresh id for the ticket cookie to carry (None without tickets)."""
        return self._recognise(scope)

    async def _over_quota(self, scope: Scope, send: Send, rule: Rule, refusal: Refusal) -> None:
        """Refuse a request over its key's quota: the rejection's status, the quota's fields and body."""
        if self._tally_on:
            self._count(rule, REJECTED)
        rejection = self.responses.quota_rejection(refusal)
        await self.responses.send_rejection(scope, send, refusal.retry_after, *rejection)

    def _exempt(self, scope: Scope) -> Scope:
        """An exempt request's scope, as the app is to see it: a request for the path of a mount of a metrics app
        (``app.mount("/metrics", metrics_app())``) goes to it as ``/metrics/``, so it is answered 200, not sent
        by Starlette's router to ``/metrics/`` with a redirect a person's curl does not follow."""
        mounts = self._metrics_mounts
        if mounts is None:
            mounts = self._metrics_mounts = metrics_mounts(self.app, scope)
        if not mounts or scope["path"].removeprefix(scope.get("root_path", "")) not in mounts:
            return scope
        raw = scope.get("raw_path")
        return {**scope, "path": scope["path"] + "/", "raw_path": None if raw is None else raw + b"/"}

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Lifespan and websocket scopes (and any other), and CORS preflights (the app's CORS layer answers them; no
        route runs): passed through, but for gated websocket handshakes and the lease loop's and metrics' start-up
        and shutdown."""
        if scope["type"] == "websocket" and self.gate_websockets:
            await self._websocket(scope, receive, send)
        elif scope["type"] == "lifespan" and (self.backend is not None or self._sync is not None or
                                              self._lag is not None):  # fmt: skip
            await self.app(scope, self._lifespan(receive), send)
        else:
            await self.app(scope, receive, send)

    async def _by_quota(self, scope: Scope, send: Send, rule: Rule) -> tuple[bool, Exchange | None]:
        """The request's quota: (True: refused, its answer sent; the exchange adding the quota's fields to its
        response, or None)."""
        limits = self._quota
        assert limits is not None
        if not limits.scanned and self._scan(scope):  # the first request: no quota anywhere, nothing to check
            return False, None
        answer = await limits.answer(scope, rule)
        if isinstance(answer, Refusal):
            await self._over_quota(scope, send, rule, answer)
            return True, None
        if answer is not None and self._on_admit:  # its fields too (the gate's are added as it admits)
            return False, self.responses.quota_exchange(scope, send, answer)
        return False, None

    def _scan(self, scope: Scope) -> bool:
        """Read the quotas declared on the app's routes again, at the first request (the app may have gained routes
        since the gate was made); with no quota anywhere, drop the check for good (True)."""
        assert self._quota is not None
        self._quota.scan(self.app, scope)
        if self._quota.idle:
            self._quota = None
            return True
        return False

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        rule = self.router.resolve(scope["path"])
        if rule.exempt:
            await self.app(scope, receive, send)
            return
        if self._quota is not None and not (not self._quota.scanned and self._scan(scope)):  # before the gate
            answer = await self._quota.answer(scope, rule)
            if isinstance(answer, Refusal):
                await self.responses.refuse_handshake(scope, receive, send, *self.responses.quota_rejection(answer))
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
