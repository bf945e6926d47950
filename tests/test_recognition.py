"""Who a returning client is, on a real uvicorn with its default flags (``--proxy-headers`` on, trusting
127.0.0.1), over TCP and over a Unix socket, with httpx clients. Behaviour only, never speed."""

from __future__ import annotations

import os
import socket
import tempfile

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ManualClock, Settings
from lab.serving import free_port

pytestmark = pytest.mark.integration


def gated(**options) -> AdmitGate:
    """A hello app behind a gate with one token on a frozen clock: every request after the first is refused."""

    async def hello(request):
        return PlainTextResponse("hi")

    settings = Settings(burst=1, max_pacing_delay=0, tarpit=0.05)
    options = {"rate": 1, "settings": settings, "clock": ManualClock(1000.0), **options}
    return AdmitGate(Starlette(routes=[Route("/", hello)]), **options)


def retry_after(response: httpx.Response) -> int:
    assert response.status_code == 429, response.status_code
    return int(response.headers["retry-after"])


def test_clients_behind_one_forwarded_address_are_not_merged(serve) -> None:
    # uvicorn's proxy headers turn X-Forwarded-For from 127.0.0.1 into scope["client"] = (address, 0)
    gate = gated()
    forwarded = {"x-forwarded-for": "203.0.113.7"}
    with serve(gate) as base:
        assert httpx.get(base).status_code == 200
        with (
            httpx.Client(base_url=base, headers=forwarded) as alice,
            httpx.Client(base_url=base, headers=forwarded) as bob,
        ):
            first = retry_after(alice.get("/"))
            other = retry_after(bob.get("/"))  # bob's very first request
            back = retry_after(alice.get("/"))  # alice comes back early, with her ticket
    assert other > first  # a slot of bob's own, not alice's
    assert back == first and gate.gate.stats.early == 1  # only alice's return was early


def test_users_multiplexed_on_one_keep_alive_connection_are_not_merged(serve) -> None:
    # a reverse proxy without trusted_hops, or a service's connection pool: one connection, many users
    gate = gated()
    with serve(gate) as base, httpx.Client(base_url=base, limits=httpx.Limits(max_connections=1)) as pool:

        def send(user: str) -> int:
            pool.cookies.clear()  # a proxy keeps no cookies of its own
            return retry_after(pool.get("/", headers={"authorization": f"Bearer {user}"}))

        assert httpx.get(base).status_code == 200
        alice = send("alice")
        bob = send("bob")
        assert bob > alice and gate.gate.stats.early == 0
        assert send("alice") == alice and gate.gate.stats.early == 1  # the same user on the same connection


def test_a_client_on_a_unix_socket_is_recognised_by_its_ticket(serve) -> None:
    gate = gated()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gate.sock")

        def client() -> httpx.Client:
            return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://gate.test")

        with serve(gate, uds=path):
            with client() as first:
                assert first.get("/").status_code == 200
            with client() as other:
                retry_after(other.get("/"))
            with client() as returning:
                tries = [retry_after(returning.get("/")) for _ in range(3)]
                assert "admitgate_rt" in returning.cookies
    assert tries == [2, 2, 2]  # one slot, kept (it was 2, 3, 4: a new slot for every try)


def test_a_new_connection_from_a_rejected_clients_port_is_not_held_as_an_early_returner(serve) -> None:
    # fresh, cookie-less one-shot clients (Connection: close): the source port of a closed one comes back
    gate = gated(settings=Settings(burst=1, max_pacing_delay=0, tarpit=0.5))
    with serve(gate) as base:
        port = int(base.rsplit(":", 1)[1])
        assert httpx.get(base).status_code == 200
        source = free_port()
        told = [one_shot(port, source) for _ in range(2)]  # the second connection from the port the first closed
    assert told[0][0] == told[1][0] == 429
    assert gate.gate.stats.early == 0 and gate.gate.stats.returning == 0
    assert told[1][1] > told[0][1]  # a place of its own, behind the first one's


def one_shot(port: int, source: int) -> tuple[int, int]:
    """One GET from loopback port ``source`` on a new connection that asks to close: (status, Retry-After)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", source))
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: gate.test\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):  # to the server's close: the connection is over
            reply += chunk
    head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in head[1:])
    return int(head[0].split(" ")[1]), int(fields["retry-after"])
