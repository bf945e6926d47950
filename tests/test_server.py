"""Real uvicorn on loopback, real httpx and websockets clients, Starlette and FastAPI apps.

These tests assert behaviour (statuses, headers, who gets in), never speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
import websockets
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from admitgate import AdmitGate, Identity, Quota, Settings, Tenancy

pytestmark = pytest.mark.integration


def stopped() -> float:
    """The gate's clock, stopped (monotonic seconds): every request comes at one instant, however long a loaded
    machine takes between them, so what a low rate admits is decided by the requests alone."""
    return 1000.0


def starlette_app(**gate) -> Starlette:
    async def hello(request):
        return PlainTextResponse("hi")

    async def item(request):
        return PlainTextResponse(request.path_params["item_id"])

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    routes = [Route("/", hello), Route("/items/{item_id}", item), Route("/health", hello), WebSocketRoute("/ws", ws)]
    app = Starlette(routes=routes)
    app.add_middleware(AdmitGate, **gate)
    return app


def fastapi_app(**gate) -> FastAPI:
    app = FastAPI()

    @app.get("/")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"item": item_id}

    app.add_middleware(AdmitGate, **gate)
    return app


async def burst(base: str, n: int, path: str = "/") -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=n)) as client:
        return list(await asyncio.gather(*(client.get(path) for _ in range(n))))


@pytest.mark.parametrize("factory", [starlette_app, fastapi_app])
def test_burst_is_admitted_up_to_the_bucket_and_the_rest_rejected_with_headers(serve, factory) -> None:
    with serve(factory(rate=2, settings=Settings(burst=5, max_pacing_delay=0), clock=stopped)) as base:
        responses = asyncio.run(burst(base, 20))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 5 and set(statuses) <= {200, 429}
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected
    for r in rejected:
        assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
        assert r.headers["ratelimit-policy"] == '"admitgate";q=2;w=1'
        assert r.headers["ratelimit"] == f'"admitgate";r=0;t={r.headers["retry-after"]}'
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["status"] == 429
    # distinct connections from one address are distinct clients: Retry-After values spread out
    assert len({r.headers["retry-after"] for r in rejected}) > 1


def test_pacing_turns_a_small_burst_into_admissions(serve) -> None:
    with serve(starlette_app(rate=50, settings=Settings(burst=1, max_pacing_delay=1.0))) as base:
        responses = asyncio.run(burst(base, 10))
    assert [r.status_code for r in responses] == [200] * 10


def test_route_templates_set_costs_in_fastapi(serve) -> None:
    settings = Settings(burst=2, max_pacing_delay=0)
    app = fastapi_app(rate=0.5, routes={"/items/{item_id}": {"cost": 2}}, settings=settings, clock=stopped)
    with serve(app) as base, httpx.Client(base_url=base) as client:
        assert client.get("/items/41").json() == {"item": 41}
        assert client.get("/items/42").status_code == 429
        assert client.get("/").status_code == 429


def test_an_httpx_client_echoes_the_ticket_and_keeps_its_slot_across_connections(serve) -> None:
    with serve(starlette_app(rate=1, settings=Settings(burst=1, max_pacing_delay=0, tarpit=0), clock=stopped)) as base:
        asyncio.run(burst(base, 8))  # others hold the first slots
        with httpx.Client(base_url=base, headers={"connection": "close"}) as client:  # a new connection each time
            first = client.get("/")
            assert first.status_code == 429 and "admitgate_rt" in client.cookies
            second = client.get("/")
        with httpx.Client(base_url=base, headers={"connection": "close"}) as stranger:
            other = stranger.get("/")
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) <= int(first.headers["retry-after"])
    assert int(other.headers["retry-after"]) > int(first.headers["retry-after"])


def test_exempt_health_and_malformed_headers_never_500(serve) -> None:
    garbage = {"cookie": "admitgate_rt=..%%; x=", "x-forwarded-for": ",,,[::", "forwarded": 'for="[;;'}
    app = starlette_app(rate=1, settings=Settings(burst=1, max_pacing_delay=0), identity=Identity(trusted_hops=1),
                        clock=stopped)  # fmt: skip
    with serve(app) as base, httpx.Client(base_url=base) as client:
        statuses = [client.get("/", headers=garbage).status_code for _ in range(5)]
        health = [client.get("/health").status_code for _ in range(5)]
    assert statuses[0] == 200 and set(statuses[1:]) == {429}
    assert health == [200] * 5


def test_websocket_handshakes_are_gated_only_when_asked(serve) -> None:
    async def connect(url: str) -> str | int:
        try:
            async with websockets.connect(url) as ws:
                return await ws.recv()
        except websockets.InvalidStatus as exc:
            assert exc.response.headers["retry-after"].isdigit()
            return exc.response.status_code

    async def three(base: str) -> list:
        url = base.replace("http://", "ws://") + "/ws"
        return [await connect(url) for _ in range(3)]

    with serve(starlette_app(rate=1, settings=Settings(burst=1, max_pacing_delay=0), clock=stopped)) as base:
        assert asyncio.run(three(base)) == ["hi", "hi", "hi"]
    gated = starlette_app(rate=1, gate_websockets=True, settings=Settings(burst=1, max_pacing_delay=0), clock=stopped)
    with serve(gated) as base:
        assert asyncio.run(three(base)) == ["hi", 429, 429]


def test_a_quota_refuses_websocket_handshakes_over_it_before_the_gate(serve) -> None:
    """With gate_websockets, a handshake over its key's quota gets the quota's 429 (Retry-After, its fields),
    as an HTTP request does; the gate's rate is far from binding."""
    refused: list[websockets.Response] = []

    async def connect(url: str) -> str | int:
        try:
            async with websockets.connect(url) as ws:
                return await ws.recv()
        except websockets.InvalidStatus as exc:
            refused.append(exc.response)
            return exc.response.status_code

    async def three(base: str) -> list:
        url = base.replace("http://", "ws://") + "/ws"
        return [await connect(url) for _ in range(3)]

    app = starlette_app(rate=1000, gate_websockets=True, quota=Quota("2/minute", key="address"), clock=stopped)
    with serve(app) as base:
        assert asyncio.run(three(base)) == ["hi", "hi", 429]
    assert 30 <= int(refused[0].headers["retry-after"]) <= 60  # one interval, and the key's place in the next one
    assert refused[0].headers["ratelimit-policy"] == '"quota";q=2;w=60'


