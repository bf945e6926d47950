"""Browsers and CORS (admitgate.asgi.cors): preflights pass, rejections carry the app's CORS policy, expose lists merge.

Every case runs in both middleware orders: the gate added after ``CORSMiddleware`` (so outermost, "gate
outside") and before it ("gate inside"). The oracle for a rejection's CORS headers is the app's own CORS
layer on an admitted response to the same request.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, HeaderPolicy, ManualClock, Settings
from admitgate.asgi.headers import merge_expose, merge_names

ORIGIN = "https://app.example"
CORS_FIELDS = ("access-control-allow-origin", "access-control-allow-credentials", "vary")
OURS = ["Retry-After", "RateLimit", "RateLimit-Policy"]
ORDERS = ["gate outside", "gate inside"]


def make_app(order: str, clock: ManualClock, cors: Middleware | None = None, **gate: object) -> Starlette:
    """A Starlette app with one route, gated by a gate with one token (spent by the first request)."""

    async def hello(request):
        return PlainTextResponse("ok", headers={"x-request-id": "r1"})

    knobs = Settings(**{"burst": 1, "max_pacing_delay": 0, "tarpit": 0, **gate.pop("settings", {})})  # type: ignore[arg-type]
    options = {"rate": 1, "settings": knobs, "clock": clock, **gate}
    app = Starlette(routes=[Route("/api", hello, methods=["GET", "POST"])])
    if order == "gate inside":
        app.add_middleware(AdmitGate, **options)
    app.user_middleware.insert(0, cors or Middleware(CORSMiddleware, allow_origins=[ORIGIN], allow_methods=["*"],
                                                     allow_headers=["x-custom"]))  # fmt: skip
    if order == "gate outside":
        app.add_middleware(AdmitGate, **options)
    return app


def gate_of(app: Starlette) -> AdmitGate:
    layer = app.middleware_stack
    while not isinstance(layer, AdmitGate):
        layer = layer.app
    return layer


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.example")


def expose_list(response: httpx.Response) -> list[str]:
    fields = response.headers.get_list("access-control-expose-headers")
    assert len(fields) == 1, fields  # one list, as every cache and proxy reads it the same way
    return [name.strip() for name in fields[0].split(",")]


@pytest.fixture
def anyio_backend():
    return "asyncio"


PREFLIGHT = {"origin": ORIGIN, "access-control-request-method": "POST", "access-control-request-headers": "x-custom"}


@pytest.mark.anyio
@pytest.mark.parametrize("order", ORDERS)
async def test_preflights_pass_an_exhausted_gate_untouched(order: str, clock: ManualClock) -> None:
    app = make_app(order, clock)
    async with client(app) as http:
        assert (await http.get("/api")).status_code == 200  # the only token
        assert (await http.get("/api")).status_code == 429
        gate = gate_of(app)
        rejected, tokens = gate.gate.stats.rejected, gate.gate.pacer.tokens(clock())
        for _ in range(5):
            answer = await http.options("/api", headers=PREFLIGHT)
            assert answer.status_code == 200, answer.text
            assert answer.headers["access-control-allow-origin"] == ORIGIN
        assert gate.gate.stats.rejected == rejected and gate.gate.pacer.tokens(clock()) == tokens
        assert (await http.options("/api", headers={"origin": ORIGIN})).status_code == 429  # not a preflight


@pytest.mark.anyio
async def test_a_preflight_reaches_an_app_without_cors_ungated(clock: ManualClock) -> None:
    calls = []

    async def app(scope, receive, send):
        calls.append(scope["method"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gated = AdmitGate(app, rate=1, settings=Settings(burst=1, max_pacing_delay=0), clock=clock)
    async with client(gated) as http:
        assert (await http.get("/x")).status_code == 204
        assert (await http.options("/x", headers=PREFLIGHT)).status_code == 204
        assert (await http.get("/x")).status_code == 429
    assert calls == ["GET", "OPTIONS"]


CORS_CONFIGS = {
    "listed origin": Middleware(CORSMiddleware, allow_origins=[ORIGIN]),
    "any origin": Middleware(CORSMiddleware, allow_origins=["*"]),
    "any origin, credentials": Middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True),
    "regex, credentials": Middleware(CORSMiddleware, allow_origin_regex=r"https://.*\.example", allow_credentials=True),
    "positional options": Middleware(CORSMiddleware, [ORIGIN], ["GET"], [], True),
}


@pytest.mark.anyio
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("config", list(CORS_CONFIGS))
@pytest.mark.parametrize("origin", [ORIGIN, "https://elsewhere.test", None])
async def test_a_rejection_carries_what_the_apps_cors_policy_adds(order, config, origin, clock) -> None:
    app = make_app(order, clock, CORS_CONFIGS[config])
    headers = {"origin": origin} if origin else {}
    async with client(app) as http:
        admitted = await http.get("/api", headers=headers)
        rejected = await http.get("/api", headers=headers)
    assert (admitted.status_code, rejected.status_code) == (200, 429)
    for field in CORS_FIELDS:
        assert rejected.headers.get_list(field) == admitted.headers.get_list(field), field
    assert rejected.headers["retry-after"] == "1"
    if origin == ORIGIN:
        assert rejected.headers["access-control-allow-origin"] in (ORIGIN, "*")
        assert set(OURS) <= set(expose_list(rejected))


@pytest.mark.anyio
@pytest.mark.parametrize("order", ORDERS)
async def test_the_expose_lists_merge(order: str, clock: ManualClock) -> None:
    cors = Middleware(CORSMiddleware, allow_origins=[ORIGIN], expose_headers=["X-Request-ID", "retry-after"])
    app = make_app(order, clock, cors, headers=HeaderPolicy(on_admit=True, legacy=True), settings={"burst": 2})
    async with client(app) as http:
        admitted = await http.get("/api", headers={"origin": ORIGIN})
        await http.get("/api", headers={"origin": ORIGIN})
        rejected = await http.get("/api", headers={"origin": ORIGIN})
    assert (admitted.status_code, rejected.status_code) == (200, 429)
    legacy = ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]
    for response in (admitted, rejected):
        assert expose_list(response) == ["X-Request-ID", "retry-after", "RateLimit", "RateLimit-Policy", *legacy]
        assert response.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.anyio
async def test_a_gate_wrapping_a_starlette_app_finds_its_cors_layer(clock: ManualClock) -> None:
    inner = make_app("no gate", clock, Middleware(CORSMiddleware, allow_origins=[ORIGIN], expose_headers=["X-A"]))
    app = AdmitGate(inner, rate=1, settings=Settings(burst=1, max_pacing_delay=0), clock=clock)
    async with client(app) as http:
        await http.get("/api")
        rejected = await http.get("/api", headers={"origin": ORIGIN})
    assert rejected.status_code == 429 and rejected.headers["access-control-allow-origin"] == ORIGIN
    assert expose_list(rejected) == ["X-A", *OURS]


@pytest.mark.anyio
async def test_without_a_cors_layer_a_rejection_keeps_its_own_expose_list(clock: ManualClock) -> None:
    app = AdmitGate(PlainTextResponse("ok"), rate=1, settings=Settings(burst=1, max_pacing_delay=0), clock=clock)
    async with client(app) as http:
        await http.get("/api")
        rejected = await http.get("/api", headers={"origin": ORIGIN})
    assert rejected.status_code == 429 and "access-control-allow-origin" not in rejected.headers
    assert expose_list(rejected) == OURS


names = st.lists(st.sampled_from(["Retry-After", "retry-after", "RateLimit", "X-Request-ID", "x-a", " X-A "]))


@given(names, names)
def test_merged_names_keep_the_first_list_and_add_each_new_name_once(first, then) -> None:
    merged = merge_names(first, then)
    lowered = [name.lower() for name in merged]
    assert len(lowered) == len(set(lowered))
    assert set(lowered) == {name.strip().lower() for name in first + then}
    assert merged[: len(merge_names(first, []))] == merge_names(first, [])


def test_merge_expose_makes_one_field_of_every_list() -> None:
    headers = [(b"content-type", b"text/plain"), (b"access-control-expose-headers", b"X-A, Retry-After"),
               (b"Access-Control-Expose-Headers", b"X-B")]  # fmt: skip
    assert merge_expose(headers, OURS) == [(b"content-type", b"text/plain"),
                                           (b"access-control-expose-headers", b"X-A, Retry-After, X-B, RateLimit, "
                                                                              b"RateLimit-Policy")]  # fmt: skip


@pytest.mark.anyio
async def test_a_gate_that_cannot_find_itself_warns_once_and_still_rejects(clock: ManualClock, caplog) -> None:
    class Opaque:  # keeps its inner app where a walk down .app cannot follow
        def __init__(self, app) -> None:
            self.inner = app

        async def __call__(self, scope, receive, send) -> None:
            await self.inner(scope, receive, send)

    app = make_app("gate inside", clock, Middleware(CORSMiddleware, allow_origins=[ORIGIN], expose_headers=["X-A"]))
    app.user_middleware.insert(1, Middleware(Opaque))  # between the CORS layer (outside) and the gate
    async with client(app) as http:
        await http.get("/api")
        for _ in range(2):
            rejected = await http.get("/api", headers={"origin": ORIGIN})
            assert rejected.status_code == 429 and rejected.headers["access-control-allow-origin"] == ORIGIN
    assert sum("could not find itself" in r.message for r in caplog.records) == 1


@pytest.mark.anyio
async def test_each_origin_gets_its_own_cors_fields_however_many_come(clock: ManualClock, monkeypatch) -> None:
    monkeypatch.setattr("admitgate.asgi.cors.MAX_ORIGINS", 2)  # the per-Origin results are cleared and learnt again
    cors = Middleware(CORSMiddleware, allow_origin_regex=r"https://[a-c]\.example", allow_credentials=True)
    origins = ["https://a.example", "https://b.example", None, "https://x.example", "https://c.example"] * 2
    seen: dict[str, list[dict[str, list[str]]]] = {}
    for order in ORDERS:  # gate inside: the app's own layer adds the fields (the oracle)
        app = make_app(order, clock, cors, settings={"max_retry_after": 60})
        async with client(app) as http:
            await http.get("/api")
            responses = [await http.get("/api", headers={"origin": o} if o else {}) for o in origins]
        assert {r.status_code for r in responses} == {429}
        seen[order] = [{f: r.headers.get_list(f) for f in CORS_FIELDS} for r in responses]
    assert seen["gate outside"] == seen["gate inside"]
    assert seen["gate outside"][0]["access-control-allow-origin"] == ["https://a.example"]
    assert seen["gate outside"][3]["access-control-allow-origin"] == []
