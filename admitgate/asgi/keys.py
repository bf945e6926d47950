"""Who a request's tenant is: the shell reads a tenant's name from the request, once per request.

The engine (:mod:`admitgate.core.tenants`) knows tenants by name alone. :func:`tenant_key` turns a
``Tenancy.key`` (or a ``Quota.key``) into the function ``scope -> name or None`` the middleware calls; a request
with no name is a newcomer. Names longer than :data:`~admitgate.core.tenants.policy.MAX_NAME` characters are known
by a digest of them, and a user's function never fails a request (:func:`naming`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from ..core.errors import ConfigError, function, header_name
from ..core.tenants.policy import MAX_NAME
from .identity import client_address

Scope = Any  # an ASGI scope
TenantFunc = Callable[[Scope], "str | None"]


def _name(value: str) -> str:
    return value if len(value) <= MAX_NAME else "#" + hashlib.blake2b(value.encode(), digest_size=16).hexdigest()


def _named(user: TenantFunc) -> TenantFunc:
    """A user's key function whose names are made what the built-in keys give: a string, long ones hashed; None
    where it fails (a user function must not fail the request)."""

    def named(scope: Scope) -> str | None:
        try:
            found = user(scope)
        except Exception:
            return None
        return _name(found) if isinstance(found, str) else None

    return named


def tenant_key(spec: str | TenantFunc, trusted_hops: int = 0, forwarded: str = "x-forwarded-for") -> TenantFunc:
    """``"header:<name>"`` (the header's value), ``"address"`` (the client address, behind ``trusted_hops``
    proxies) or a function ``scope -> tenant name or None``. A request with no tenant name is a newcomer. The
    built-in keys never raise (a mangled scope has no name); a function is returned as it is."""
    if callable(spec):
        return function("tenant", spec, {}, kind="a function scope -> tenant name")  # type: ignore[return-value]
    if spec == "address":

        def address(scope: Scope) -> str | None:
            try:
                found = client_address(scope, trusted_hops, forwarded)
            except Exception:  # (a mangled scope)
                return None
            return None if found is None else _name(found)

        return address
    if isinstance(spec, str) and spec.startswith("header:"):
        raw = header_name("key", spec[len("header:") :]).encode("ascii")

        def header(scope: Scope) -> str | None:
            try:
                value = None
                for k, v in scope["headers"]:  # (none: no name)
                    if k == raw:
                        value = v if value is None else value + b", " + v  # (several lines: one list, RFC 9110)
                if not value:
                    return None
                name = value.decode("latin-1")
            except Exception:  # (a mangled scope)
                return None
            return name if len(name) <= MAX_NAME else _name(name)  # (_name, inlined for the common case)

        return header
    raise ConfigError("key", "must be 'address', 'header:<name>' or a function scope -> tenant name", spec)


def naming(spec: str | TenantFunc, trusted_hops: int = 0, forwarded: str = "x-forwarded-for") -> TenantFunc:
    """The function the middleware names each request's tenant with, by ``spec`` (see :func:`tenant_key`): one
    call, which never raises; a user's function's names are made what the built-in keys give."""
    key = tenant_key(spec, trusted_hops, forwarded)
    return _named(key) if callable(spec) else key
