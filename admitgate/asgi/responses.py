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
from ..core.decision import Decider, Stranger
from ..core.schedule import SLOT_GRACE
from ..metrics import RETRY_AFTER_BOUNDS
from .cors import AppCors
from .exchange import Exchange
from .headers import Header, HeaderPolicy
from .limits import Allowance, Refusal
from .ticket import RetryTicket
from .types import Receive, Scope, Send
from .untied import Untied


class Responder:
    """The responses of one :class:`~admitgate.asgi.middleware.AdmitGate`: ``headers`` renders them, ``cors`` adds
    the app's CORS policy, ``decider`` says an admitted response's rate-limit fields, ``ticket`` (or None) adds
    its cookie (counted in ``untied`` when it is all that ties its client). Times in seconds (``clock`` the gate's,
    ``wall_clock`` the tickets'; a ticket outlives its Retry-After by ``max_pacing_delay`` and the schedule's grace)."""

    def __init__(self, headers: HeaderPolicy, cors: AppCors, decider: Decider, ticket: RetryTicket | None,
                 clock: Clock, wall_clock: Clock, max_pacing_delay: float,
                 untied: Untied | None = None) -> None:  # fmt: skip
        self.headers, self.cors, self.decider = headers, cors, decider
        self.untied = Untied() if untied is None else untied
        self.ticket, self.clock, self.wall_clock = ticket, clock, wall_clock
        self.max_pacing_delay = max_pacing_delay
        self.retry_after_counts = [0] * (len(RETRY_AFTER_BOUNDS) + 1)  #: 429s per Retry-After bucket
        self.retry_after_sum = 0  #: seconds of Retry-After given out

    def _resolve_cors(self, scope: Scope) -> None:
        if not self.cors.resolved:  # a CORS layer outside the gate must expose the fields too
            self.cors.resolve(scope)

    async def reject(self, scope: Scope, send: Send, retry_after: int, rate: float, ident: Hashable | None) -> None:
        """The gate's rejection: Retry-After ``retry_after`` s, the fields of ``rate`` (H, requests/s), and the
        ticket of ``ident`` (a client the gate recognises by it when it comes back)."""
        headers, body = self.headers.rejection(retry_after, rate)
        if self.ticket is not None and isinstance(ident, str):
            max_age = retry_after + math.ceil(self.max_pacing_delay + SLOT_GRACE)
            now_wall = self.wall_clock()
            cookie = self.ticket.set_cookie(ident, now_wall, max_age, scope.get("scheme", "http"))
            if isinstance(ident, Stranger):
                self.untied.ticket_issued(now_wall, now_wall + max_age)
            headers.append((b"set-cookie", cookie))
        await self.send_rejection(scope, send, retry_after, headers, body)

    def quota_rejection(self, refusal: Refusal) -> tuple[list[Header], bytes]:
        """Headers and body refusing a request over its key's quota (the window that refused it)."""
        window = refusal.window
        return self.headers.quota_rejection(refusal.retry_after, window.name, window.q, window.w)

    async def send_rejection(self, scope: Scope, send: Send, retry_after: int, headers: list[Header],
                             body: bytes) -> None:  # fmt: skip
        self.retry_after_counts[bisect_left(RETRY_AFTER_BOUNDS, retry_after)] += 1
        self.retry_after_sum += retry_after
        self._resolve_cors(scope)
        headers = await self.cors.apply(scope, headers)
        await send({"type": "http.response.start", "status": self.headers.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def quota_exchange(self, scope: Scope, send: Send, allowance: Allowance) -> Exchange:
        """``send`` wrapped to add the fields of the quotas that allowed a request to its response (whatever the
        gate says), and the gate's own once it admits it (see :meth:`limit_fields`)."""
        counted = [(window.name, window.q, window.w, left, reset) for window, left, reset in allowance.counted]
        fields = self.headers.quota_fields(counted)
        self._resolve_cors(scope)
        return Exchange(send, self.headers.exposed, fields)

    def exchange(self, scope: Scope, send: Send) -> Exchange:
        """``send`` wrapped for an admitted request (its rate-limit fields, its probes)."""
        if self.headers.on_admit:
            self._resolve_cors(scope)
        return Exchange(send, self.headers.exposed)

    def limit_fields(self, tenant: str | None) -> list[Header]:
        """The gate's rate-limit fields for an admitted response of ``tenant`` (its bucket, or the gate's), now."""
        now = self.clock()
        pacer, rate = self.decider.limit_of(tenant, now)
        tokens = pacer.tokens(now)
        remaining = max(0, int(tokens))
        reset = None if remaining else max(1, math.ceil(pacer.wait_time(1.0, now)))
        return self.headers.limit_fields(rate, remaining, reset)

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
