"""Client identity: which key a request is known by, for slot reuse (and later fairness).

A **returning client** is, in this order (see :class:`Recogniser`, which turns a request into its booking key):

1. one that echoes a valid retry ticket (:mod:`admitgate.asgi.ticket`): it is known by the ticket's id;
2. one known by the configured key. The default is its **connection**: a peer ``(host, port)`` with a real
   port, bound to a digest of the request's user-identifying fields (:data:`USER_FIELDS`). A reverse proxy's
   keep-alive connection or a client's connection pool carries many users' requests; a request with other
   credentials, cookies, user agent or forwarding chain on the same connection is another client. A port of
   0 is not a connection: uvicorn's ``--proxy-headers`` writes ``(address, 0)`` for a forwarded request, and
   every connection from that address would share it. Nor is one the request closes (``Connection: close``):
   a connection's identity does not outlive it, and a new connection from the same port is someone else;
3. nobody: with tickets on, a fresh random id, so the 429's ticket cookie recognises the client when it
   comes back (a Unix socket has no peer address at all).

Forwarding fields are read only through ``trusted_hops`` proxies, from one source of truth (``forwarded``:
``"x-forwarded-for"`` or ``"forwarded"``), never "whichever is present". Every line of the field counts,
combined in order as RFC 9110 §5.3 says (comma-joined), and the client is the N-th element from the right:
anything further left was written by the client. The split runs from the right with a bounded number of
splits, so a quoted string or a stray comma in the client's part can never swallow a trusted element.
Behind trusted proxies that forward the client's port (``for="192.0.2.7:4711"``) the client's own
connection to the outermost proxy is its connection.

Nothing here raises on malformed input, and the work per request is linear in the header bytes at C speed
(no per-element Python loop over a client-written list).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from ..core.clock import Clock
from ..core.decision import ClientKey, ConnectionKey, Stranger
from ..core.errors import ConfigError, choice, flag, function, header_name, integer
from .ticket import FRESH, RetryTicket, cookie_string, cookie_tickets, strip_ticket, ticket_secret
from .untied import Untied

Scope = Any  # an ASGI scope (a MutableMapping[str, Any])
KeyFunc = Callable[[Scope], "Hashable | None"]

log = logging.getLogger("admitgate")

#: Where the client address behind trusted proxies comes from (the ``forwarded`` option).
SOURCES = ("x-forwarded-for", "forwarded")
#: More proxies than this in front of one app is a misconfiguration; it also bounds the right-split.
MAX_TRUSTED_HOPS = 32
#: Request fields that tell the users sharing one connection apart (every line; the cookie without our ticket).
USER_FIELDS = frozenset({b"authorization", b"cookie", b"forwarded", b"user-agent", b"x-forwarded-for", b"x-real-ip"})
#: Bytes of a forwarded node kept (an IPv6 address with zone and port is under 64).
_MAX_NODE = 256
#: Forwarded parameters looked at in one element: a proxy writes for, by, host and proto.
_MAX_PARAMS = 8


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of request header ``name`` (lower-case bytes), in order: a field may come as several lines."""
    return [value for key, value in scope.get("headers") or () if key == name]


def check_forwarding(trusted_hops: int, forwarded: str) -> None:
    """Raise ConfigError unless ``trusted_hops`` is 0..MAX_TRUSTED_HOPS and ``forwarded`` one of SOURCES."""
    integer("trusted_hops", trusted_hops, 0, MAX_TRUSTED_HOPS)
    choice("forwarded", forwarded, SOURCES)


def _node(lines: list[bytes], hops: int) -> bytes:
    """The ``hops``-th element from the right of the combined field (the leftmost if there are fewer), stripped."""
    combined = lines[0] if len(lines) == 1 else b",".join(lines)
    parts = combined.rsplit(b",", hops)
    return (parts[-hops] if len(parts) > hops else parts[0]).strip()


