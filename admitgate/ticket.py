"""Signed retry tickets: recognise a rejected client when it comes back on a new connection.

A 429 sets a short-lived cookie ``admitgate_rt=<id>.<expires>.<sig>``; browsers and
httpx or requests sessions echo it, so a returning client is known by the ticket id
even when its connection (and port) changed. The signature is an HMAC-SHA256 over
id and expiry with a process secret (configure a shared one when replicas share
a schedule), so a client cannot forge another client's slot. Parsing never raises.
"""

from __future__ import annotations

import base64
import hmac
import math
import secrets

COOKIE = "admitgate_rt"
_COOKIE_B = COOKIE.encode() + b"="


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class RetryTicket:
    """Issues and verifies tickets. ``secret``: bytes; a random one per process if None."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret else secrets.token_bytes(32)

    def _sign(self, body: str) -> str:
        return _b64(hmac.digest(self._secret, body.encode(), "sha256")[:12])

    def issue(self, ticket_id: str, expires_wall: float) -> str:
        """A ticket value for ``ticket_id`` valid until ``expires_wall`` (Unix seconds)."""
        body = f"{ticket_id}.{math.ceil(expires_wall)}"
        return f"{body}.{self._sign(body)}"

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(8)

    def verify(self, value: str, now_wall: float) -> str | None:
        """The ticket id if ``value`` is authentic and unexpired, else None."""
        parts = value.split(".")
        if len(parts) != 3 or len(value) > 128:
            return None
        ticket_id, expires, sig = parts
        if not expires.isdigit() or int(expires) < now_wall:
            return None
        if not hmac.compare_digest(sig, self._sign(f"{ticket_id}.{expires}")):
            return None
        return ticket_id

    def set_cookie(self, ticket_id: str, now_wall: float, max_age: int) -> bytes:
        value = self.issue(ticket_id, now_wall + max_age)
        return f"{COOKIE}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Lax".encode()


def cookie_ticket(cookie_header: bytes) -> str | None:
    """The raw ``admitgate_rt`` value in a Cookie header, or None (never raises)."""
    at = cookie_header.find(_COOKIE_B)
    while at > 0 and cookie_header[at - 1 : at] not in (b" ", b";"):
        at = cookie_header.find(_COOKIE_B, at + 1)
    if at < 0:
        return None
    start = at + len(_COOKIE_B)
    end = cookie_header.find(b";", start)
    raw = cookie_header[start : end if end >= 0 else len(cookie_header)].strip()
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None
