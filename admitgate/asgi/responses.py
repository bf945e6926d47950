"""What the middleware sends in place of, or around, the app's response.

A :class:`Responder` answers the gate's rejections (429 or 503 with Retry-After, rate-limit fields, a problem
body and the retry-ticket cookie), a quota's refusals, and refused websocket handshakes; it adds the
rate-limit fields to admitted responses (``HeaderPolicy(on_admit=True)``); every rejection carries what the
app's own CORS policy adds (:mod:`admitgate.asgi.cors`). It counts the Retry-After values it sends, for
metrics.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Hashable

from ..core.clock import Clock
from ..core.decision import Decider
from ..core.gate import Gate
from ..core.quota import Answer
from ..core.schedule import SLOT_GRACE
from ..metrics import RETRY_AFTER_BOUNDS
from .cors import AppCors
from .headers import Header, HeaderPolicy, merge_expose
from .quota import QuotaGuard
from .ticket import RetryTicket
from .types import Message, Receive, Scope, Send


class Responder:
    """The responses of one :class:`~admitgate.asgi.middleware.AdmitGate` (``owner``: where the app's CORS
    layers are looked for). Times in seconds (``clock`` the gate's, ``wall_clock`` the tickets')."""

    def __init__(self, owner: object, headers: HeaderPolicy, gate: Gate, decider: Decider,
                 quota: QuotaGuard | None, ticket: RetryTicket | None, clock: Clock,
                 wall_clock: Clock) -> None:  # fmt: skip
        self._owner, self.headers, self.gate, self.decider = owner, headers, gate, decider
        self.quota, self.ticket, self.clock, self.wall_clock = quota, ticket, clock, wall_clock
        self.cors = AppCors(headers.exposed)
        self.retry_after_counts = [0] * (len(RETRY_AFTER_BOUNDS) + 1)  #: 429s per Retry-After bucket
        self.retry_after_sum = 0  #: seconds of Retry-After given out

    def _resolve_cors(self, scope: Scope) -> None:
        if not self.cors.resolved:  # a CORS layer outside the gate must expose the fields too
            self.cors.resolve(self._owner, scope)

    async def reject(self, scope: Scope, send: Send, retry_after: int, rate: float, ident: Hashable | None) -> None:
        """The gate's rejection: Retry-After ``retry_after`` s, the fields of ``rate`` (H, requests/s), and the
        ticket of ``ident`` (a client the gate recognises by it when it comes back)."""
        headers, body = self.headers.rejection(retry_after, rate)
        if self.ticket is not None and isinstance(ident, str):
            max_age = retry_after + math.ceil(self.gate.max_pacing_delay + SLOT_GRACE)
            cookie = self.ticket.set_cookie(ident, self.wall_clock(), max_age, scope.get("scheme", "http"))
            headers.append((b"set-cookie", cookie))
        await self.send_rejection(scope, send, retry_after, headers, body)

    def quota_rejection(self, retry_after: int) -> tuple[list[Header], bytes]:
        """Headers and body refusing a request over its key's quota."""
        guard = self.quota
        assert guard is not None
        return self.headers.quota_rejection(retry_after, guard.quota.name, guard.limit, guard.window)

    async def send_rejection(self, scope: Scope, send: Send, retry_after: int, headers: list[Header],
                             body: bytes) -> None:  # fmt: skip
        self.retry_after_counts[bisect_left(RETRY_AFTER_BOUNDS, retry_after)] += 1
        self.retry_after_sum += retry_after
        self._resolve_cors(scope)
        headers = await self.cors.apply(scope, headers)
        await send({"type": "http.response.start", "status": self.headers.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def with_quota_fields(self, scope: Scope, send: Send, answer: Answer) -> Send:
        """``send`` adding the quota's fields for a request it allowed to the response (whatever the gate says)."""
        guard = self.quota
        assert guard is not None
        fields = self.headers.quota_fields(guard.quota.name, guard.limit, guard.window, *guard.fields(answer))
        self._resolve_cors(scope)
        exposed = self.headers.exposed

        async def send_with_quota(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = merge_expose([*message.get("headers", ()), *fields], exposed)
            await send(message)

        return send_with_quota

    def with_limit_fields(self, scope: Scope, send: Send, tenant: str | None = None) -> Send:
        """``send`` adding the gate's rate-limit fields (its bucket, or ``tenant``'s) to an admitted response."""
        policy, clock, decider = self.headers, self.clock, self.decider
        self._resolve_cors(scope)

        async def send_with_fields(message: Message) -> None:
            if message["type"] == "http.response.start":
                now = clock()
                pacer, rate = decider.limit_of(tenant, now)
                tokens = pacer.tokens(now)
                remaining = max(0, int(tokens))
                reset = None if remaining else max(1, math.ceil(pacer.wait_time(1.0, now)))
                fields = policy.limit_fields(rate, remaining, reset)
                message["headers"] = merge_expose([*message.get("headers", ()), *fields], policy.exposed)
            await send(message)

        return send_with_fields

    async def refuse_handshake(self, scope: Scope, receive: Receive, send: Send, headers: list[Header],
                               body: bytes) -> None:  # fmt: skip
        """Refuse a websocket handshake: the rejection as an HTTP response where the server can send one (the
        ``websocket.http.response`` extension), else close with 1013 (try again later)."""
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in (scope.get("extensions") or {}):
            start = {"type": "websocket.http.response.start", "status": self.headers.status, "headers": headers}
            await send(start)
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1013, "reason": "try again later"})