def test_lifespan_runs_through_the_gate(serve) -> None:
    events = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("startup")
        yield
        events.append("shutdown")

    async def hello(request):
        return PlainTextResponse("hi")

    app = Starlette(routes=[Route("/", hello)], lifespan=lifespan)
    app.add_middleware(AdmitGate, rate=10)
    with serve(app) as base:
        assert httpx.get(base + "/").status_code == 200
    assert events == ["startup", "shutdown"]


def test_a_lone_tenant_below_the_rate_is_never_turned_away(serve) -> None:
    """32 connections of one API key on a server whose table's first reallocation fell due before its first
    request (it was idle since start-up): every request is admitted. Its key's pool, established on its third
    request, once found the newcomers' pool holding all of the capacity and rejected 32 of the first 1,600."""

    async def go(base: str) -> list[int]:
        async def one(client: httpx.AsyncClient) -> list[int]:
            return [(await client.get("/", headers={"x-api-key": "acme"})).status_code for _ in range(20)]

        clients = [httpx.AsyncClient(base_url=base) for _ in range(32)]
        try:
            return [code for codes in await asyncio.gather(*(one(c) for c in clients)) for code in codes]
        finally:
            for client in clients:
                await client.aclose()

    with serve(starlette_app(rate=1e6, tenants=Tenancy(key="header:x-api-key"))) as base:
        time.sleep(0.6)  # past the table's first reallocation (every 0.5 s, Tenancy.interval): idle since
        codes = asyncio.run(go(base))
    assert codes == [200] * 640
