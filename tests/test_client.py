"""The retrying transports: MockTransport units, properties, and a helper-equipped herd through a real gate."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ConfigError, ManualClock
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
    c, _, sleeps = client(mock, RetryPolicy(attempts=5, base=0.1))
    assert c.get("/").status_code == 200
    assert sleeps == [7.0, 3.0]


def test_http_date_retry_after() -> None:
    mock, _ = scripted((503, {"retry-after": "Sun, 06 Nov 1994 08:49:47 GMT"}), 200)
    c, _, sleeps = client(mock, RetryPolicy(base=0.01), wall_clock=lambda: 784111777.0)
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
            assert slept <= max(ra, cap)
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

    assert asyncio.run(go()) == 200 and sleeps == [2.0, 2.0]


@pytest.mark.server
def test_a_herd_of_helper_clients_drains_through_a_real_gate(serve) -> None:
    async def hello(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(AdmitGate, rate=100, burst=10, max_pacing_delay=1.0)

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
