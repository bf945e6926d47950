"""A real browser: headless Chromium on a page of one origin fetches from the gated app on another.

The page (127.0.0.1:A) fetches from the app (127.0.0.1:B), which has ``CORSMiddleware`` allowing the page's
origin and exposing its own ``X-Request-ID``, and the gate in either order. JS must read Retry-After and
RateLimit from the 429s, X-Request-ID from the 200s, and a request with a custom header (so preflighted)
must never fail on its preflight. Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs
them); without them the test fails. Selenium drives the system chromedriver and never downloads a browser.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from admitgate import AdmitGate, Settings

pytestmark = pytest.mark.integration

# What a closed machine needs (see the machine notes): no background traffic, no QUIC, no sandbox as root.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
RATE_LIMIT = re.compile(r'^"admitgate";r=0;t=[1-9][0-9]*$')

PAGE = """<!doctype html><title>page</title><script>
async function probe(url, init) {
  try {
    const r = await fetch(url, init);
    return {status: r.status, retryAfter: r.headers.get("Retry-After"), rateLimit: r.headers.get("RateLimit"),
            requestId: r.headers.get("X-Request-ID"), body: await r.text()};
  } catch (e) {
    return {error: String(e)};
  }
}
// n fetches at once, each to its own URL (a preflight is cached per URL, so each preflighted one sends its own)
function burst(base, n, preflighted) {
  const init = preflighted ? {method: "POST", headers: {"X-Custom": "1"}} : {};
  return Promise.all(Array.from({length: n}, (_, i) => probe(`${base}/api?i=${i}&p=${preflighted}`, init)));
}
</script>"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("chromium and chromedriver are required (Debian packages chromium and chromium-driver; "
                    ".ci/run installs them)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def api(kind: str, order: str, page_origin: str):
    """The gated app: one token every 10 s (tarpit off, no pacing), so a burst gets 429s."""
    cors = {"allow_origins": [page_origin], "allow_methods": ["GET", "POST"], "allow_headers": ["X-Custom"],
            "expose_headers": ["X-Request-ID"]}  # fmt: skip
    gate = {"rate": 0.1, "settings": Settings(burst=1, max_pacing_delay=0, tarpit=0)}

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"}, headers={"X-Request-ID": "r1"})

    if kind == "fastapi":
        app: Starlette = FastAPI()
        app.add_api_route("/api", hello, methods=["GET", "POST"])
    else:
        app = Starlette(routes=[Route("/api", hello, methods=["GET", "POST"])])
    first, then = (CORSMiddleware, AdmitGate) if order == "gate outside" else (AdmitGate, CORSMiddleware)
    app.add_middleware(first, **(cors if first is CORSMiddleware else gate))
    app.add_middleware(then, **(cors if then is CORSMiddleware else gate))
    seen: list[tuple[str, int]] = []

    async def recorded(scope, receive, send):  # what left the server, as (method, status)
        async def record(message):
            if message["type"] == "http.response.start":
                seen.append((scope["method"], message["status"]))
            await send(message)

        await app(scope, receive, record)

    return recorded, seen


def check_readable(results: list[dict]) -> None:
    """Every fetch got a response JS could read: 429s with their Retry-After and RateLimit, 200s with X-Request-ID."""
    assert all("error" not in r for r in results), results
    assert {r["status"] for r in results} <= {200, 429}, results
    assert any(r["status"] == 429 for r in results), results
    for r in results:
        if r["status"] == 429:
            assert r["retryAfter"] is not None and r["retryAfter"].isdigit() and int(r["retryAfter"]) >= 1, r
            assert RATE_LIMIT.match(r["rateLimit"] or ""), r
            assert '"status":429' in r["body"], r
        else:
            assert r["requestId"] == "r1", r


@pytest.mark.parametrize("kind", ["starlette", "fastapi"])
@pytest.mark.parametrize("order", ["gate outside", "gate inside"])
def test_a_page_on_another_origin_reads_the_429s(serve, browser: webdriver.Chrome, kind: str, order: str) -> None:
    page = Starlette(routes=[Route("/", lambda request: HTMLResponse(PAGE))])
    with serve(page) as page_base:
        app, seen = api(kind, order, page_base)
        with serve(app) as api_base:
            browser.get(page_base + "/")
            simple = browser.execute_async_script("burst(...arguments).then(arguments[3])", api_base, 8, False)
            check_readable(simple)
            preflighted = browser.execute_async_script("burst(...arguments).then(arguments[3])", api_base, 8, True)
            check_readable(preflighted)
    preflights = [status for method, status in seen if method == "OPTIONS"]
    assert len(preflights) == 8 and set(preflights) == {200}, seen
