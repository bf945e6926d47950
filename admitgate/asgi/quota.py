"""Per-key quotas in the ASGI shell: for the whole app, and per route.

    app.add_middleware(AdmitGate, quota=Quota("1000/hour"),                       # every route, per API key
                       routes={"/login": {"quota": {"limit": "5/minute", "key": "address"}}})

    @app.post("/export", dependencies=[Depends(Quota("10/minute;100/day"))])   # FastAPI: on the route
    @limited("5/minute", key="address")                                         # or a decorator (Starlette too)

A request whose key has used its quota is refused with the gate's 429 (a Retry-After spread over the
window's interval, the quota's rate-limit fields and problem document) *before* it asks the gate for a
token, so a refused request costs the others no headroom. A request without the key is not quota-limited;
exempt paths never are.

The limit is written as slowapi and limits users write it (``"100/minute"``, ``"5 per second"``,
``"5/minute;100/day"`` for several windows at once) and parsed by the ``limits`` package
(``pip install 'admitgate[quota]'``). With a Redis backend the count is the fleet's
(:class:`~admitgate.backends.quota.RedisQuota`); otherwise, and while Redis fails, each process counts its
own (:class:`~admitgate.core.quota.QuotaLimiter`). Who enforces a quota declared on a route is the gate: the
dependency and the decorator only declare it (:mod:`admitgate.asgi.limits` finds them in the app's routes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request

from ..core.clock import Clock
from ..core.errors import ConfigError, integer
from ..core.quota import QuotaLimiter, QuotaRate
from .keys import TenantFunc, tenant_key

Scope = Any  # an ASGI scope
T = TypeVar("T")

#: The scope key under which the gate lists the quotas it checked for a request (what a dependency verifies).
CHECKED = "admitgate.quotas"
#: The attribute :func:`limited` sets on an endpoint: the quotas declared on it.
DECLARED = "__admitgate_quotas__"
#: The key that names a request by its tenant (the gate's ``tenants=Tenancy(key=...)``).
TENANT = "tenant"


def parse_limits(spec: object, burst: int | None = None) -> tuple[QuotaRate, ...]:
    """``"5/minute;100/day"`` (one limit or several in the ``limits`` syntax) as :class:`QuotaRate` windows, the
    shortest first. ``burst`` (requests at once) is the shortest window's; the others allow their whole limit at
    once, so they never bind before their count does. ConfigError naming ``limit`` or ``burst``."""
    if not isinstance(spec, str):
        raise ConfigError("limit", "must be a string such as '100/minute'", spec)
    try:
        from limits import parse_many
    except ImportError:
        raise ConfigError("limit", "needs the limits package: pip install 'admitgate[quota]'") from None
    try:
        items = parse_many(spec)
    except ValueError:
        raise ConfigError("limit", "not a rate limit such as '100/minute', '5 per second' or '5/minute;100/day'",
                          spec) from None  # fmt: skip
    if not items:
        raise ConfigError("limit", "names no limit", spec)
    if any(item.amount < 1 for item in items):
        raise ConfigError("limit", "must allow at least one request per window", spec)
    windows = sorted({(float(item.get_expiry()), item.amount) for item in items})
    if len({seconds for seconds, _ in windows}) < len(windows):
        raise ConfigError("limit", "names one window twice", spec)
    rates = [QuotaRate(amount, seconds, burst if i == 0 else None) for i, (seconds, amount) in enumerate(windows)]
    return tuple(rates)


def parse_limit(spec: object, burst: int | None = None) -> QuotaRate:
    """``"100/minute"`` (one limit) as a :class:`QuotaRate`; ConfigError naming ``limit``."""
    rates = parse_limits(spec, burst)
    if len(rates) != 1:
        raise ConfigError("limit", "must be one limit here", spec)
    return rates[0]


@dataclass(frozen=True, slots=True)
class Quota:
    """A hard limit per key, whatever the load. ``limit``: ``"100/minute"``, or several windows at once,
    ``"5/minute;100/day"`` (the ``limits`` syntax). ``key``: ``"header:<name>"`` (default: ``header:x-api-key``),
    ``"address"`` (the client address, behind the identity's trusted proxies), ``"tenant"`` (the request's tenant,
    as the gate's ``tenants`` name it) or a function ``scope -> key or None``. ``burst``: requests a fresh key may
    make at once (default: the whole limit; 1 keeps every window of W seconds to N, see
    :mod:`admitgate.core.quota`; with several windows, the shortest's). ``name``: the policy's name in the
    rate-limit fields and the problem body (default: ``"quota"`` for the app's, the route template for a route's).
    ``max_keys``: keys counted at once in each process (oldest forgotten first).

    On the whole app, ``AdmitGate(app, quota=Quota("100/minute"))``; on a route, in the gate's ``routes``, as a
    FastAPI dependency, ``Depends(Quota("5/minute", key="address"))``, or with :func:`limited`. A route's quota
    counts that route's requests; the app's counts them all.
    """

    limit: str
    key: str | TenantFunc = "header:x-api-key"
    burst: int | None = None
    name: str | None = None
    max_keys: int = 100_000

    def __post_init__(self) -> None:
        parse_limits(self.limit, self.burst)
        if self.key != TENANT:
            tenant_key(self.key)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError("name", "must be a non-empty string", self.name)
        integer("max_keys", self.max_keys, 1, 10_000_000)

    @property
    def rates(self) -> tuple[QuotaRate, ...]:
        """The parsed windows, the shortest first."""
        return parse_limits(self.limit, self.burst)

    @property
    def rate(self) -> QuotaRate:
        """The shortest window."""
        return self.rates[0]

    async def __call__(self, request: Request) -> None:
        """The FastAPI dependency (``Depends(quota)``): the gate in front of the app checks the quota before the
        route runs; this only makes sure one did, so a quota is never silently unenforced. (A coroutine: FastAPI
        would run a plain function in a worker thread, at a cost of about 100 µs a request.)"""
        if self not in request.scope.get(CHECKED, ()):
            raise RuntimeError(f"admitgate: {self!r} is declared on {request.method} {request.url.path}, but no "
                               "AdmitGate in front of the app checked it: add app.add_middleware(AdmitGate, ...) "
                               "(an exempt path is never limited; a route added after the first request is not "
                               "seen)")  # fmt: skip


def limited(limit: str | Quota, key: str | TenantFunc = "header:x-api-key", *, burst: int | None = None,
            name: str | None = None) -> Callable[[T], T]:  # fmt: skip
    """Declare a quota on a route's endpoint (a function or an endpoint class), in Starlette or FastAPI; the gate
    enforces it. ``limit``: a :class:`Quota`, or its ``limit`` with ``key``, ``burst`` and ``name``. The
    endpoint is returned unchanged (marked), so the decorator's place among the route decorators does not
    matter.

        @app.route("/login", methods=["POST"])
        @limited("5/minute", key="address")
        async def login(request): ...
    """
    quota = limit if isinstance(limit, Quota) else Quota(limit, key, burst, name)

    def mark(endpoint: T) -> T:
        setattr(endpoint, DECLARED, (*getattr(endpoint, DECLARED, ()), quota))
        return endpoint

    return mark


@dataclass(frozen=True, slots=True)
class Window:
    """One window of a :class:`QuotaGuard`: its rate, its policy's name and ``q``/``w`` in the fields, its
    local limiter, and its Redis key's tail and script arguments."""

    rate: QuotaRate
    name: str
    q: int
    w: int
    limiter: QuotaLimiter
    tail: str
    args: tuple[str, str]


class QuotaGuard:
    """A :class:`Quota` at work where it applies (``where``: ``""`` for the whole app, else the route's
    template): how a request's key is read and the windows it is counted in. ``key``: the function
    ``scope -> key or None``."""

    __slots__ = ("key", "name", "quota", "refused", "where", "windows")

    def __init__(self, quota: Quota, key: TenantFunc, clock: Clock, where: str = "") -> None:
        self.quota, self.key, self.where = quota, key, where
        self.name = quota.name or where or "quota"
        rates = quota.rates
        several = len(rates) > 1
        self.windows = tuple(
            Window(rate, f"{self.name}-{_span(rate.window)}" if several else self.name, rate.limit,
                   max(1, math.ceil(rate.window)), QuotaLimiter(rate, clock, quota.max_keys),
                   f"{self.name}:{where}:{rate.limit}/{rate.window:g}", (repr(rate.interval), repr(rate.tolerance)))
            for rate in rates
        )  # fmt: skip
        self.refused = 0  #: requests refused over this quota, so far


def _span(seconds: float) -> str:
    """A window's length in its largest whole unit: ``30s``, ``1m``, ``1h``, ``1d``."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def quota_key(quota: Quota, trusted_hops: int, forwarded: str, tenant_of: TenantFunc | None) -> TenantFunc:
    """The function ``scope -> key or None`` of ``quota`` (the tenants' key functions, see :func:`tenant_key`;
    ``"tenant"``: the gate's own, ``tenant_of``)."""
    if quota.key == TENANT:
        if tenant_of is None:
            raise ConfigError("quota.key", "'tenant' counts per tenant: the gate needs tenants=Tenancy(key=...)")
        return tenant_of
    try:
        return tenant_key(quota.key, trusted_hops, forwarded)
    except ConfigError as error:
        raise error.renamed("quota.key") from None


def key_of(func: TenantFunc, scope: Scope) -> Hashable | None:
    """``func(scope)``, None if it fails or is not hashable: a user's key function must not turn a request into
    a 500."""
    try:
        key = func(scope)
        hash(key)
    except Exception:
        return None
    return key
