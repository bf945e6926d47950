"""The pacing hold: a request waits for its tokens (or a 429 in the tarpit) while the client is watched.

A held request's first body message may be read to notice a client that gives up; the app then gets it
replayed, so it sees the request as sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from ..core.clock import Clock
from ..core.decision import Decider, Decision, Verdict
from ..core.probes import Probes
from .types import Message, Receive, Scope

#: How the hold sleeps: ``anyio.sleep``, or a virtual clock's sleep in tests (seconds).
Sleep = Callable[[float], Awaitable[None]]

#: A body up to this many bytes is read while its request is held (uvicorn's own buffer stops at 64 KiB).
SMALL_BODY = 64 * 1024


def small_body(scope: Scope) -> bool:
    """Whether a request has no body, or one whose Content-Length is at most :data:`SMALL_BODY`."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return len(value) <= 6 and value.isdigit() and int(value) <= SMALL_BODY
        if name == b"transfer-encoding":  # chunked: of unknown length
            return False
    return True


async def hold(gate: Decider, clock: Clock, sleep: Sleep, decision: Decision, scope: Scope, receive: Receive,
               probes: Probes | None = None) -> tuple[Decision | None, Receive]:  # fmt: skip
    """Serve the gate's holds (sleeping on ``sleep``) until it says admit or reject; None if the client went away.

    With ``probes``, a request let in is put in flight in them (:meth:`Probes.admit`) the moment the gate lets it
    in, before the hold's last await: the gate's in-flight limit counts it from then on. (Counted by the caller
    after the hold had ended, every hold woken in the same pass of the event loop found the same room free.)

    The tarpit holds a 429 (nothing to watch). A paced request is held without reading its body, and
    the body stays with the server, whose flow control pushes back on the client. Only a request with
    no body or a small one (:func:`small_body`) has its first message read, to notice a client that
    gives up; the app gets that message replayed. A larger body is not touched: its first message
    would cost as much memory again as the server's own buffer, a client leaving later goes unnoticed
    either way (the server has stopped reading it), and a client that sent ``Expect: 100-continue``
    is not asked for its body before the app wants it (uvicorn sends the 100 at the first read).
    """
    watch = _Watch(receive) if small_body(scope) else None
    current: Decision | None = decision
    entered = False
    while current is not None and current.delay:
        if current.verdict is Verdict.REJECT:
            current = await _tarpit(gate, clock, sleep, current)
            continue
        # One watcher for the hold and all its wake-ups (a hold where the rate can move wakes every
        # GateTuning.recheck s): a task group, a task and a read cancelled at each wake-up cost a hundred
        # microseconds, four times a second for every held request.
        held: Decision | None = current
        over = False
        try:
            async with anyio.create_task_group() as watching:
                if watch is not None:
                    watching.start_soon(watch, watching.cancel_scope)
                while held is not None and held.verdict is Verdict.PACE and held.delay:
                    await _sleep(gate, sleep, held)
                    held = gate.end_hold(held, clock())
                over = True
                entered = _enter(held, probes, clock)  # (now: the task group's exit below is an await)
                watching.cancel_scope.cancel()
        except BaseException:
            if entered:  # let in, but it never reaches the app: its place in flight comes back
                assert probes is not None
                probes.cancel(clock())
            elif held is not None and held.delay:  # (a hold, or the tarpit it ended in: its slot comes back)
                gate.end_hold(held, clock(), gone=True)
            raise
        if over:
            current = held
        else:  # the watcher ended the hold: the client left (or its read ended otherwise)
            assert held is not None and watch is not None
            current = gate.end_hold(held, clock(), watch.gone)
            entered = _enter(current, probes, clock)
    return current, receive if watch is None else watch.replayed()


async def _sleep(gate: Decider, sleep: Sleep, held: Decision) -> None:
    """Sleep out a hold's delay; a hold waiting for room in flight is woken sooner when its decider has room, and a
    new place held while a herd lands on the fleet when its decider finds the fleet's backlog landed."""
    if not held.room and not held.landing:
        await sleep(held.delay)
        return
    with anyio.CancelScope() as woken:
        wake = _Wake(woken)
        if held.room:
            gate.wait_room(wake)
        else:
            assert held.place is not None
            gate.wait_landing(wake, held.place[0])
        try:
            await sleep(held.delay)
        finally:
            wake.over = True


class _Wake:
    """Ends the sleep of a hold waiting for room (cancels its scope) when called; False once the hold is over."""

    __slots__ = ("over", "scope")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope, self.over = scope, False

    def __call__(self) -> bool:
        if self.over:
            return False
        self.over = True
        self.scope.cancel()
        return True


async def _tarpit(gate: Decider, clock: Clock, sleep: Sleep, rejection: Decision) -> Decision | None:
    """Hold a 429 for its delay (nothing to watch), then end the hold (its tarpit slot comes back however)."""
    try:
        await sleep(rejection.delay)
    except BaseException:  # (cancelled: its tarpit slot comes back all the same)
        gate.end_hold(rejection, clock(), gone=True)
        raise
    return gate.end_hold(rejection, clock())


def _enter(let: Decision | None, probes: Probes | None, clock: Clock) -> bool:
    """Put the request in flight in ``probes`` if ``let`` lets it in (see :func:`hold`); True if it does."""
    if probes is None or let is None or let.delay or let.verdict is Verdict.REJECT:
        return False
    probes.admit(clock())
    return True


class _Watch:
    """The client of a held request with no body or a small one: its first message, read while it is held (and
    replayed to the app), and whether it went away."""

    __slots__ = ("first", "gone", "receive")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.first: Message | None = None
        self.gone = False

    async def __call__(self, holding: anyio.CancelScope) -> None:
        if self.first is None:
            self.first = await self.receive()
        first = self.first
        if first["type"] == "http.disconnect" or not first.get("more_body", False):
            # the body is all in (or the client left): only a disconnect can come now
            self.gone = first["type"] == "http.disconnect" or (await self.receive())["type"] == "http.disconnect"
            holding.cancel()  # the client left: stop holding

    def replayed(self) -> Receive:
        """What the app receives from: its first message replayed, if it was read, then the rest."""
        first, receive = self.first, self.receive
        if first is None:
            return receive
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return first

        return replay
