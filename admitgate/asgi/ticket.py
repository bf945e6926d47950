"""Signed retry tickets: recognise a rejected client when it comes back on a new connection.

A 429 sets a short-lived cookie ``admitgate_rt=<id>.<expires>.<sig>``; browsers and
httpx or requests sessions echo it, so a returning client is known by the ticket id
even when its connection (and port) changed. The signature is an HMAC-SHA256 over
id and expiry with a process secret (configure a shared one when replicas share
a schedule), so a client cannot forge another client's slot. The id is a keyed digest
of the client's key (or random), so the cookie reveals nothing about who the client is.
The cookie is ``HttpOnly``, ``SameSite=Lax``, and ``Secure`` when the request came over
https (or always, if the operator says so). Parsing never raises and its work is bounded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import secrets
from collections.abc import Iterator

from ..core.errors import ConfigError

log = logging.getLogger("admitgate")

COOKIE = "admitgate_rt"
#: A shared secret shorter than this (bytes) is accepted with a warning.
MIN_SECRET = 16
_NAME = COOKIE.encode() + b"="
#: Scope schemes on which the cookie is always ``Secure``.
SECURE_SCHEMES = frozenset({"https", "wss"})
#: Ticket values looked at per request (a client may hold a stale one beside the current one).
MAX_TICKETS = 4
#: Occurrences of the cookie name looked at per request: a cookie of ``xadmitgate_rt=…`` costs no more.
_MAX_CANDIDATES = 8
#: Longer values are not tickets (an issued one is about 60 bytes; verify refuses over 128).
_MAX_VALUE = 128
#: The first character of a fresh id (a keyed digest is hex): its ticket is all that ties its client to it.
FRESH = "u"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class RetryTicket:
    """Issues and verifies tickets. ``secret``: bytes; a random one per process if None.

    ``always_secure`` marks every cookie ``Secure`` (behind a TLS-terminating proxy the scope says http).
    """

    __slots__ = ("_id_key", "_secret", "always_secure")

    def __init__(self, secret: bytes | None = None, *, always_secure: bool = False) -> None:
        self._secret = secret if secret else secrets.token_bytes(32)
        # A key of its own for ids (domain separation from the signatures), derived from the one secret.
        self._id_key = hmac.digest(self._secret, b"admitgate client key id", "sha256")
        self.always_secure = always_secure

    def _sign(self, body: str) -> str:
        return _b64(hmac.digest(self._secret, body.encode(), "sha256")[:12])

    def key_id(self, material: bytes) -> str:
        """The ticket id of a client key (``material``: its bytes): a keyed BLAKE2b-128, hex.

        Without the secret it cannot be computed or inverted (not even for a guessable key such as a header
        value); with the same secret (replicas) the same key gets the same id.
        """
        return hashlib.blake2b(material, key=self._id_key, digest_size=16).hexdigest()

    @staticmethod
    def new_id() -> str:
        """A fresh random ticket id (for a client that nothing else identifies): :data:`FRESH` and 124 random bits,
        as long as a key's id."""
        return FRESH + secrets.token_hex(16)[1:]

    def issue(self, ticket_id: str, expires_wall: float) -> str:
        """A ticket value for ``ticket_id`` valid until ``expires_wall`` (Unix seconds)."""
        body = f"{ticket_id}.{math.ceil(expires_wall)}"
        return f"{body}.{self._sign(body)}"

    def verify(self, value: str, now_wall: float) -> str | None:
        """The ticket id if ``value`` is authentic and unexpired, else None."""
        parts = value.split(".")
        if len(parts) != 3 or len(value) > _MAX_VALUE:
            return None
        ticket_id, expires, sig = parts
        if not expires.isdigit() or int(expires) < now_wall:
            return None
        if not hmac.compare_digest(sig, self._sign(f"{ticket_id}.{expires}")):
            return None
        return ticket_id

    def set_cookie(self, ticket_id: str, now_wall: float, max_age: int, scheme: str = "http") -> bytes:
        """The ``Set-Cookie`` value; ``Secure`` if ``scheme`` (the scope's) is https/wss or always_secure."""
        value = self.issue(ticket_id, now_wall + max_age)
        secure = "; Secure" if self.always_secure or scheme in SECURE_SCHEMES else ""
        return f"{COOKIE}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Lax{secure}".encode()


def ticket_secret(ticket: object) -> bytes | None:
    """The secret in AdmitGate's ``ticket`` setting: None for True (a secret of the server's own) or False
    (no tickets), the bytes of a non-empty ``bytes`` or ``str`` (UTF-8) secret; ConfigError for anything else.

    A secret shorter than :data:`MIN_SECRET` bytes is accepted with a warning: anyone holding one ticket can
    try guesses against its signature offline.
    """
    if ticket is True or ticket is False:
        return None
    if isinstance(ticket, str) and ticket:
        secret = ticket.encode("utf-8", "surrogatepass")
    elif isinstance(ticket, (bytes, bytearray)) and ticket:
        secret = bytes(ticket)
    else:
        raise ConfigError("ticket", "must be True, False or the shared secret (a non-empty string or bytes)", ticket)
    if len(secret) < MIN_SECRET:
        log.warning("admitgate: the ticket secret has %d bytes; one of %d random bytes or more cannot be guessed "
                    "from a ticket (python -c 'import secrets; print(secrets.token_urlsafe(32))')",
                    len(secret), MIN_SECRET)  # fmt: skip
    return secret


def _pairs(line: bytes) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each ``admitgate_rt=`` cookie-pair in a cookie-string (at most _MAX_CANDIDATES looked at)."""
    at = line.find(_NAME)
    for _ in range(_MAX_CANDIDATES):
        if at < 0:
            return
        if at == 0 or line[at - 1] in b"; \t":  # at a pair boundary, not inside another name
            end = line.find(b";", at)
            yield at, end if end >= 0 else len(line)
        at = line.find(_NAME, at + 1)


def cookie_string(lines: list[bytes]) -> bytes:
    """Every ``cookie`` line as one cookie-string: HTTP/2 sends one line per cookie, to be joined with
    ``"; "`` (RFC 9113 §8.2.3)."""
    return lines[0] if len(lines) == 1 else b"; ".join(lines)


def cookie_tickets(cookies: bytes) -> list[str]:
    """The ``admitgate_rt`` values in a cookie-string (:func:`cookie_string`), in order, surrounding quotes
    removed; at most MAX_TICKETS. Never raises."""
    found: list[str] = []
    for start, end in _pairs(cookies):
        raw = cookies[start + len(_NAME) : end].strip()
        if len(raw) >= 2 and raw[0] == raw[-1] == 0x22:  # a quoted cookie-value
            raw = raw[1:-1]
        if len(raw) <= _MAX_VALUE and raw.isascii():
            found.append(raw.decode("ascii"))
            if len(found) >= MAX_TICKETS:
                break
    return found


def strip_ticket(cookies: bytes) -> bytes:
    """A cookie-string without its ``admitgate_rt`` pairs and their ``"; "`` separators, so that
    ``a=1; admitgate_rt=…; b=2`` becomes ``a=1; b=2`` (a client's ticket changes with every 429)."""
    kept: list[bytes] = []
    done = 0
    for start, end in _pairs(cookies):
        if end < len(cookies):  # the separator after the pair goes with it
            end += 2 if cookies[end + 1 : end + 2] == b" " else 1
        elif start >= done + 2 and cookies[start - 2 : start] == b"; ":  # the last pair: the one before it
            start -= 2
        kept.append(cookies[done:start])
        done = end
    if not done:
        return cookies
    kept.append(cookies[done:])
    return b"".join(kept)
