"""Client identity: which key a request is known by, for slot reuse (and later fairness).

The default key is the *connection* (peer address and port). Keep-alive clients
reuse their connection, so a client that comes back early on it is recognised,
while distinct clients behind one address (NAT, a proxy, a loopback test herd)
stay distinct. A signed retry ticket (see :mod:`admitgate.ticket`) takes
precedence where the client echoes it, and a header (an API key, Authorization)
can be chosen instead.

``X-Forwarded-For`` and ``Forwarded`` are read only through ``trusted_hops``
proxies: with N trusted proxies the client address is the N-th entry from the
right, since anything further left was written by the client and can be forged.
Nothing here raises on malformed input.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .errors import ConfigError, integer

Scope = Any  # an ASGI scope (a MutableMapping[str, Any])
KeyFunc = Callable[[Scope], "Hashable | None"]


def header_value(scope: Scope, name: bytes) -> bytes | None:
    """First value of request header ``name`` (lower-case bytes), or None."""
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value)
    return None


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` addresses of an RFC 7239 Forwarded value, left to right."""
    out: list[str] = []
    for element in value.split(","):
        found = ""
        for pair in element.split(";"):
            name, sep, val = pair.partition("=")
            if sep and name.strip().lower() == "for":
                found = val.strip().strip('"')
                if found.startswith("["):  # [v6]:port
                    found = found[1 : found.find("]")] if "]" in found else found[1:]
                elif found.count(":") == 1:  # v4:port
                    found = found.split(":", 1)[0]
        out.append(found)
    return out


def client_address(scope: Scope, trusted_hops: int = 0) -> str | None:
    """The client's address, reading forwarding headers through ``trusted_hops`` proxies only."""
    client = scope.get("client")
    peer = str(client[0]) if client else None
    if trusted_hops <= 0:
        return peer
    try:
        raw = header_value(scope, b"forwarded")
        if raw is not None:
            chain = _forwarded_for(raw.decode("latin-1"))
        else:
            raw = header_value(scope, b"x-forwarded-for")
            if raw is None:
                return peer
            chain = [part.strip() for part in raw.decode("latin-1").split(",")]
        chain = [c for c in chain if c]
        if not chain:
            return peer
        return chain[-trusted_hops] if len(chain) >= trusted_hops else chain[0]
    except Exception:  # a forged or mangled header must never fail the request
        return peer


def connection_key(trusted_hops: int = 0) -> KeyFunc:
    """Key by (client address, peer port): one key per client connection."""
    integer("trusted_hops", trusted_hops, 0)

    def key(scope: Scope) -> Hashable | None:
        client = scope.get("client")
        if not client:
            return None
        address = client_address(scope, trusted_hops) if trusted_hops else client[0]
        return ("conn", address, client[1])

    return key


def header_key(name: str) -> KeyFunc:
    """Key by the value of request header ``name`` (for example ``x-api-key``); None if absent."""
    raw = name.strip().lower().encode("latin-1")
    if not raw:
        raise ConfigError("key", "header name must not be empty", name)

    def key(scope: Scope) -> Hashable | None:
        value = header_value(scope, raw)
        return ("hdr", value) if value else None

    return key


def key_from_config(spec: str | KeyFunc, trusted_hops: int = 0) -> KeyFunc:
    """``"connection"``, ``"header:<name>"`` or a callable ``scope -> key``."""
    if callable(spec):
        return spec
    if spec == "connection":
        return connection_key(trusted_hops)
    if isinstance(spec, str) and spec.startswith("header:"):
        return header_key(spec[len("header:") :])
    raise ConfigError("key", "expected 'connection', 'header:<name>' or a callable", spec)
