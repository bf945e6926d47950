"""The retrying transports: MockTransport units, properties, and a helper-equipped herd through a real gate."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ConfigError, ManualClock, Settings
from admitgate.client import AsyncRetryTransport, RetryBudget, RetryPolicy, RetryTransport


def scripted(*outcomes):
    """A MockTransport answering with the given statuses (or raising the given exceptions), in order."""
    calls = []
    queue = list(outcomes)

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        status, headers = item if isinstance(item, tuple) else (item, {})
        return httpx.Response(status, headers=headers)

    return httpx.MockTransport(handler), calls


def top(a, b):
    return b


def client(transport, policy=None, **kwargs):
    sleeps = []
    t = RetryTransport(transport, policy or RetryPolicy(), uniform=top, sleep=sleeps.append, **kwargs)
    return httpx.Client(transport=t, base_url="http://svc"), t, sleeps


def test_statuses_to_sleeps() -> None:
    mock, calls = scripted(503, 502, 500, 200)
    c, t, sleeps = client(mock, RetryPolicy(attempts=5, base=0.1, cap=10))
    assert c.get("/").status_code == 200
    assert sleeps == [0.1, 0.2, 0.4] and len(calls) == 4
    assert t.stats.retries == 3 and t.stats.requests == 1


def test_never_earlier_than_retry_after_or_t() -> None:
    mock, _ = scripted((429, {"retry-after": "7"}), (503, {"ratelimit": '"x";r=0;t=3'}), 200)
    c, _, sleeps = client(mock, RetryPolicy(attempts=5, base=0.1, retry_after_jitter=0))
    assert c.get("/").status_code == 200
    assert sleeps == [7.0, 3.0]


def test_jitter_on_top_of_retry_after_is_bounded() -> None:
    statuses = [(429, {"retry-after": "7"}), (429, {"retry-after": "30"}), (503, {"ratelimit": '"x";r=0;t=3'}), 200]
    mock, _ = scripted(*statuses)
    c, _, sleeps = client(mock, RetryPolicy(attempts=5, base=0.1))  # uniform=top: the largest jitter
    assert c.get("/").status_code == 200
    assert sleeps == pytest.approx([7.7, 31.0, 3.3])  # 10 % of the delay, at most 1 s
    mock, _ = scripted(*statuses)
    sleeps.clear()
    t = RetryTransport(mock, RetryPolicy(attempts=5, base=0.1), uniform=lambda a, b: a, sleep=sleeps.append)
    assert httpx.Client(transport=t, base_url="http://svc").get("/").status_code == 200
    assert sleeps == [7.0, 30.0, 3.0]  # the smallest jitter: never earlier than told


def test_clients_told_the_same_retry_after_do_not_come_back_together() -> None:
    import random

    rng = random.Random(3)
    returns = []
    for _ in range(200):
        mock, _ = scripted((429, {"retry-after": "20"}), 200)
        t = RetryTransport(mock, RetryPolicy(), uniform=rng.uniform, sleep=returns.append)
        httpx.Client(transport=t, base_url="http://svc").get("/")
    assert min(returns) >= 20.0 and max(returns) <= 21.0
    assert max(Counter(int(r * 10) for r in returns).values()) <= 40  # over ten 100 ms bins, not all in one


def test_the_deadline_gate_counts_the_jitter() -> None:
    clock = ManualClock(0.0)
    mock, calls = scripted((503, {"retry-after": "8"}), 200)
    c, t, sleeps = client(mock, RetryPolicy(deadline=8.5), clock=clock)  # 8 s fits, 8 + 0.8 s does not
    assert c.get("/").status_code == 503 and sleeps == [] and len(calls) == 1
    assert t.stats.skipped_deadline == 1


def test_http_date_retry_after() -> None:
    mock, _ = scripted((503, {"retry-after": "Sun, 06 Nov 1994 08:49:47 GMT"}), 200)
    c, _, sleeps = client(mock, RetryPolicy(base=0.01, retry_after_jitter=0), wall_clock=lambda: 784111777.0)
    assert c.get("/").status_code == 200 and sleeps == [10.0]


def test_malformed_retry_after_falls_back_to_backoff() -> None:
    mock, _ = scripted((429, {"retry-after": "1.5"}), (429, {"retry-after": "soon"}), 200)
    c, _, sleeps = client(mock, RetryPolicy(base=0.1))
    assert c.get("/").status_code == 200 and sleeps == [0.1, 0.2]


def test_non_retryable_statuses_and_methods() -> None:
    mock, calls = scripted(404)
    c, _, sleeps = client(mock)
    assert c.get("/").status_code == 404 and sleeps == [] and len(calls) == 1
    mock, calls = scripted(503, 200)
    c, _, sleeps = client(mock)
    assert c.post("/", content=b"x").status_code == 503 and len(calls) == 1  # POST is not idempotent
    mock, calls = scripted(503, 200)
    c, _, sleeps = client(mock)
    assert c.post("/", content=b"x", headers={"Idempotency-Key": "k1"}).status_code == 200
    assert calls[1].content == b"x"


def test_connection_failures_are_retried_and_finally_raised() -> None:
    mock, _ = scripted(httpx.ConnectError("dns"), httpx.ReadTimeout("slow"), 200)
    c, _, sleeps = client(mock, RetryPolicy(base=0.1))
    assert c.get("/").status_code == 200 and len(sleeps) == 2
    mock, _ = scripted(*[httpx.ConnectError("down")] * 3)
    c, t, _ = client(mock, RetryPolicy(attempts=3))
    with pytest.raises(httpx.ConnectError):
        c.get("/")
    assert t.stats.exhausted == 1


def test_deadline_gate_skips_a_retry_that_cannot_finish() -> None:
    clock = ManualClock(0.0)
    mock, calls = scripted((503, {"retry-after": "8"}), 200)
    c, t, sleeps = client(mock, RetryPolicy(deadline=5.0), clock=clock)
    assert c.get("/").status_code == 503 and sleeps == [] and len(calls) == 1
    assert t.stats.skipped_deadline == 1


def test_retry_budget_limits_retries_to_a_ratio_of_requests() -> None:
    clock = ManualClock(0.0)
    budget = RetryBudget(ratio=0.5, min_per_second=0.0, clock=clock)
    mock, _ = scripted(*([503, 200] * 2 + [503, 503] * 2))
    c, t, _ = client(mock, RetryPolicy(attempts=2, budget=budget), clock=clock)
    statuses = [c.get("/").status_code for _ in range(4)]
    # 1: 0.5 token, retry skipped; 2: 200; 3: 1.5 -> retry -> 200; 4: 1.0 -> retry -> 503 again, attempts spent
    assert statuses == [503, 200, 200, 503]
    assert (t.stats.skipped_budget, t.stats.retries, t.stats.requests) == (1, 2, 4)


def test_budget_floor_allows_retries_per_second() -> None:
    clock = ManualClock(0.0)
    b = RetryBudget(ratio=0.0, min_per_second=1.0, clock=clock)
    assert b.try_withdraw() and not b.try_withdraw()
    clock.advance(1.0)
    assert b.try_withdraw()


def test_policy_validation() -> None:
    with pytest.raises(ConfigError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ConfigError, match="jitter"):
        RetryPolicy(jitter="wild")
    with pytest.raises(ConfigError, match="retry_after_jitter"):
        RetryPolicy(retry_after_jitter=2)
    with pytest.raises(ConfigError, match="retry_after_jitter_cap"):
        RetryPolicy(retry_after_jitter_cap=-1)


def test_max_retry_after_gives_up_instead_of_sleeping_for_hours() -> None:
    mock, _ = scripted((503, {"retry-after": "86400"}), 200)
    c, _, sleeps = client(mock, RetryPolicy(max_retry_after=300))
    assert c.get("/").status_code == 503 and sleeps == []


@settings(max_examples=150, deadline=None)
@given(
    script=st.lists(st.tuples(st.sampled_from([429, 503, 500]), st.one_of(st.none(), st.integers(0, 50))),
                    min_size=1, max_size=6),
    u=st.floats(0, 1), cap=st.floats(0.05, 30), jitter=st.sampled_from(["full", "equal", "decorrelated"]),
)  # fmt: skip
def test_sleeps_are_never_before_retry_after_and_within_cap_otherwise(script, u, cap, jitter) -> None:
    outcomes = [(s, {"retry-after": str(ra)} if ra is not None else {}) for s, ra in script] + [200]
    mock, _ = scripted(*outcomes)
    sleeps = []
    policy = RetryPolicy(attempts=len(outcomes), base=0.05, cap=cap, jitter=jitter)
    t = RetryTransport(mock, policy, uniform=lambda a, b: a + (b - a) * u, sleep=sleeps.append)
    httpx.Client(transport=t, base_url="http://svc").get("/")
    for (_, ra), slept in zip(script, sleeps, strict=True):
        if ra is not None:
            assert slept >= ra
            assert slept <= max(ra + min(1.0, ra / 10), cap)
        else:
            assert 0.0 <= slept <= cap


def test_async_transport_with_mock() -> None:
    calls = []

    async def handler(request):
        calls.append(1)
        return httpx.Response(200 if len(calls) == 3 else 429, headers={"retry-after": "2"})

    sleeps = []

    async def sleep(s):
        sleeps.append(s)

    async def go():
        t = AsyncRetryTransport(httpx.MockTransport(handler), RetryPolicy(base=0.01), sleep=sleep)
        async with httpx.AsyncClient(transport=t, base_url="http://svc") as c:
            return (await c.get("/")).status_code

    assert asyncio.run(go()) == 200 and len(sleeps) == 2 and all(2.0 <= s <= 2.2 for s in sleeps)


@pytest.mark.integration
def test_a_herd_of_helper_clients_drains_through_a_real_gate(serve) -> None:
    async def hello(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(AdmitGate, rate=100, settings=Settings(burst=10, max_pacing_delay=1.0))

    async def herd(base: str, n: int) -> tuple[list[int], list]:
        transports = [AsyncRetryTransport(httpx.AsyncHTTPTransport(), RetryPolicy(attempts=10, base=0.05, cap=2.0))
                      for _ in range(n)]  # fmt: skip
        clients = [httpx.AsyncClient(transport=t, base_url=base, timeout=30) for t in transports]
        try:
            responses = await asyncio.gather(*(c.get("/") for c in clients))
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        return [r.status_code for r in responses], [t.stats for t in transports]

    with serve(app, timeout_keep_alive=30) as base:
        statuses, stats = asyncio.run(herd(base, 300))
    assert statuses == [200] * 300
    waited = [s for st_ in stats for s in st_.sleeps]
    assert waited and min(waited) >= 1.0  # every retry slept at least the server's Retry-After


def test_without_httpx_the_import_error_names_the_extra() -> None:
    code = ("import sys\nsys.modules['httpx'] = None  # as if httpx were not installed\n"
            "try:\n    import admitgate.client\nexcept ImportError as exc:\n    print(exc)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "admitgate.client needs httpx: pip install 'admitgate[client]'"


class HeldCloseRelay:
    """A TCP relay to a local server that holds back the server's close until the client sends again.

    On a real network a server's FIN takes a while to reach the client. A client that reuses its idle
    keep-alive connection inside that window sends a request the server will never read, and gets
    "Server disconnected without sending a response" (the idle keep-alive race). The relay makes the
    window as long as the test needs: ``server_closed`` is set when the server closes a connection, and
    the client learns of the close only when its next request arrives (which is then lost).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server_closed = asyncio.Event()
        self.lost = 0  # requests sent on a connection the server had already closed

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        closed = asyncio.Event()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                client_w.write(data)
                await client_w.drain()
            closed.set()
            self.server_closed.set()

        down = asyncio.create_task(downstream())
        try:
            while data := await client_r.read(65536):
                if closed.is_set():
                    self.lost += 1
                    break
                server_w.write(data)
                await server_w.drain()
        finally:
            down.cancel()
            for writer in (client_w, server_w):
                writer.close()
            await asyncio.gather(down, client_w.wait_closed(), server_w.wait_closed(), return_exceptions=True)


