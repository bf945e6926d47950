"""How an :class:`~admitgate.asgi.middleware.AdmitGate` is put together, once, at construction.

:func:`build` checks every argument and makes the parts: the gate (a typed-in rate split among a server's
workers, or a rate learnt live), the decider over it (the gate, or a tenants' table) and the function naming each
request's tenant, the router, the quotas and a shared budget; :func:`alone` refuses a second gate, and
:func:`check` checks what :func:`admitgate.load` read as the gate would. :func:`ticket_of` makes the retry ticket
(the workers of one server share its secret), :func:`attach` hands the gate to a shared budget, and
:func:`wire_metrics` registers the collectors. Every bad value is a :class:`~admitgate.core.errors.ConfigError`
naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from ..backends.shared import RedisBudget, backend_from_url
from ..core.clock import Clock
from ..core.errors import ConfigError, async_function, flag, instance, integer, reading
from ..core.gate import Gate
from ..core.priority import Priority, Rule
from ..core.probes import Probes
from ..core.settings import Settings
from ..core.source import Capacity
from ..core.tenants import Tenancy, Tenants
from ..limit.estimators import capacity_from_config
from ..metrics import GateCollector, MultiprocessSync, Tallied, multiprocess_dir
from .headers import HeaderPolicy
from .identity import Identity
from .keys import TenantFunc, naming
from .limits import Limits
from .quota import Quota
from .routing import Router
from .ticket import RetryTicket
from .types import ASGIApp
from .workers import Server, detect, worker_secret

log = logging.getLogger("admitgate")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(slots=True)
class Parts:
    """What :func:`build` makes of an AdmitGate's arguments."""

    gate: Gate
    tenants: Tenants | None  # the table over the gate, with tenants
    tenant_of: TenantFunc | None  # how a request's tenant is named (None without tenants)
    router: Router
    limits: Limits  # the app's, the routes' and (once read) the app's routes' quotas
    identity: Identity
    headers: HeaderPolicy
    backend: RedisBudget | None
    server: Server | None  # the server whose worker this process is, if it could tell
    sleep: Sleep
    gate_websockets: bool


def build(app: ASGIApp, *, rate: float | Capacity | None, routes: Mapping[str, Mapping[str, object] | Rule] | None,
          exempt: Iterable[str], classes: Mapping[str, Priority] | None, default_class: str,
          settings: Settings | None, identity: Identity | None, headers: HeaderPolicy | None,
          metrics: CollectorRegistry | None, backend: str | RedisBudget | None, workers: int | None,
          tenants: Tenancy | None, quota: Quota | None, gate_websockets: bool, gate: Gate | None, clock: Clock,
          wall_clock: Clock, sleep: Sleep) -> Parts:  # fmt: skip
    """Check the arguments of :class:`~admitgate.asgi.middleware.AdmitGate` and make its parts (see there)."""
    now = reading("clock", clock)
    reading("wall_clock", wall_clock)
    sleep = async_function("sleep", sleep)
    gate_websockets = flag("gate_websockets", gate_websockets)
    identity = instance("identity", identity, Identity)
    headers = instance("headers", headers, HeaderPolicy)
    if metrics is not None and not isinstance(metrics, CollectorRegistry):
        raise ConfigError("metrics", "must be a prometheus_client CollectorRegistry, or None", metrics)
    backend = backend_from_url(backend) if isinstance(backend, str) else backend
    if backend is not None and not isinstance(backend, RedisBudget):
        raise ConfigError("backend", "must be a URL (memory://, redis://...) or a RedisBudget", backend)
    server = detect()
    built = gate_of(gate, rate, settings, workers, server, backend is not None, now)
    if metrics is not None and built.probes is None:  # a typed-in rate learns nothing, but the latency,
        built.probes = Probes(now=now)  # in-flight and response series are exported in every mode
    # With metrics, paths no rule names are labelled by the app's own route templates.
    labels_from = app if metrics is not None else None
    router = Router(routes, exempt, default_class=default_class, classes=classes, app=labels_from)
    router.check_burst(built.pacer.burst)
    reserve = max((c.reserve for c in router.classes.values()), default=0.0)  # (see Parent.keep)
    table = None if tenants is None else Tenants(tenants, built, reserve=reserve, now=now)
    tenant_of = None if tenants is None else naming(tenants.key, identity.trusted_hops, identity.forwarded)
    if quota is not None and not isinstance(quota, Quota):
        raise ConfigError("quota", "must be an admitgate.Quota (or None)", quota)
    limits = Limits(quota, router.quotas, clock, trusted_hops=identity.trusted_hops, forwarded=identity.forwarded,
                    tenant_of=tenant_of, backend=backend)  # fmt: skip
    limits.scan(app)  # the quotas declared on the app's routes, if it has them yet: a bad one fails the start-up
    return Parts(built, table, tenant_of, router, limits, identity, headers, backend, server, sleep, gate_websockets)


