"""The client documentation's first example, copied as it is, gets every call through a gate; the transport's
stats stay bounded however many retries it makes."""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections import Counter
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, Settings
from admitgate.client import RetryPolicy, RetryTransport
from admitgate.client.transport import SLEEP_BOUNDS, SLEEPS_KEPT

DOC = Path(__file__).resolve().parent.parent / "docs" / "client.md"


def first_example() -> str:
    """The first Python block of docs/client.md."""
    block = re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert block is not None
    return block.group(1)


async def hello(request):
    return PlainTextResponse("hi")


def test_the_first_example_copied_as_is_gets_sixty_simultaneous_calls_through_a_gate(serve) -> None:
    example = first_example()
    assert "RetryBudget" not in example and "https://api.example/items" in example
    code = "async def one_call():\n" + textwrap.indent(example, "    ") + "    return response\n"
    app = Starlette(routes=[Route("/items", hello)])
    app.add_middleware(AdmitGate, rate=20, settings=Settings(burst=5))
    with serve(app) as base:
        namespace: dict = {}
        exec(compile(code.replace("https://api.example", base), str(DOC), "exec"), namespace)

        async def sixty() -> list[httpx.Response]:
            return await asyncio.gather(*(namespace["one_call"]() for _ in range(60)))

        responses = asyncio.run(sixty())
    assert Counter(r.status_code for r in responses) == {200: 60}


def test_the_stats_of_a_long_lived_transport_stay_bounded() -> None:
    delays = [1, 3, 7, 120]  # whole seconds: the Retry-After each 429 carries, in turn
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls % 2:
            return httpx.Response(429, headers={"retry-after": str(delays[(calls // 2) % len(delays)])})
        return httpx.Response(200)

    policy = RetryPolicy(attempts=2, base=0.05, cap=0.05, retry_after_jitter=0, max_retry_after=1e6)
    transport = RetryTransport(httpx.MockTransport(handler), policy, sleep=lambda seconds: None)
    with httpx.Client(transport=transport, base_url="http://svc") as client:
        for _ in range(5_000):
            assert client.get("/").status_code == 200
    stats = transport.stats
    assert stats.retries == 5_000 and stats.slept == 1_250 * sum(delays)
    assert len(stats.sleeps) == SLEEPS_KEPT and list(stats.sleeps)[-4:] == [1, 3, 7, 120]  # the latest, in order
    buckets = {
        SLEEP_BOUNDS.index(1.0): 1_250,
        SLEEP_BOUNDS.index(5.0): 1_250,
        SLEEP_BOUNDS.index(10.0): 1_250,
        len(SLEEP_BOUNDS): 1_250,
    }  # 1 s, 3 s, 7 s, and 120 s (above the last bound)
    assert stats.sleep_counts == [buckets.get(i, 0) for i in range(len(SLEEP_BOUNDS) + 1)]