def _forwarded_for(element: bytes) -> bytes:
    """The ``for=`` value of one RFC 7239 element, among its first few parameters; empty if none."""
    for pair in element.split(b";", _MAX_PARAMS)[:_MAX_PARAMS]:
        name, sep, value = pair.partition(b"=")
        if sep and name.strip().lower() == b"for":
            return value.strip()
    return b""


def _host_port(node: bytes) -> tuple[str, int]:
    """``(host, port)`` of a node: ``192.0.2.7``, ``192.0.2.7:80``, ``"[2001:db8::1]:80"``, ``2001:db8::1``.

    The port is 0 when there is none (or it is obfuscated, as RFC 7239 allows)."""
    node = node[:_MAX_NODE].strip(b'"')
    host, port = node, b""
    if node.startswith(b"["):
        end = node.find(b"]")
        host, rest = (node[1:end], node[end + 1 :]) if end >= 0 else (node[1:], b"")
        port = rest[1:] if rest.startswith(b":") else b""
    elif node.count(b":") == 1:
        host, _, port = node.partition(b":")
    return host.decode("latin-1"), int(port) if port.isdigit() and len(port) <= 5 else 0


def forwarded_client(scope: Scope, trusted_hops: int, forwarded: str = "x-forwarded-for") -> tuple[str, int] | None:
    """``(host, port)`` of the client as the outermost of ``trusted_hops`` proxies saw it (port 0 if not
    forwarded), from the ``forwarded`` field only; None if that field is absent or its node is empty."""
    if trusted_hops <= 0:
        return None
    lines = header_values(scope, b"forwarded" if forwarded == "forwarded" else b"x-forwarded-for")
    if not lines:
        return None
    node = _node(lines, trusted_hops)
    if forwarded == "forwarded":
        node = _forwarded_for(node)
    host, port = _host_port(node)
    return (host, port) if host else None


def client_address(scope: Scope, trusted_hops: int = 0, forwarded: str = "x-forwarded-for") -> str | None:
    """The client's address: the peer's, or with ``trusted_hops`` ≥ 1 the one the outermost trusted proxy
    wrote in the ``forwarded`` field (``"x-forwarded-for"`` or ``"forwarded"``). Never raises."""
    client = scope.get("client")
    peer = str(client[0]) if client else None
    try:
        found = forwarded_client(scope, trusted_hops, forwarded)
    except Exception:  # a mangled scope must never fail the request
        return peer
    return found[0] if found else peer


def source_of(address: str | None) -> str | None:
    """The source an address is counted in: its /24 for IPv4 (``"192.0.2"``), its /64 for IPv6, the address
    itself if it is neither (a name); None for no address. One source holds places ahead of others' up to its
    share (see :class:`~admitgate.core.schedule.Schedule`): a client with many connections, or a network with many
    addresses, is one source."""
    if not address:
        return None
    if ":" not in address:  # (IPv4, or a name: the cheap case, on the path of every request while places are held)
        network, dot, _ = address.rpartition(".")
        return network if dot and network.replace(".", "").isdigit() else address[:_MAX_NODE]
    try:
        return str(ipaddress.IPv6Network((address.split("%", 1)[0], 64), strict=False))
    except ValueError:
        return address[:_MAX_NODE]


def user_digest(scope: Scope) -> int:
    """A 64-bit digest of the request's :data:`USER_FIELDS`, every line in order, the cookie without our
    ticket (which changes with every 429).

    It is Python's ``hash`` of the bytes: SipHash, keyed with the per-process hash secret, one C pass at
    a few GB/s. It never leaves the process (the booking key is digested again, keyed, by the
    :class:`Recogniser`), and it only has to tell apart the users that share one connection.
    """
    found = [line for line in scope.get("headers") or () if line[0] in USER_FIELDS]
    cookies = [value for name, value in found if name == b"cookie"]
    if cookies:
        found = [line for line in found if line[0] != b"cookie"]
        found.append((b"cookie", strip_ticket(cookie_string(cookies))))
    # "name\nvalue\nname\nvalue...": no header value holds a line break
    return hash(b"\n".join(chain.from_iterable(found)))


