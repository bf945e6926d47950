"""One request's response on its way out through the gate: the one wrapper of ``send`` the middleware makes.

A wrapper is made only for a request that needs one: a :class:`Flight` for a request the probes follow (the
default gate's every request), an :class:`Exchange` for one whose response gains fields (a quota's, rate-limit fields
on admission); the admit path of a plain request passes ``send`` on untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence, Sized

from ..core.decision import Decider
from ..core.probes import Probes
from .headers import Header, merge_expose
from .types import Message, Send


class Watch:
    """What a wrapped ``send`` tells as a response begins, made once per gate: the ``probes`` (the request is
    answered: its body may stream on, but the in-flight limit leaves it out from then on), and its decider's holds
    waiting for room in flight (``waiting``), woken by ``room`` (room may have come then, and as it ends)."""

    __slots__ = ("probes", "room", "waiting")

    room: Callable[[], None]
    waiting: Sized

    def __init__(self, probes: Probes, decider: Decider) -> None:
        self.probes, self.room, self.waiting = probes, decider.room_freed, decider.waiting_for_room

    def freed(self) -> None:
        """A request is out of flight: room may have come for a hold waiting for it."""
        if self.waiting:
            self.room()


class Flight:
    """``send`` wrapped once for one request the probes follow (``watch``; None: none do), its response's status
    kept as it begins (0 until then). It has no ``__init__``: the admit path sets its slots, without a call of Python.
    The middleware reports the request's end to the probes."""

    __slots__ = ("downstream", "status", "watch")

    downstream: Send
    status: int
    watch: Watch | None

    def send(self, message: Message) -> Awaitable[None]:
        """The wrapped ``send`` (it returns the downstream send's awaitable: no coroutine of its own)."""
        if not self.status:  # the first message is http.response.start
            status = self.status = message.get("status", 0)
            if status:
                watch = self.watch
                if watch is not None:
                    watch.probes.answered += 1
                    if watch.waiting:
                        watch.room()
        return self.downstream(message)

    def ended(self, error: BaseException, now: float) -> None:
        """The app raised ``error`` at ``now`` (an exception: an app error; anything else: it was cancelled, the
        client went away): the request is out of flight, and gives no latency sample."""
        watch = self.watch
        assert watch is not None
        if isinstance(error, Exception):
            watch.probes.fail(now, bool(self.status))
        else:
            watch.probes.cancel(now, bool(self.status))
        watch.freed()


class Exchange(Flight):
    """``send`` wrapped once for one request whose response gains fields. At its response's start it adds the gate's
    rate-limit fields (``limit``, made then: an admitted request, with ``HeaderPolicy(on_admit=True)``), then the
    quota's fields (``quota``: every response of a request its quota allowed, the gate's rejection too), each merged
    into the exposed fields (``exposed``); and with a ``watch`` it is a :class:`Flight` too."""

    __slots__ = ("exposed", "limit", "quota")

    def __init__(self, send: Send, exposed: Sequence[str], quota: list[Header] | None = None) -> None:
        self.downstream, self.exposed, self.quota = send, exposed, quota
        self.limit: Callable[[], list[Header]] | None = None
        self.watch = None
        self.status = 0

    def send(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            if self.limit is not None:
                message["headers"] = merge_expose([*message.get("headers", ()), *self.limit()], self.exposed)
            if self.quota is not None:
                message["headers"] = merge_expose([*message.get("headers", ()), *self.quota], self.exposed)
        return Flight.send(self, message)
