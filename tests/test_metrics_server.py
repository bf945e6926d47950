"""Metrics as a FastAPI/Starlette user meets them, on a real uvicorn: the mounted /metrics stays
reachable under overload, routes are labelled by the app's own templates, and verdicts add up."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from admitgate import AdmitGate, Identity, Settings
from admitgate import metrics as m
from admitgate.metrics import metrics_app

pytestmark = pytest.mark.integration


async def hello(request):
    return PlainTextResponse("ok")


def series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples called ``name`` in an exposition, by their sorted labels."""
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}  # fmt: skip


def verdicts_of(text: str) -> dict[str, float]:
    """Requests by verdict in an exposition."""
    return {dict(k)["verdict"]: v for k, v in series(text, f"{m.REQUESTS}_total").items()}


def test_a_mounted_metrics_app_answers_while_the_gate_rejects(serve) -> None:
    registry = CollectorRegistry()
    app = Starlette(routes=[Route("/", hello), Mount("/metrics", metrics_app(registry))])  # prometheus-client's way
    app.add_middleware(AdmitGate, rate=0.01, metrics=registry, settings=Settings(burst=1, max_pacing_delay=0, tarpit=0))
    with serve(app) as url, httpx.Client(base_url=url, timeout=5) as client:
        statuses = [client.get("/").status_code for _ in range(20)]
        assert statuses[0] == 200 and set(statuses[1:]) == {429}  # overloaded: one token per 100 s
        for path in ("/metrics/", "/metrics", "/metrics/anything"):  # /metrics redirects to /metrics/
            reply = client.get(path, follow_redirects=True)
            assert reply.status_code == 200, (path, reply.status_code, reply.headers.get("retry-after"))
        assert "admitgate_requests_total" in client.get("/metrics/").text
        assert client.get("/metricsfoo").status_code == 429  # a prefix on a path-segment boundary only


def test_routes_are_labelled_by_the_apps_own_templates(serve) -> None:
    from fastapi import APIRouter, FastAPI

    registry = CollectorRegistry()
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    users = APIRouter(prefix="/users")

    @users.get("/{user_id}/orders")
    async def orders(user_id: str) -> list[str]:
        return []

    app.include_router(users)
    app.mount("/admin", Starlette(routes=[Route("/reports/{day}", hello)]))
    app.mount("/metrics", metrics_app(registry))
    app.add_middleware(AdmitGate, rate=1000, routes={"/items/0": {"class": "critical"}}, metrics=registry)
    paths = ["/items/1", "/items/2", "/items/0", "/users/ann/orders", "/users/bob/orders", "/admin/reports/mon",
             "/nope", "/nope/deeper"]  # fmt: skip
    with serve(app) as url, httpx.Client(base_url=url, timeout=5) as client:
        for path in paths:
            client.get(path)
        text = client.get("/metrics/").text
    admitted = {dict(k)["route"]: v for k, v in series(text, f"{m.REQUESTS}_total").items()
                if dict(k)["verdict"] == "admitted"}  # fmt: skip
    assert admitted == {"/items/{item_id}": 2, "/items/0": 1, "/users/{user_id}/orders": 2,
                        "/admin/reports/{day}": 1, "*": 2}  # fmt: skip


def test_admitted_counts_every_request_that_reached_the_app(serve) -> None:
    registry = CollectorRegistry()
    reached = 0

    async def work(request):
        nonlocal reached
        reached += 1
        return PlainTextResponse("done")

    app = Starlette(routes=[Route("/work", work), Route("/metrics", metrics_app(registry))])
    app.add_middleware(
        AdmitGate,
        rate=2,
        metrics=registry,
        settings=Settings(burst=1, max_pacing_delay=1.5, tarpit=0),
        identity=Identity(ticket=False),
    )
    with serve(app) as url:
        assert httpx.get(url + "/work", timeout=5).status_code == 200  # the token
        with pytest.raises(httpx.ReadTimeout):  # held for the next token (0.5 s): this client leaves first
            httpx.get(url + "/work", timeout=0.15)
        deadline = time.monotonic() + 30
        while "abandoned" not in verdicts_of(httpx.get(url + "/metrics", timeout=5).text):  # the hold has ended
            assert time.monotonic() < deadline, "the abandoned request was never counted"
            time.sleep(0.05)
        with ThreadPoolExecutor(20) as pool:  # a burst: one at once, some paced, the rest rejected
            statuses = list(pool.map(lambda _: httpx.get(url + "/work", timeout=10).status_code, range(20)))
        text = httpx.get(url + "/metrics", timeout=5).text
    verdicts = verdicts_of(text)
    paced = sum(series(text, f"{m.PACED}_total").values())
    ok, rejected = statuses.count(200), statuses.count(429)
    assert ok + rejected == 20 and paced >= 1
    assert verdicts == {"admitted": reached, "rejected": rejected, "abandoned": 1}
    assert reached == ok + 1 and paced < reached  # the paced ones are part of admitted