def closes(scope: Scope) -> bool:
    """Whether the request says its connection ends with its response: ``Connection: close``, or HTTP/1.0
    without ``Connection: keep-alive``."""
    version = scope.get("http_version")
    if version not in ("1.1", "1.0"):  # (HTTP/2 and 3: a stream of a connection that outlives it)
        return False
    values = b",".join(header_values(scope, b"connection")).lower()
    return b"keep-alive" not in values if version == "1.0" else b"close" in values


def connection_key(trusted_hops: int = 0, forwarded: str = "x-forwarded-for") -> KeyFunc:
    """Key by the client's connection, bound to its :func:`user_digest`; None when there is no connection.

    The connection is the peer ``(host, port)``; with ``trusted_hops`` ≥ 1 and a port in the trusted node
    (``for="192.0.2.7:4711"``), the client's own connection to the outermost proxy. A port of 0 is none, and so
    is a peer connection the request says ends with its response (:func:`closes`): the next connection from that
    port is another client's.
    """
    check_forwarding(trusted_hops, forwarded)

    def key(scope: Scope) -> Hashable | None:
        endpoint = forwarded_client(scope, trusted_hops, forwarded) if trusted_hops else None
        if endpoint is None or not endpoint[1]:
            client = scope.get("client")
            if not client or not client[1] or closes(scope):
                return None
            endpoint = (str(client[0]), client[1])
        return ("conn", endpoint, user_digest(scope))

    return key


def header_key(name: str) -> KeyFunc:
    """Key by the value of request header ``name`` (every line, comma-joined); None if absent."""
    raw = header_name("key", name).encode("ascii")

    def key(scope: Scope) -> Hashable | None:
        value = b", ".join(header_values(scope, raw))
        return ("hdr", hashlib.blake2b(value, digest_size=16).digest()) if value else None

    return key


