"""What a newcomer copies from the docs must work as written: the documented ``/metrics`` mount answers at
``/metrics``, and a second AdmitGate around the same app is refused at start-up, never added silently."""

from __future__ import annotations

import anyio
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ConfigError, metrics_app
from tests.test_middleware import Recorder


async def hello(request):
    return PlainTextResponse("hi")


def start_up(app) -> dict:
    """The first message ``app`` answers a lifespan start-up with."""
    sent: list[dict] = []

    async def go() -> None:
        inbox = [{"type": "lifespan.startup"}]

        async def receive() -> dict:
            return inbox.pop() if inbox else await anyio.sleep_forever()

        async def send(message: dict) -> None:
            sent.append(message)

        with anyio.move_on_after(5):
            await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)

    anyio.run(go)
    return sent[0]


# -- a second gate --------------------------------------------------------------------------------
def test_the_readmes_two_snippets_together_refuse_the_start_up() -> None:
    app = FastAPI()
    app.add_middleware(AdmitGate)  # the first snippet
    app.add_middleware(AdmitGate, rate=200, exempt=["/health", "/metrics"])  # the second, added to it
    answer = start_up(app)
    assert answer["type"] == "lifespan.startup.failed" and "already has an AdmitGate" in answer["message"]


def test_a_gate_around_a_gated_app_is_refused_wherever_the_first_one_is() -> None:
    with pytest.raises(ConfigError, match="already has an AdmitGate"):
        AdmitGate(CORSMiddleware(AdmitGate(Recorder(), rate=10), allow_origins=["*"]), rate=10)
    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(AdmitGate, rate=10)
    with pytest.raises(ConfigError, match="already has an AdmitGate") as error:
        AdmitGate(app, rate=10)  # the app's own stack will hold one when it is built
    assert error.value.field == "middleware"


def test_one_gate_per_app_of_a_mount_is_not_a_second_gate() -> None:
    inner = Starlette(routes=[Route("/", hello)])
    inner.add_middleware(AdmitGate, rate=10)
    outer = Starlette(routes=[Route("/", hello)])
    outer.mount("/sub", inner)
    outer.add_middleware(AdmitGate, rate=100)
    assert start_up(outer)["type"] == "lifespan.startup.complete"


# -- the /metrics mount ---------------------------------------------------------------------------
@pytest.mark.parametrize("exporter", ["admitgate", "prometheus-client"])
def test_the_documented_metrics_mount_answers_200_at_metrics_on_a_real_server(serve, exporter: str) -> None:
    registry = CollectorRegistry()
    app = Starlette(routes=[Route("/", hello)])
    app.mount("/metrics", metrics_app(registry) if exporter == "admitgate" else make_asgi_app(registry))
    app.add_middleware(AdmitGate, rate=1_000, metrics=registry)
    with serve(app) as url, httpx.Client(base_url=url, timeout=5, follow_redirects=False) as client:
        assert client.get("/").status_code == 200
        for path in ("/metrics", "/metrics/"):
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.status_code, answer.headers.get("location"))
            assert "admitgate_requests_total" in answer.text
        assert client.get("/metrics", params={"name[]": "admitgate_requests_total"}).status_code == 200
        assert client.get("/metricsfoo").status_code == 404  # a mount's path only, on a segment boundary
