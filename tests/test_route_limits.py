"""Per-key and per-route limits as users write them: the routes table, several windows, a FastAPI dependency, a
decorator, keys by header, address, function and tenant; the spread Retry-After; config; the fleet's count."""

from __future__ import annotations

import json
import math
from collections import Counter

import anyio
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ConfigError, HeaderPolicy, Identity, ManualClock, Quota, Settings, Tenancy, limited
from admitgate.config import load
from admitgate.core.quota import QuotaRate, digest, spread
from tests.test_middleware import Recorder, call, http_scope


@pytest.fixture
def anyio_backend():
    return "asyncio"


def gated(app, clock: ManualClock, sleep, **options) -> AdmitGate:
    return AdmitGate(app, rate=1_000, settings=Settings(burst=1_000), clock=clock, sleep=sleep,
                     identity=Identity(ticket=False), **options)  # fmt: skip


def client_at(address: str, path: str = "/login", method: str = "GET", headers=()) -> dict:
    return http_scope(path, client=(address, 4000), method=method, headers=headers)


# -- the routes table -----------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_routes_quota_limits_that_route_per_key_and_no_other(clock: ManualClock, sleep) -> None:
    app = gated(Recorder(), clock, sleep, routes={"/login": {"quota": {"limit": "2/minute", "key": "address"}}})
    assert [(await call(app, client_at("10.0.0.1")))[0] for _ in range(3)] == [200, 200, 429]
    assert (await call(app, client_at("10.0.0.2")))[0] == 200  # another address has its own count
    assert [(await call(app, client_at("10.0.0.1", "/other")))[0] for _ in range(5)] == [200] * 5
    status, headers, body = await call(app, client_at("10.0.0.1"))
    assert status == 429 and headers["ratelimit-policy"] == '"/login";q=2;w=60'  # named after its route
    assert json.loads(body)["violated-policies"] == ["/login"]
    assert app.quota_refused == 2


@pytest.mark.anyio
async def test_a_route_quota_beside_the_apps_counts_both_and_a_refusal_counts_in_neither(clock, sleep) -> None:
    app = gated(Recorder(), clock, sleep, quota=Quota("3/minute", key="address"),
                routes={"/login": {"quota": Quota("1/minute", key="address")}})  # fmt: skip
    assert (await call(app, client_at("10.0.0.1")))[0] == 200
    for _ in range(5):  # refused by the route's quota: not counted in the app's
        status, headers, _ = await call(app, client_at("10.0.0.1"))
        assert status == 429 and headers["ratelimit-policy"].startswith('"/login"')
    assert [(await call(app, client_at("10.0.0.1", "/x")))[0] for _ in range(3)] == [200, 200, 429]


@pytest.mark.anyio
async def test_several_windows_each_bind_and_a_refused_request_is_counted_in_none(clock: ManualClock, sleep) -> None:
    app = gated(Recorder(), clock, sleep, quota=Quota("2/second;3/minute", key="address"),
                headers=HeaderPolicy(on_admit=True))  # fmt: skip
    statuses = []
    for _ in range(2):
        status, headers, _ = await call(app, client_at("10.0.0.1"))
        statuses.append(status)
    assert headers["ratelimit-policy"] == '"quota-1s";q=2;w=1, "quota-1m";q=3;w=60'  # one list, every window
    assert headers["ratelimit"].startswith('"quota-1s";r=0;t=1, "quota-1m";r=1;')
    status, headers, _ = await call(app, client_at("10.0.0.1"))  # the second's window refuses
    assert statuses == [200, 200] and status == 429 and headers["ratelimit-policy"] == '"quota-1s";q=2;w=1'
    clock.advance(1.0)
    assert (await call(app, client_at("10.0.0.1")))[0] == 200  # the minute's third (the refusal took none)
    clock.advance(1.0)
    status, headers, _ = await call(app, client_at("10.0.0.1"))
    assert status == 429 and headers["ratelimit-policy"] == '"quota-1m";q=3;w=60'  # now the minute refuses
    assert 18 <= int(headers["retry-after"]) <= 40  # 20 s after the first until one more, plus the key's place


def test_several_windows_parse_shortest_first_and_the_burst_is_the_shortests() -> None:
    assert Quota("100/day;5/minute", burst=2).rates == (QuotaRate(5, 60.0, 2), QuotaRate(100, 86_400.0))
    for spec, field in (("5/minute;6/minute", "limit"), ("10/second;lots", "limit")):
        with pytest.raises(ConfigError) as error:
            Quota(spec)
        assert error.value.field == field
    with pytest.raises(ConfigError) as error:
        Quota("5/minute;100/day", burst=6)  # more than the shortest window allows
    assert error.value.field == "burst"


