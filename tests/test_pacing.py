"""The pacing hold's loop (admitgate.asgi.pacing.hold) on an injected clock: its wake-ups and the client it watches."""

from __future__ import annotations

import anyio
import pytest

from admitgate import ManualClock, Settings
from admitgate.asgi.pacing import hold
from admitgate.core.gate import Gate, Verdict
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.core.tuning import GATE

DEFAULT = DEFAULT_CLASSES["default"]
RECHECK = GATE.recheck


class Rate:
    """A capacity source whose rate can move (its gate's holds wake every RECHECK s)."""

    def __init__(self, rate: float) -> None:
        self.value = rate

    def rate(self, now: float) -> float:
        return self.value


def scope() -> dict:
    return {"type": "http", "method": "GET", "path": "/", "headers": []}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_a_hold_watches_its_client_with_one_reader_across_its_wake_ups(clock: ManualClock, sleep) -> None:
    g = Gate(Rate(10.0), Settings(burst=1, max_pacing_delay=1.0), now=clock())
    for _ in range(7):  # the bucket's token, then six reserved: the last one's comes in 0.6 s
        decision = g.admit(1.0, DEFAULT, clock(), lambda: None)
    assert decision.verdict is Verdict.PACE and g.pacer.due_in(decision.token, clock()) > 2 * RECHECK
    reads = 0

    async def receive() -> dict:
        nonlocal reads
        reads += 1
        if reads == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()  # the client stays: only a disconnect could come
        raise AssertionError

    start = clock()
    after, _ = await hold(g, clock, sleep, decision, scope(), receive)
    assert after is not None and after.verdict is Verdict.ADMIT and clock() - start > 2 * RECHECK
    # Its body, then one wait for a disconnect for the whole hold: not a task group, a task and a read
    # cancelled at every wake-up (about 100 µs each, four times a second for every held request).
    assert reads == 2 and g.waiters == 5  # (the five reserved before it are held still)


@pytest.mark.anyio
async def test_a_tarpitted_429_cancelled_while_held_gives_its_tarpit_slot_back(clock: ManualClock) -> None:
    g = Gate(1, Settings(burst=1, max_pacing_delay=0.0, tarpit=5.0), now=clock())
    g.admit(1.0, DEFAULT, clock(), lambda: "a")
    g.admit(1.0, DEFAULT, clock(), lambda: "b")
    g.admit(1.0, DEFAULT, clock(), lambda: "c")  # told to come back in seconds
    early = g.admit(1.0, DEFAULT, clock(), lambda: "c")  # back at once: its 429 is held (the tarpit)
    assert early.verdict is Verdict.REJECT and early.delay > 0 and g.tarpitted == 1

    async def receive() -> dict:
        await anyio.sleep_forever()
        raise AssertionError

    with anyio.CancelScope() as server:  # the server cancels the request (a shutdown) while its 429 is held

        async def cancelled(seconds: float) -> None:
            server.cancel()
            await anyio.sleep(0)

        await hold(g, clock, cancelled, early, scope(), receive)
    assert server.cancelled_caught and g.tarpitted == 0


@pytest.mark.anyio
async def test_a_hold_let_in_is_in_flight_at_once_and_gives_its_place_back_if_cancelled_before_the_app(
    clock: ManualClock, sleep
) -> None:
    """With probes, the hold puts the request it lets in in flight before its last await (the task group's exit),
    where another hold woken in the same pass would otherwise find the same room; cancelled there (a shutdown), it
    never reaches the app, and its place in flight comes back."""
    from admitgate.core.probes import Probes

    g = Gate(Rate(10.0), Settings(burst=1, max_pacing_delay=1.0), now=clock())
    g.admit(1.0, DEFAULT, clock(), lambda: None)
    decision = g.admit(1.0, DEFAULT, clock(), lambda: None)
    assert decision.verdict is Verdict.PACE
    probes = Probes(now=clock())

    async def receive() -> dict:
        await anyio.sleep_forever()
        raise AssertionError

    after, _ = await hold(g, clock, sleep, decision, scope(), receive, probes)
    assert after is not None and after.verdict is Verdict.ADMIT and probes.inflight == 1
    decision = g.admit(1.0, DEFAULT, clock(), lambda: None)
    with anyio.CancelScope() as server:

        async def cancelled(seconds: float) -> None:  # the server cancels the request as its hold ends
            clock.advance(seconds)
            server.cancel()

        await hold(g, clock, cancelled, decision, scope(), receive, probes)
    assert server.cancelled_caught and probes.inflight == 1 and g.waiters == 0
