"""Per-key quotas in the ASGI shell: ``AdmitGate(app, quota=Quota("100/minute", key="header:x-api-key"))``.

A request whose key has used its quota is refused with the gate's 429 (Retry-After the wait rounded up,
rate-limit fields naming the quota) *before* it asks the gate for a token, so a refused request costs the
others no headroom. A request without the key is not quota-limited; exempt paths never are.

The limit is written as slowapi and limits users write it (``"100/minute"``, ``"5 per second"``,
``"1000/day"``) and parsed by the ``limits`` package (``pip install 'admitgate[quota]'``). With a Redis
backend the count is the fleet's (:class:`~admitgate.backends.quota.RedisQuota`); otherwise, and while
Redis fails, each process counts its own (:class:`~admitgate.core.quota.QuotaLimiter`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ..backends.quota import RedisQuota
from ..backends.shared import RedisBudget
from ..core.clock import Clock
from ..core.errors import ConfigError, integer
from ..core.quota import Answer, QuotaLimiter, QuotaRate
from .keys import TenantFunc, tenant_key

Scope = Any  # an ASGI scope


def parse_limit(spec: object, burst: int | None = None) -> QuotaRate:
    """``"100/minute"`` (one limit in the ``limits`` syntax) as a :class:`QuotaRate`; ConfigError naming ``limit``."""
    if not isinstance(spec, str):
        raise ConfigError("limit", "must be a string such as '100/minute'", spec)
    try:
        from limits import parse_many
    except ImportError:
        raise ConfigError("limit", "needs the limits package: pip install 'admitgate[quota]'") from None
    try:
        items = parse_many(spec)
    except ValueError:
        raise ConfigError("limit", "not a rate limit such as '100/minute' or '5 per second'", spec) from None
    if len(items) != 1:
        raise ConfigError("limit", "must be one limit (several, separated by ';', are not supported)", spec)
    item = items[0]
    if item.amount < 1:
        raise ConfigError("limit", "must allow at least one request", spec)
    return QuotaRate(item.amount, float(item.get_expiry()), burst)


@dataclass(frozen=True, slots=True)
class Quota:
    """A hard limit per key, whatever the load. ``limit``: ``"100/minute"`` (the ``limits`` syntax).
    ``key``: ``"header:<name>"`` (default: ``header:x-api-key``), ``"address"`` (the client address, behind
    the identity's trusted proxies) or a function ``scope -> key or None``. ``burst``: requests a fresh key
    may make at once (default: the whole limit; 1 keeps every window of W seconds to N, see
    :mod:`admitgate.core.quota`). ``name``: the policy's name in the rate-limit fields and the problem body.
    ``max_keys``: keys counted at once in each process (oldest forgotten first).

        Quota("100/minute", key="header:x-api-key")
    """

    limit: str
    key: str | TenantFunc = "header:x-api-key"
    burst: int | None = None
    name: str = "quota"
    max_keys: int = 100_000

    def __post_init__(self) -> None:
        parse_limit(self.limit, self.burst)
        tenant_key(self.key)
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name", "must be a non-empty string", self.name)
        integer("max_keys", self.max_keys, 1, 10_000_000)

    @property
    def rate(self) -> QuotaRate:
        """The parsed limit."""
        return parse_limit(self.limit, self.burst)


def quota_key(quota: Quota, trusted_hops: int, forwarded: str) -> TenantFunc:
    """The function ``scope -> key or None`` of ``quota`` (the tenants' key functions, see :func:`tenant_key`)."""
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


class QuotaGuard:
    """A :class:`Quota` at work in the middleware: ``await answer(scope)`` is None (the request has no key: not
    quota-limited) or the quota's :class:`~admitgate.core.quota.Answer` for its key (a wait > 0: refused).

    ``backend``: the middleware's shared budget, if any; the quota is then counted in its Redis.
    """

    def __init__(self, quota: Quota, clock: Clock, trusted_hops: int = 0, forwarded: str = "x-forwarded-for",
                 backend: RedisBudget | None = None) -> None:  # fmt: skip
        rate = quota.rate
        self.quota, self.rate = quota, rate
        self.limit, self.window = rate.limit, max(1, math.ceil(rate.window))
        self._key = quota_key(quota, trusted_hops, forwarded)
        self.local = QuotaLimiter(rate, clock, quota.max_keys)
        self.refused = 0  #: requests refused over their key's quota, so far
        self.shared = None if backend is None else RedisQuota(
            backend.client, self.local, clock, prefix=f"{backend.name}:quota:{quota.name}", timeout=backend.timeout,
            cooldown=backend.cooldown)  # fmt: skip

    async def answer(self, scope: Scope) -> Answer | None:
        key = key_of(self._key, scope)
        if key is None:
            return None
        answer = self.local.check(key) if self.shared is None else await self.shared.check(key)
        if answer.wait > 0:
            self.refused += 1
        return answer

    @staticmethod
    def retry_after(answer: Answer) -> int:
        """A refusal's Retry-After: the wait rounded up, whole seconds >= 1."""
        return max(1, math.ceil(answer.wait))

    def fields(self, answer: Answer) -> tuple[int, int]:
        """An allowed request's (remaining, reset): requests its key may still make at once, and whole seconds
        until all of its quota is back."""
        return answer.remaining(self.rate), math.ceil(answer.backlog)