async def hello(request):
    return PlainTextResponse("ok")


@pytest.mark.integration
def test_the_idle_keep_alive_race_is_retried(serve) -> None:
    async def reuse_after_the_server_closed(port: int, transport: httpx.AsyncBaseTransport) -> httpx.Response:
        relay = HeldCloseRelay(port)
        async with relay as url, httpx.AsyncClient(transport=transport, base_url=url) as c:
            assert (await c.get("/")).status_code == 200
            await asyncio.wait_for(relay.server_closed.wait(), 10)  # uvicorn closes the idle connection after 1 s
            try:
                return await c.get("/")  # on the same connection: the pool has not seen the close
            finally:
                assert relay.lost == 1

    with serve(Starlette(routes=[Route("/", hello)]), timeout_keep_alive=1) as base:
        port = int(base.rsplit(":", 1)[1])
        with pytest.raises(httpx.RemoteProtocolError):  # the race, reproduced: a bare transport fails
            asyncio.run(reuse_after_the_server_closed(port, httpx.AsyncHTTPTransport()))
        retrying = AsyncRetryTransport(httpx.AsyncHTTPTransport(), RetryPolicy(base=0.05))
        assert asyncio.run(reuse_after_the_server_closed(port, retrying)).status_code == 200
    assert retrying.stats.retries == 1