def key_from_config(spec: str | KeyFunc, trusted_hops: int = 0, forwarded: str = "x-forwarded-for") -> KeyFunc:
    """``"connection"``, ``"header:<name>"`` or a function ``scope -> key``."""
    check_forwarding(trusted_hops, forwarded)
    if callable(spec):
        return function("key", spec, {}, kind="a function scope -> key")
    if spec == "connection":
        return connection_key(trusted_hops, forwarded)
    if isinstance(spec, str) and spec.startswith("header:"):
        return header_key(spec[len("header:") :])
    raise ConfigError("key", "must be 'connection', 'header:<name>' or a function scope -> key", spec)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a client is, for keeping its place in the retry schedule (see the module docstring).

    ``key``: ``"connection"`` (default), ``"header:<name>"`` or a function ``scope -> key``.
    ``trusted_hops``: proxies whose forwarding field is believed (0 to :data:`MAX_TRUSTED_HOPS`);
    ``forwarded``: that field, ``"x-forwarded-for"`` or ``"forwarded"``. ``ticket``: the signed retry
    cookie: True (signed with a secret of the server's own, shared by the workers of one server), False
    (none), or the secret to share between servers (a non-empty ``str`` or ``bytes``). ``secure_cookie``:
    mark it ``Secure`` on plain http too (behind a TLS-terminating proxy); on https it always is.

        Identity(key="header:x-api-key", trusted_hops=1, ticket=os.environ["TICKET_SECRET"])
    """

    key: str | KeyFunc = "connection"
    trusted_hops: int = 0
    forwarded: str = "x-forwarded-for"
    ticket: bool | bytes | str = True
    secure_cookie: bool = False
    #: the key function ``key`` names (built and checked once)
    key_func: KeyFunc = field(init=False, repr=False, compare=False)
    #: the ticket's shared secret as bytes, None unless one was given
    secret: bytes | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_func", key_from_config(self.key, self.trusted_hops, self.forwarded))
        object.__setattr__(self, "secret", ticket_secret(self.ticket))
        flag("secure_cookie", self.secure_cookie)

    @property
    def forwarding(self) -> tuple[int, str]:
        """``(trusted_hops, forwarded)``: where the client's address is read (see :func:`client_address`)."""
        return self.trusted_hops, self.forwarded


class Recogniser:
    """Turns a request into its booking key: an opaque ``str``, or None when nothing can be known.

    In order: the id of a valid retry ticket in any ``cookie`` line; else a keyed digest of
    ``repr(key_func(scope))`` (keyed with the ticket secret, or a random one without tickets: it reveals
    nothing about the key, and replicas sharing the secret compute the same id); else, with tickets on, a
    fresh random id (a ticket cookie will carry it), without tickets None. Never raises: a key function that
    fails, or returns a key whose ``repr`` fails, makes the request anonymous and logs one warning. Requests that
    nothing identifies, and the fresh ids' tickets that come back, are counted in ``untied``.
    """

    __slots__ = ("_ids", "_kind", "_wall_clock", "_warned", "forwarding", "key_func", "ticket", "untied")

    def __init__(self, key_func: KeyFunc, ticket: RetryTicket | None, wall_clock: Clock, untied: Untied | None = None,
                 forwarding: tuple[int, str] = (0, "x-forwarded-for"), connection: bool = False) -> None:  # fmt: skip
        self.key_func = key_func
        #: what a key from ``key_func`` is: a :class:`ConnectionKey` when it is the client's connection (``connection``)
        self._kind: type[ClientKey] = ConnectionKey if connection else ClientKey
        self.forwarding = forwarding  # (trusted_hops, forwarded): where the client's address, its source, is read
        self.ticket = ticket
        self._ids = ticket or RetryTicket()  # without tickets, ids are keyed with a per-process secret
        self._wall_clock = wall_clock
        self._warned = False
        self.untied = Untied() if untied is None else untied

    @classmethod
    def of(cls, identity: Identity, ticket: RetryTicket | None, wall_clock: Clock) -> Recogniser:
        """The recogniser of ``identity``'s key and forwarding, with ``ticket``."""
        return cls(identity.key_func, ticket, wall_clock, forwarding=identity.forwarding,
                   connection=identity.key == "connection")  # fmt: skip

    def __call__(self, scope: Scope) -> str | None:
        """The booking key (a :class:`~admitgate.core.decision.ClientKey` carrying the client's address's
        :func:`source_of`; a :class:`~admitgate.core.decision.Stranger` for a made-up id, a
        :class:`~admitgate.core.decision.ConnectionKey` for a connection's), or None."""
        key = self._key(scope)
        if key is None:
            return None
        source = source_of(client_address(scope, *self.forwarding))
        return type(key)(key, source) if isinstance(key, ClientKey) else ClientKey(key, source)

    def _key(self, scope: Scope) -> str | None:
        ticket = self.ticket
        try:
            if ticket is not None:
                lines = header_values(scope, b"cookie")
                if lines:
                    now = self._wall_clock()
                    for value in cookie_tickets(cookie_string(lines)):
                        ticket_id = ticket.verify(value, now)
                        if ticket_id is not None:
                            if ticket_id.startswith(FRESH):  # (a made-up id, as when it was issued)
                                self.untied.ticket_returned()
                                return Stranger(ticket_id)  # (its source is set by the caller)
                            return ticket_id
            key = self.key_func(scope)
            material = None if key is None else repr(key).encode("utf-8", "backslashreplace")
        except Exception as exc:  # a user key function (or a mangled scope) must not turn into a 500
            material = None
            if not self._warned:
                self._warned = True
                log.warning("admitgate: key function %r failed (%r); such requests are anonymous", self.key_func, exc)
        if material is not None:
            return self._kind(self._ids.key_id(material))
        client = scope.get("client")
        self.untied.untied(client[1] if client else None, closes(scope))
        return None if ticket is None else Stranger(ticket.new_id())
