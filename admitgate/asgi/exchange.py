"""One request's response on its way out through the gate: the one wrapper of ``send`` the middleware makes.

An :class:`Exchange` is made only for a request that needs one (a quota's fields, rate-limit fields on
admission, probes); the admit path of a plain request passes ``send`` on untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence, Sized

from ..core.clock import Clock
from ..core.probes import Probes
from .headers import Header, merge_expose
from .types import ASGIApp, Message, Receive, Scope, Send


class Exchange:
    """``send`` wrapped once for one request. At its response's start it adds the gate's rate-limit fields
    (``limit``, made then: an admitted request, with ``HeaderPolicy(on_admit=True)``), then the quota's fields
    (``quota``: every response of a request its quota allowed, the gate's rejection too), each merged into the
    exposed fields (``exposed``); and with ``probes`` it tells them the request is answered, from which on the
    in-flight limit leaves it out (its body may stream on), and tells its decider (``room``) that room in flight
    may have come then and when it ends (holds waiting for room are woken)."""

    __slots__ = ("downstream", "exposed", "limit", "probes", "quota", "room", "status", "waiting")

    def __init__(self, send: Send, exposed: Sequence[str], quota: list[Header] | None = None) -> None:
        self.downstream, self.exposed, self.quota = send, exposed, quota
        self.limit: Callable[[], list[Header]] | None = None
        self.probes: Probes | None = None
        self.room: Callable[[], None] | None = None
        self.waiting: Sized = ()  #: the holds waiting for room (``room`` is called only while there are some)
        self.status = 0  #: the response's status, once it has begun (0 until then)

    def send(self, message: Message) -> Awaitable[None]:
        """The wrapped ``send`` (it returns the downstream send's awaitable: no coroutine of its own)."""
        probes = self.probes
        if probes is not None and not self.status:  # the first message is http.response.start
            self.status = message.get("status", 0)
            if self.status:  # answered: its body may stream on, but the in-flight limit leaves it out
                probes.answered += 1
                if self.waiting and self.room is not None:
                    self.room()
        if message["type"] == "http.response.start":
            if self.limit is not None:
                message["headers"] = merge_expose([*message.get("headers", ()), *self.limit()], self.exposed)
            if self.quota is not None:
                message["headers"] = merge_expose([*message.get("headers", ()), *self.quota], self.exposed)
        return self.downstream(message)

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, clock: Clock, now: float,
                    entered: bool = False) -> None:  # fmt: skip
        """Call ``app`` with the wrapped ``send``; with probes, the request in flight from ``now`` (``entered``: put
        in flight already, by its hold) and its latency until the app has finished its response (it returns after
        its last body chunk, so streaming counts in full), and the outcome. An app that raises is an error; a
        cancelled one (the client went away) gives no sample."""
        probes = self.probes
        if probes is None:
            await app(scope, receive, self.send)
            return
        if not entered:
            probes.admit(now)
        try:
            await app(scope, receive, self.send)
        except Exception:
            probes.fail(clock(), bool(self.status))
            self._freed()
            raise
        except BaseException:
            probes.cancel(clock(), bool(self.status))
            self._freed()
            raise
        end = clock()
        if self.status:
            probes.complete(end - now, self.status, end, True)
        else:  # returned without a response
            probes.cancel(end)
        if self.waiting:
            self._freed()

    def _freed(self) -> None:
        """The request is out of flight: room may have come for a hold waiting for it."""
        if self.waiting and self.room is not None:
            self.room()