@pytest.mark.integration
def test_retries_carry_the_ticket_cookie_the_server_set(serve) -> None:
    seen: list[str | None] = []

    async def record(request):
        if request.headers.get("x-who") == "helper":
            seen.append(request.cookies.get("admitgate_rt"))
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", record)])
    app.add_middleware(AdmitGate, rate=1, settings=Settings(burst=1, max_pacing_delay=0.1, tarpit=0))

    async def go(base: str) -> tuple[httpx.Response, AsyncRetryTransport]:
        async with httpx.AsyncClient(base_url=base) as other:
            assert (await other.get("/")).status_code == 200  # takes the only token: the helper is rejected
        transport = AsyncRetryTransport(httpx.AsyncHTTPTransport(), RetryPolicy(attempts=4, base=0.05))
        async with httpx.AsyncClient(transport=transport, base_url=base, headers={"x-who": "helper"}) as c:
            return await c.get("/"), transport

    with serve(app) as base:
        response, transport = asyncio.run(go(base))
    assert response.status_code == 200 and transport.stats.retries >= 1
    assert seen and all(seen), seen  # every try that reached the app carried the ticket


def test_retried_cookies_replace_same_named_ones_and_keep_the_rest() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("cookie"))
        if len(calls) == 1:
            return httpx.Response(429, headers=[("retry-after", "1"), ("set-cookie", "t=new; Path=/"),
                                                ("set-cookie", "elsewhere=x; Path=/other")])  # fmt: skip
        return httpx.Response(200)

    sleeps = []
    t = RetryTransport(httpx.MockTransport(handler), RetryPolicy(), uniform=top, sleep=sleeps.append)
    c = httpx.Client(transport=t, base_url="http://svc", cookies={"t": "old", "session": "s1"})
    assert c.get("/").status_code == 200
    sent = [sorted(header.split("; ")) for header in calls]
    assert sent == [["session=s1", "t=old"], ["session=s1", "t=new"]]  # /other's cookie is not for /


