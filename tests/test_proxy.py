"""The gate behind a real nginx, with cookie-less clients each on its own keep-alive connection to nginx: with
nginx's typical lines nothing ties a retry to its client, and the gate says so; with the client's port forwarded
(docs/deployment.md) a returning client is recognised. Behaviour only, never speed."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, Identity, ManualClock, Settings
from lab.http1 import Http1Client
from lab.nginx import TYPICAL, WITH_PORT, nginx_proxy
from lab.serving import free_port
from tests.test_recognition import one_shot

pytestmark = pytest.mark.integration


def gated(identity: Identity, clock: ManualClock | None = None) -> AdmitGate:
    """A hello app behind a gate with one token on a frozen clock (``clock``, moved by the test only): every request
    after the first is refused until the clock moves."""

    async def hello(request):
        return PlainTextResponse("hi")

    settings = Settings(burst=1, max_pacing_delay=0, tarpit=0.05)
    return AdmitGate(Starlette(routes=[Route("/", hello)]), rate=1, settings=settings,
                     clock=clock or ManualClock(1000.0), identity=identity)  # fmt: skip


async def once(base: str) -> int:
    """One request on a connection of its own, closed after it: its status."""
    client = Http1Client("127.0.0.1", int(base.rsplit(":", 1)[1]), keep_alive=False, cookies=False)
    try:
        return (await client.get("/"))[0]
    finally:
        client.close()


async def tries(base: str, clients: int, rounds: int) -> list[list[int]]:
    """Each of ``clients`` cookie-less clients, on its own keep-alive connection, asks ``rounds`` times in turn;
    the Retry-After each was told, per client."""
    port = int(base.rsplit(":", 1)[1])
    pool = [Http1Client("127.0.0.1", port, keep_alive=True, cookies=False) for _ in range(clients)]
    told: list[list[int]] = [[] for _ in pool]
    try:
        for _ in range(rounds):
            for i, client in enumerate(pool):
                status, retry_after = await client.get("/")
                assert status == 429 and retry_after is not None, status
                told[i].append(retry_after)
    finally:
        for client in pool:
            client.close()
    return told


def test_behind_nginx_with_the_clients_port_forwarded_cookie_less_clients_are_recognised(serve) -> None:
    gate = gated(Identity(trusted_hops=1, forwarded="forwarded"))
    with serve(gate) as app, nginx_proxy(int(app.rsplit(":", 1)[1]), WITH_PORT) as base:
        assert asyncio.run(once(base)) == 200
        told = asyncio.run(tries(base, clients=3, rounds=3))
    assert [t[0] for t in told] == sorted({t[0] for t in told})  # three places, one each: nobody merged
    assert all(t == [t[0]] * 3 for t in told)  # each kept its place: back on its connection, known by it
    assert gate.gate.stats.returning == 6 and gate.gate.stats.early == 6
    assert gate.untied_counts[0] == 0


def test_behind_nginx_with_its_typical_lines_the_gate_says_once_what_to_configure(serve, caplog) -> None:
    gate = gated(Identity())
    with (caplog.at_level(logging.WARNING, logger="admitgate"), serve(gate) as app,
          nginx_proxy(int(app.rsplit(":", 1)[1]), TYPICAL) as base):  # fmt: skip
        assert asyncio.run(once(base)) == 200
        asyncio.run(tries(base, clients=3, rounds=2))
    said = [r.getMessage() for r in caplog.records if "port of 0" in r.getMessage()]
    assert len(said) == 1 and "$remote_port" in said[0]
    assert gate.gate.stats.returning == 0  # X-Forwarded-For carries no port: nothing ties a retry to its client
    assert gate.untied_counts[:2] == (6, 6)


def test_behind_nginx_a_new_connection_from_a_rejected_clients_port_is_not_held_as_it_back_early(serve) -> None:
    # one-shot clients through nginx: the app never sees their Connection: close, nginx's connection serial tells
    gate = gated(Identity(trusted_hops=1, forwarded="forwarded"))
    with serve(gate) as app, nginx_proxy(int(app.rsplit(":", 1)[1]), WITH_PORT) as base:
        assert asyncio.run(once(base)) == 200
        source = free_port()
        told = [one_shot(int(base.rsplit(":", 1)[1]), source) for _ in range(2)]
    assert told[0][0] == told[1][0] == 429
    assert gate.gate.stats.early == 0 and told[1][1] > told[0][1]  # a place of its own, not the first one's


def test_behind_nginx_with_its_typical_lines_cookie_less_clients_back_at_their_time_take_the_places_told_due(
        serve) -> None:  # fmt: skip
    clock = ManualClock(1000.0)
    gate = gated(Identity(), clock)
    with serve(gate) as app, nginx_proxy(int(app.rsplit(":", 1)[1]), TYPICAL) as base:
        assert asyncio.run(once(base)) == 200
        told = [t[0] for t in asyncio.run(tries(base, clients=3, rounds=1))]
        clock.advance(max(told))  # every one of them told to be back by now; one token in the bucket again
        back = [asyncio.run(once(base)) for _ in told]
    assert back == [200, 429, 429]  # the first in on the token, the others at their places, due, short of one
    assert gate.gate.stats.returning == 3  # each took a place told due: none took a new one at the tail
    assert gate.untied_counts[0] == 6  # (nothing ties any of them: strangers all)