# -- the Retry-After of a quota -------------------------------------------------------------------
@pytest.mark.anyio
async def test_keys_refused_together_are_told_times_spread_over_the_interval_not_one_reset(clock, sleep) -> None:
    app = gated(Recorder(), clock, sleep, quota=Quota("1/minute"))
    keys = [f"key-{i}" for i in range(600)]
    for key in keys:
        assert (await call(app, client_at("10.0.0.1", headers=[(b"x-api-key", key.encode())])))[0] == 200
    told = []
    for key in keys:  # all refused at the same moment, each with a full minute to wait
        status, headers, _ = await call(app, client_at("10.0.0.1", headers=[(b"x-api-key", key.encode())]))
        assert status == 429 and headers["ratelimit"].endswith(f";t={headers['retry-after']}")
        told.append(int(headers["retry-after"]))
    assert min(told) >= 60 and max(told) <= 120  # never before the key has its next request, within one more T
    per_second = Counter(told)
    assert len(per_second) >= 55 and max(per_second.values()) <= 30  # ~10 a second over 60 s, not 600 at once
    thirds = Counter(min(2, (t - 60) * 3 // 61) for t in told)
    assert all(150 <= n <= 250 for n in thirds.values())  # evenly spread
    assert told[0] == math.ceil(spread(60.0, QuotaRate(1, 60.0), digest("key-0")))  # the key's own place


# -- declared on the app's routes -----------------------------------------------------------------
def fastapi_app(quota: Quota) -> FastAPI:
    app = FastAPI()
    app.add_middleware(AdmitGate, rate=1_000, identity=Identity(ticket=False))
    router = APIRouter(dependencies=[Depends(quota)])

    @router.get("/report")
    async def report() -> dict:
        return {"report": True}

    app.include_router(router, prefix="/api")

    @app.post("/login", dependencies=[Depends(quota)])
    async def login() -> dict:
        return {"ok": True}

    @app.get("/login")
    async def form() -> dict:
        return {"form": True}

    @app.get("/items/{item_id}")
    @limited("1/minute", key="address")
    async def item(item_id: int) -> dict:
        return {"item": item_id}

    return app


def run(app, requests: list[tuple[str, str]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.request(method, path) for method, path in requests]

    return anyio.run(go)


def test_a_fastapi_dependency_declares_the_routes_quota_and_the_gate_enforces_it() -> None:
    app = fastapi_app(Quota("2/minute", key="address"))
    answers = run(app, [("POST", "/login")] * 3 + [("GET", "/login")] * 3)
    assert [r.status_code for r in answers] == [200, 200, 429, 200, 200, 200]  # POST only: the route's method
    refused = answers[2]
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["ratelimit-policy"] == '"/login";q=2;w=60'
    assert 30 <= int(refused.headers["retry-after"]) <= 60
    # an included router's dependency: each route it declares counts its own requests
    assert [r.status_code for r in run(app, [("GET", "/api/report")] * 3)] == [200, 200, 429]


def test_the_decorator_declares_a_quota_per_route_template_whatever_its_place() -> None:
    app = fastapi_app(Quota("2/minute", key="address"))
    answers = run(app, [("GET", "/items/1"), ("GET", "/items/2"), ("GET", "/items/1")])
    assert [r.status_code for r in answers] == [200, 429, 429]  # /items/{item_id}: one route, one count

    async def hello(request):
        return PlainTextResponse("hi")

    marked = limited("1/minute", key="address")(hello)
    assert marked is hello  # the endpoint itself, marked
    starlette = Starlette(routes=[Route("/hello", marked, methods=["GET", "POST"])])
    starlette.add_middleware(AdmitGate, rate=1_000, identity=Identity(ticket=False))
    assert [r.status_code for r in run(starlette, [("GET", "/hello"), ("POST", "/hello")])] == [200, 429]


def test_a_dependency_no_gate_checked_fails_loudly_never_silently_unlimited() -> None:
    quota = Quota("2/minute", key="address")
    app = FastAPI()

    @app.get("/login", dependencies=[Depends(quota)])
    async def login() -> dict:
        return {"ok": True}

    with pytest.raises(RuntimeError, match="no AdmitGate in front of the app checked it"):
        run(app, [("GET", "/login")])


def test_a_declared_quota_that_cannot_work_refuses_the_start_up(serve) -> None:
    app = FastAPI()
    app.add_middleware(AdmitGate, rate=1_000)

    @app.get("/x", dependencies=[Depends(Quota("2/minute", key="tenant"))])
    async def x() -> dict:
        return {}

    messages: list[dict] = []

    async def go() -> None:
        inbox = [{"type": "lifespan.startup"}]

        async def receive() -> dict:
            return inbox.pop() if inbox else await anyio.sleep_forever()

        async def send(message: dict) -> None:
            messages.append(message)

        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)

    anyio.run(go)
    assert messages[0]["type"] == "lifespan.startup.failed" and "tenants=Tenancy" in messages[0]["message"]


# -- keys -----------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_quota_keyed_by_tenant_counts_the_gates_tenants(clock: ManualClock, sleep) -> None:
    app = gated(Recorder(), clock, sleep, tenants=Tenancy(key="header:x-team"),
                routes={"/export": {"quota": {"limit": "1/minute", "key": "tenant"}}})  # fmt: skip

    def team(name: str) -> dict:
        return client_at("10.0.0.1", "/export", headers=[(b"x-team", name.encode())])

    assert [(await call(app, team("red")))[0] for _ in range(2)] == [200, 429]
    assert (await call(app, team("blue")))[0] == 200
    with pytest.raises(ConfigError) as error:
        gated(Recorder(), clock, sleep, routes={"/export": {"quota": {"limit": "1/minute", "key": "tenant"}}})
    assert error.value.field == "routes['/export'].quota.key"


@pytest.mark.anyio
async def test_a_quota_keyed_by_a_function_of_the_scope(clock: ManualClock, sleep) -> None:
    def user(scope: dict) -> str | None:
        return dict(scope["headers"]).get(b"authorization", b"").decode() or None

    app = gated(Recorder(), clock, sleep, routes={"/login": {"quota": Quota("1/minute", key=user)}})
    bearer = client_at("10.0.0.1", headers=[(b"authorization", b"Bearer a")])
    assert [(await call(app, bearer))[0] for _ in range(2)] == [200, 429]
    assert (await call(app, client_at("10.0.0.1")))[0] == 200  # no key: not limited


# -- configuration --------------------------------------------------------------------------------
def test_route_quotas_from_a_file_and_the_environment(tmp_path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text('[routes."/login"]\nquota = "5/minute;100/day"\n'
                    '[routes."/export"]\nquota = { limit = "10/hour", key = "address" }\n')  # fmt: skip
    routes = load(path, env={})["routes"]
    app = AdmitGate(Recorder(), rate=100, routes=routes)
    assert app.router.quotas == {"/login": Quota("5/minute;100/day"), "/export": Quota("10/hour", key="address")}
    env = {"ADMITGATE_ROUTES": '{"/login": {"quota": {"limit": "5/minute", "key": "address"}}}'}
    assert AdmitGate(Recorder(), rate=100, **load(env=env)).router.quotas == {"/login": Quota("5/minute", "address")}


@pytest.mark.parametrize(("text", "field"), [
    ('[routes."/login"]\nquota = "lots"\n', "routes['/login'].quota.limit"),
    ('[routes."/login"]\nquota = { limit = "5/minute", key = "bogus" }\n', "routes['/login'].quota.key"),
    ('[routes."/login"]\nquota = { limt = "5/minute" }\n', "routes['/login'].quota"),
    ('[routes."/login"]\nexempt = true\nquota = "5/minute"\n', "routes['/login'].quota"),
])  # fmt: skip
def test_a_bad_route_quota_in_a_file_names_the_route(tmp_path, text: str, field: str) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert error.value.field == field


# -- the fleet's count ----------------------------------------------------------------------------
def test_replicas_sharing_redis_count_a_routes_windows_for_the_fleet(redis_server) -> None:
    async def go() -> list[int]:
        replicas = [AdmitGate(Recorder(), rate=1_000, backend=redis_server.url, identity=Identity(ticket=False),
                              quota=Quota("3/minute", key="address"),
                              routes={"/login": {"quota": {"limit": "2/second;3/minute", "key": "address"}}})
                    for _ in range(2)]  # fmt: skip
        statuses = [(await call(replicas[i % 2], client_at("10.0.0.1")))[0] for i in range(6)]
        statuses.append((await call(replicas[0], client_at("10.0.0.1", "/x")))[0])  # the app's: 2 used of 3
        statuses.append((await call(replicas[1], client_at("10.0.0.1", "/x")))[0])
        for app in replicas:
            assert app._quota is not None and app._quota.shared is not None and not app._quota.shared.degraded
            await app.backend.stop()  # type: ignore[union-attr]
        return statuses

    assert anyio.run(go) == [200, 200, 429, 429, 429, 429, 200, 429]