@pytest.mark.integration
@pytest.mark.parametrize("value", [b"\xb3", "٣".encode(), b"\xff\xfe", b"1.5", b"-1", b"Sun, 06 Nov \xb3"])
def test_a_malformed_retry_after_from_a_real_server_is_no_hint(serve, value: bytes) -> None:
    tries = []

    async def raw(scope, receive, send):  # a raw ASGI app: it can send any bytes uvicorn will pass
        if scope["type"] != "http":
            return
        tries.append(1)
        status, headers = (503, [(b"retry-after", value), (b"ratelimit", b'"a";r=0;t=' + value)]) if len(
            tries) == 1 else (200, [])  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def go(base: str) -> tuple[int, list[float]]:
        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)

        transport = AsyncRetryTransport(httpx.AsyncHTTPTransport(), RetryPolicy(base=0.05), sleep=sleep)
        async with httpx.AsyncClient(transport=transport, base_url=base) as c:
            return (await c.get("/")).status_code, sleeps

    with serve(raw) as base:
        status, sleeps = asyncio.run(go(base))
    assert status == 200 and len(sleeps) == 1 and sleeps[0] <= 0.05  # the backoff, not a parsed hint


async def burst_through_one_transport(base: str, budget: RetryBudget | None, callers: int = 300):
    """``callers`` GETs at once through one AsyncRetryTransport on the README's policy; (responses, stats, seconds)."""
    policy = RetryPolicy(attempts=5, base=0.1, cap=20, jitter="full", deadline=30, budget=budget)
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=callers))  # nobody queues client-side
    transport = AsyncRetryTransport(inner, policy)
    started = time.monotonic()
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=30) as c:
        responses = await asyncio.gather(*(c.get("/") for _ in range(callers)))
    return responses, transport.stats, time.monotonic() - started


@pytest.mark.integration
def test_a_retry_budget_hands_most_of_a_burst_its_429(serve) -> None:
    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(AdmitGate, rate=50, settings=Settings(burst=5, max_pacing_delay=1.0))
    with serve(app, timeout_keep_alive=30) as base:
        unbudgeted, _, _ = asyncio.run(burst_through_one_transport(base, None))
    with serve(app, timeout_keep_alive=30) as base:
        budget = RetryBudget(ratio=0.2)  # 0.2 a request, banked up to 0.2 × 100 = 20, plus 1 a second
        responses, stats, seconds = asyncio.run(burst_through_one_transport(base, budget))
    assert Counter(r.status_code for r in unbudgeted) == {200: 300}  # every caller got through, by retrying
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {200, 429} and statuses[429] >= 50  # the rest got the gate's answer back
    assert stats.skipped_budget == statuses[429] and stats.retries <= 20 + 1 + math.ceil(seconds)
    assert all(int(r.headers["retry-after"]) >= 1 for r in responses if r.status_code == 429)


@settings(max_examples=200, deadline=None)
@given(retry_after=st.binary(max_size=40), ratelimit=st.binary(max_size=40), cookie=st.binary(max_size=80))
def test_any_header_bytes_are_never_an_exception_out_of_the_transport(retry_after, ratelimit, cookie) -> None:
    headers = [(b"retry-after", retry_after), (b"ratelimit", ratelimit), (b"set-cookie", cookie)]
    mock, _ = scripted((429, headers), 200)
    c, _, _ = client(mock, RetryPolicy(max_retry_after=1e9))
    assert c.get("/").status_code in (200, 429)