def alone(app: object, kind: type) -> None:
    """ConfigError if a ``kind`` (an AdmitGate) is already in ``app``'s stack: down its ``.app`` chain, or among
    the middleware a Starlette app will build (``user_middleware``). Two gates would decide every request twice,
    by two buckets and two retry schedules, and tell a client two different Retry-After: keep one, with every
    option on it."""
    seen: set[int] = set()
    node: object = app
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        later = [getattr(m, "cls", None) for m in getattr(node, "user_middleware", None) or ()]
        if isinstance(node, kind) or any(isinstance(c, type) and issubclass(c, kind) for c in later):
            raise ConfigError("middleware", "this app already has an AdmitGate (add_middleware(AdmitGate) twice?): "
                                            "every request would be decided by two gates; keep one, with all its "
                                            "options")  # fmt: skip
        node = getattr(node, "app", None)


def ticket_of(identity: Identity, server: Server | None, workers: int | None) -> RetryTicket | None:
    """The retry ticket of ``identity`` (None: no tickets); the workers of one server must know each other's."""
    shared = identity.secret
    if identity.ticket is True and (server is not None or (workers or 1) > 1):
        shared = worker_secret()
    return None if identity.ticket is False else RetryTicket(shared, always_secure=identity.secure_cookie)


def attach(backend: RedisBudget | None, gate: Gate, tenants: Tenants | None, clock: Clock) -> None:
    """Hand ``gate`` to a shared budget (one budget for the fleet: a typed-in rate is the fleet's rate); with
    tenants, the lease then bounds the replica, and the pools need no bucket of its own."""
    if backend is None:
        return
    backend.attach(gate, gate.static_rate, clock)
    if tenants is not None:
        tenants.follow(clock())


def wire_metrics(layer: Tallied, metrics: CollectorRegistry | None) -> MultiprocessSync | None:
    """Export ``layer``'s metrics to ``metrics`` (read at scrape time), or with several processes through a
    multiprocess directory: then the sync to start at the lifespan start-up (or the first request)."""
    if metrics is None:
        return None
    if multiprocess_dir():
        return MultiprocessSync(layer)
    metrics.register(GateCollector(layer))
    return None


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


def check(options: Mapping[str, object]) -> None:
    """ConfigError for what :class:`~admitgate.asgi.middleware.AdmitGate` would refuse in ``options`` (what
    :func:`admitgate.load` returns), with nothing started, registered or attached: the typed-in rate and
    workers, the routes' costs against the burst, and the quotas' keys. A capacity learnt live is not built
    twice (it carries state): it was checked as it was made."""
    rate = options.get("rate")
    settings = instance("settings", options.get("settings"), Settings)
    if isinstance(rate, Capacity):
        burst = None
    else:
        burst = gate_of(None, rate, settings, options.get("workers"), None, False, 0.0).pacer.burst
    router = Router(options.get("routes"), options.get("exempt", ()), classes=options.get("classes"),  # type: ignore[arg-type]
                    default_class=options.get("default_class", "default"))  # type: ignore[arg-type]  # fmt: skip
    if burst is not None:
        router.check_burst(burst)
    identity = instance("identity", options.get("identity"), Identity)
    tenants = options.get("tenants")
    tenant_of = naming(tenants.key, identity.trusted_hops, identity.forwarded) if isinstance(tenants, Tenancy) else None
    quota = options.get("quota")
    Limits(quota if isinstance(quota, Quota) else None, router.quotas, lambda: 0.0, tenant_of=tenant_of)
