"""Fair share under overload, against a real uvicorn on loopback: admitted requests/s per tenant.

    python bench/fairness.py [--rate 100] [--seconds 12] [--warmup 4] [--scenarios abuse,abuse-single,weights,...]

Scenarios (the server's capacity is a fixed ``--rate`` H; tenants are told apart by ``x-api-key``):

* ``abuse``: one abusive tenant (20 connections, each retrying every 100 ms, ignoring Retry-After) and 5
  obedient tenants, each sending new requests at twice H/6 whose clients obey Retry-After; tenants on;
* ``abuse-single``: the same traffic against the single pool (no tenants), for comparison;
* ``weights``: three tenants weighted 3:1:1, each with 10 connections retrying every 100 ms;
* ``lone``: one tenant with 20 connections retrying every 100 ms: what share of H it is admitted;
* ``abuse-slowapi``, ``weights-slowapi``, ``lone-slowapi``: the same traffic against the same app behind slowapi
  instead, with the per-key limits a slowapi user types in so that each tenant gets its share of H at full load
  (``x-api-key`` as slowapi's key; per second, its default fixed window; Retry-After sent): H/6 per key for
  ``abuse`` and ``lone`` (one deployment, six tenants), 3H/5, H/5 and H/5 for ``weights``. slowapi counts each
  key against a limit typed in: it shares no live H and gives a tenant alone no more than its limit.

Every client is a lean HTTP/1.1 client on a connection of its own (lab/http1.py), so the load
generator is not the bottleneck (with httpx it was: the server saw about half the demand). Each scenario
runs ``--seconds`` (at most 20) and counts 200s after ``--warmup``. The server runs in a child process
(pinned to core 0, the load to core 1 when there are two). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from lab.http1 import Http1Client  # noqa: E402
from lab.serving import free_port, pin  # noqa: E402

HOST = "127.0.0.1"

SCENARIOS = ("abuse", "abuse-single", "weights", "lone", "abuse-slowapi", "weights-slowapi", "lone-slowapi")
SLOWAPI = "-slowapi"


def limits(scenario: str, rate: float) -> dict[str, int]:
    """slowapi's per-key limits (requests per second, ``*`` for any other key): each tenant's share of ``rate``."""
    if scenario.startswith("weights"):
        return {"gold": int(3 * rate / 5), "*": int(rate / 5)}
    return {"*": int(rate / 6)}


def app(rate: float, tenants: bool, weights: dict[str, float]):  # type: ignore[no-untyped-def]
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from admitgate import AdmitGate, Identity, Settings, Tenancy

    async def hello(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("Hello, world!")

    tenancy = Tenancy(key="header:x-api-key", weights=weights) if tenants else None
    star = Starlette(routes=[Route("/", hello)])
    star.add_middleware(AdmitGate, rate=rate, settings=Settings(), tenants=tenancy,
                        identity=Identity(key="header:x-client", ticket=False))  # fmt: skip
    return star


def slowapi_app(per_key: dict[str, int]):  # type: ignore[no-untyped-def]
    """The same hello-world app behind slowapi (its pure-ASGI middleware), each ``x-api-key`` held to its limit."""
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware
    from slowapi_demo import tenant_key  # (beside this file: the herd benchmarks' slowapi, keyed alike)
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    def limit(key: str) -> str:
        return f"{per_key.get(key, per_key['*'])}/second"

    limiter = Limiter(key_func=tenant_key, headers_enabled=True)

    @limiter.limit(limit)
    async def hello(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("Hello, world!")

    star = Starlette(routes=[Route("/", hello)])
    star.state.limiter = limiter
    star.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    star.add_middleware(SlowAPIASGIMiddleware)
    return star


def serve(port: int, rate: float, tenants: bool, weights: dict[str, float], per_key: dict[str, int]) -> None:
    import uvicorn

    pin(0)
    served = slowapi_app(per_key) if per_key else app(rate, tenants, weights)
    uvicorn.run(served, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def ask(client: Http1Client, tenant: str, ok: Counter[str], warm: float) -> tuple[int, int | None]:
    """One request; a 200 after the warm-up counts for its tenant."""
    status, retry_after = await client.get("/")
    if status == 200 and time.monotonic() >= warm:
        ok[tenant] += 1
    return status, retry_after


async def abusive(port: int, tenant: str, worker: int, until: float, ok: Counter[str], warm: float) -> None:
    """A connection that asks again 100 ms after each 429 (and at once after a 200), ignoring Retry-After."""
    client = Http1Client(HOST, port, cookies=False, headers={"x-api-key": tenant, "x-client": f"{tenant}-{worker}"})
    try:
        while time.monotonic() < until:
            if (await ask(client, tenant, ok, warm))[0] != 200:
                await asyncio.sleep(0.1)
    finally:
        client.close()


async def obedient(port: int, tenant: str, rate: float, until: float, ok: Counter[str], warm: float) -> None:
    """New requests at ``rate``/s, each from a client of its own (on its own connection) that sleeps
    Retry-After and asks again."""
    ids = itertools.count()

    async def one(cid: int) -> None:
        client = Http1Client(HOST, port, cookies=False, headers={"x-api-key": tenant, "x-client": f"{tenant}-{cid}"})
        try:
            while time.monotonic() < until:
                status, retry_after = await ask(client, tenant, ok, warm)
                if status == 200:
                    return
                await asyncio.sleep(retry_after or 1)
        finally:
            client.close()

    tasks = set()
    start = time.monotonic()
    for k in itertools.count():
        at = start + k / rate
        if at >= until:
            break
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        task = asyncio.create_task(one(next(ids)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()


async def load(port: int, scenario: str, rate: float, seconds: float, warmup: float) -> dict[str, float]:
    now = time.monotonic()
    until, warm = now + seconds, now + warmup
    ok: Counter[str] = Counter()
    jobs = []
    if scenario.startswith("abuse"):
        jobs += [abusive(port, "abuser", w, until, ok, warm) for w in range(20)]
        jobs += [obedient(port, f"obedient-{i}", 2 * rate / 6, until, ok, warm) for i in range(5)]
    elif scenario.startswith("weights"):
        jobs += [abusive(port, t, w, until, ok, warm) for t in ("gold", "x", "y") for w in range(10)]
    else:
        jobs += [abusive(port, "alone", w, until, ok, warm) for w in range(20)]
    await asyncio.gather(*jobs, return_exceptions=True)
    return {tenant: count / (seconds - warmup) for tenant, count in sorted(ok.items())}


def run(scenario: str, rate: float, seconds: float, warmup: float) -> dict[str, object]:
    port = free_port()
    tenants = scenario != "abuse-single"
    weights = {"gold": 3.0} if scenario == "weights" else {}
    per_key = limits(scenario, rate) if scenario.endswith(SLOWAPI) else {}
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--rate", str(rate),
                              "--tenants", "1" if tenants else "0", "--weights", json.dumps(weights),
                              "--limits", json.dumps(per_key)])  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        pin(1)
        rates = asyncio.run(load(port, scenario, rate, seconds, warmup))
    finally:
        child.terminate()
        child.wait(10)
    out: dict[str, object] = {"admitted_per_s": {k: round(v, 1) for k, v in rates.items()}}
    out["share_of_H"] = {k: round(v / rate, 3) for k, v in rates.items()}
    out["total_share_of_H"] = round(sum(rates.values()) / rate, 3)
    if per_key:
        out["slowapi_limits_per_s"] = per_key
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tenants", default="1", help=argparse.SUPPRESS)
    parser.add_argument("--weights", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--limits", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.rate, args.tenants == "1", json.loads(args.weights), json.loads(args.limits))
        return
    if not 0 < args.warmup < args.seconds <= 20:
        parser.error("need 0 < --warmup < --seconds <= 20")
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario {sorted(unknown)[0]!r}; known: {', '.join(SCENARIOS)}")
    results = {s: run(s, args.rate, args.seconds, args.warmup) for s in scenarios}
    print(json.dumps({"rate": args.rate, "seconds": args.seconds, "warmup": args.warmup, **results}, indent=1))


if __name__ == "__main__":
    main()
