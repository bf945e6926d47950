"""The cost of a per-route quota per request, beside slowapi's and fastapi-limiter's, in one run: in memory and
with Redis.

    python bench/quota_cost.py [--rounds 9] [--requests 4000] [--keys 1000] [--in-flight 1 32] [--json]

Every variant is the same FastAPI app, one ``GET /items`` route whose endpoint takes the ``Request`` (slowapi
needs it), driven in-process (no sockets: ASGI calls on one event loop, ``--in-flight`` at a time: 1, one
after another, and 32 at once, where a client that blocks the loop holds up the others) with the client address
rotating over ``--keys`` addresses. The route's limit is per client address and never reached
(10⁹ a minute: the allowed path, which is what nearly every request takes):

* ``bare``: no limiter;
* ``admitgate-gate``: ``AdmitGate`` alone at a rate that never binds (what the quota path is added to);
* ``admitgate``: the same with ``Depends(Quota("1000000000/minute", key="address"))`` on the route;
* ``admitgate-limited``: the same quota declared with ``@limited(...)`` instead (no FastAPI dependency to solve);
* ``slowapi``: ``@limiter.limit("1000000000/minute")`` with ``Limiter(key_func=get_remote_address)``;
* ``fastapi-limiter``: ``Depends(RateLimiter(limiter=Limiter(Rate(10⁹, Duration.MINUTE))))`` (pyrate-limiter);

each in memory and, with a throwaway ``redis-server`` on a free loopback port, with Redis: admitgate's
``backend="redis://..."`` (the quota counted in Redis, one script call per request), slowapi's
``storage_uri="redis://..."`` (the ``limits`` package's synchronous client, as slowapi uses it) and
fastapi-limiter's ``RedisBucket`` on an asyncio client. Rounds interleave the variants in a shuffled order;
reported are the medians over rounds of µs per request and of the cost added over ``bare`` in the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fastapi import Depends, FastAPI, Request  # noqa: E402

from admitgate import AdmitGate, Identity, Quota, Settings, limited  # noqa: E402
from lab.redis import wait_for_redis  # noqa: E402
from lab.serving import free_port  # noqa: E402

LIMIT = 1_000_000_000  # a minute: never reached, so every request takes the allowed path
REQUEST = {"type": "http.request", "body": b"", "more_body": False}


def scope(address: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": "/items", "raw_path": b"/items", "query_string": b"", "root_path": "",
            "client": (address, 50000), "server": ("127.0.0.1", 8000),
            "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"b")]}  # fmt: skip


def fastapi(dependencies: list[Any] | None = None, decorate: Callable[[Any], Any] | None = None) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    async def items(request: Request) -> dict[str, bool]:
        return {"ok": True}

    app.get("/items", dependencies=dependencies or [])(decorate(items) if decorate else items)
    return app


def bare() -> FastAPI:
    return fastapi()


def admitgate(redis_url: str | None, quota: str = "") -> FastAPI:
    """The app behind AdmitGate; ``quota``: ``"depends"``, ``"limited"`` or ``""`` (none)."""
    limit = Quota(f"{LIMIT}/minute", key="address")
    app = fastapi([Depends(limit)] if quota == "depends" else None, limited(limit) if quota == "limited" else None)
    app.add_middleware(AdmitGate, rate=1e9, settings=Settings(burst=1e9), identity=Identity(ticket=False),
                       backend=redis_url)  # fmt: skip
    return app


def slowapi(redis_url: str | None) -> FastAPI:
    from slowapi import Limiter
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, storage_uri=redis_url or "memory://")
    app = fastapi(decorate=limiter.limit(f"{LIMIT}/minute"))
    app.state.limiter = limiter
    return app


async def fastapi_limiter(redis_url: str | None) -> FastAPI:
    from fastapi_limiter.depends import RateLimiter
    from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

    rates = [Rate(LIMIT, Duration.MINUTE)]
    if redis_url is None:
        limiter = Limiter(rates)
    else:
        from redis.asyncio import Redis

        limiter = Limiter(await RedisBucket.init(rates, Redis.from_url(redis_url), "bench-quota"))
    return fastapi([Depends(RateLimiter(limiter=limiter))])


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port (no persistence); its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench/quota_cost.py needs redis-server (apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", tmp], stdout=subprocess.DEVNULL)  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        try:
            wait_for_redis(url)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


async def time_app(app: Any, n: int, addresses: list[str], in_flight: int = 1) -> float:
    """µs per request over ``n`` requests, ``in_flight`` at a time, each answered 200 (anything else fails the
    run)."""
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return REQUEST

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scopes = [scope(addresses[i % len(addresses)]) for i in range(n)]
    start = time.perf_counter()
    if in_flight == 1:
        for item in scopes:
            await app(dict(item), receive, send)
    else:
        for at in range(0, n, in_flight):
            await asyncio.gather(*(app(dict(item), receive, send) for item in scopes[at : at + in_flight]))
    elapsed = time.perf_counter() - start
    if set(statuses) != {200}:
        raise SystemExit(f"a variant answered {sorted(set(statuses))}: the bench measures the allowed path")
    return elapsed / n * 1e6


async def measure(redis_url: str, rounds: int, n: int, keys: int, in_flight: int) -> dict[str, Any]:
    addresses = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(keys)]
    variants = {
        "bare": bare(),
        "admitgate-gate": admitgate(None),
        "admitgate": admitgate(None, "depends"),
        "admitgate-limited": admitgate(None, "limited"),
        "slowapi": slowapi(None),
        "fastapi-limiter": await fastapi_limiter(None),
        "admitgate-gate+redis": admitgate(redis_url),
        "admitgate+redis": admitgate(redis_url, "depends"),
        "admitgate-limited+redis": admitgate(redis_url, "limited"),
        "slowapi+redis": slowapi(redis_url),
        "fastapi-limiter+redis": await fastapi_limiter(redis_url),
    }
    for app in variants.values():  # warm: the middleware stack built, connections open, code paths hot
        await time_app(app, 500, addresses, in_flight)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            samples[name].append(await time_app(variants[name], n, addresses, in_flight))
    us = {name: round(statistics.median(values), 2) for name, values in samples.items()}
    added = {name: round(statistics.median(v - b for v, b in zip(values, samples["bare"], strict=True)), 2)
             for name, values in samples.items() if name != "bare"}  # fmt: skip
    quota_path = {
        f"{how}{where}": round(statistics.median(q - g for q, g in zip(
            samples[f"admitgate{how}{where}"], samples[f"admitgate-gate{where}"], strict=True)), 2)
        for how in ("", "-limited") for where in ("", "+redis")
    }  # fmt: skip
    return {"in_flight": in_flight, "rounds": rounds, "requests_per_round": n, "keys": keys,
            "us_per_request_median": us, "added_over_bare_us_median": added,
            "admitgate_quota_path_us_median": quota_path}  # fmt: skip


def main(rounds: int, n: int, keys: int, in_flight: list[int]) -> list[dict[str, Any]]:
    with redis_server() as url:
        return [asyncio.run(measure(url, rounds, n, keys, k)) for k in in_flight]


def report(out: dict[str, Any]) -> str:
    lines = [f"{out['requests_per_round']} requests a round over {out['keys']} client addresses, "
             f"{out['in_flight']} in flight, medians of {out['rounds']} interleaved rounds (in-process)",
             f"{'variant':24s}{'µs/request':>12s}{'added over bare':>18s}"]  # fmt: skip
    for name, us in out["us_per_request_median"].items():
        added = out["added_over_bare_us_median"].get(name)
        lines.append(f"{name:24s}{us:12.2f}{'' if added is None else f'{added:18.2f}'}")
    q = out["admitgate_quota_path_us_median"]
    lines.append(
        f"admitgate's quota path alone (over admitgate-gate), µs: Depends {q['']} in memory, "
        f"{q['+redis']} with Redis; @limited {q['-limited']} in memory, {q['-limited+redis']} with Redis"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=4000, help="requests per variant per round")
    parser.add_argument("--keys", type=int, default=1000, help="client addresses the requests rotate over")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 32], help="requests at once, per run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = main(args.rounds, args.requests, args.keys, args.in_flight)
    print(json.dumps(results, indent=2) if args.json else "\n\n".join(map(report, results)))
