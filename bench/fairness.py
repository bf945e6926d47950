"""Fair share under overload, against a real uvicorn on loopback: admitted requests/s per tenant.

    python bench/fairness.py [--rate 100] [--seconds 12] [--warmup 4] [--scenarios abuse,abuse-single,weights,...]

Scenarios (the server's capacity is a fixed ``--rate`` H; tenants are told apart by ``x-api-key``). Two client
models: *open-loop* obedient tenants send new requests at a fixed rate, each from a client of its own told apart by
a header it declares; *closed-loop* ones (``workers-*``) are worker pools, as an API customer's SDK is: a few
keep-alive connections, each asking again ``THINK`` (120 ms) after each answer and sleeping the Retry-After after a
429, told apart by the gate's default identity (the connection and the ticket):

* ``abuse``: one abusive tenant (20 connections, each retrying every 100 ms, ignoring Retry-After) and 5
  obedient tenants, each sending new requests at twice H/6 whose clients obey Retry-After; tenants on;
* ``workers-2``, ``workers-4``, ``workers-16``: the same abusive tenant beside 5 obedient tenants whose clients are
  worker pools of 2, 4 or 16 connections (up to 1, 2 or 8 times H/6 each), the default identity, ``burst=10``;
* ``weights-workers``: three tenants weighted 3:1:1, each a worker pool of 16 connections (8 times H/6 each);
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
runs ``--seconds`` (at most 60) and counts 200s after ``--warmup``, and, for the contended scenarios, each
tenant's rate as a share of its weighted share of H (``share_of_fair``) over that span and over seconds 3-10
(``share_of_fair_3_10``). The server runs in a child process (pinned to core 0, the load to core 1 when there
are two). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
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

SCENARIOS = ("abuse", "abuse-single", "weights", "lone", "workers-2", "workers-4", "workers-16", "weights-workers",
             "abuse-slowapi", "weights-slowapi", "lone-slowapi")  # fmt: skip
SLOWAPI = "-slowapi"
WORKERS = "workers"
THINK = 0.12  # seconds a worker waits after an answer before it asks again
EARLY = (3, 10)  # the seconds the first window of a closed-loop scenario spans


def limits(scenario: str, rate: float) -> dict[str, int]:
    """slowapi's per-key limits (requests per second, ``*`` for any other key): each tenant's share of ``rate``."""
    if scenario.startswith("weights"):
        return {"gold": int(3 * rate / 5), "*": int(rate / 5)}
    return {"*": int(rate / 6)}


def app(rate: float, tenants: bool, weights: dict[str, float], workers: bool = False):  # type: ignore[no-untyped-def]
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from admitgate import AdmitGate, Identity, Settings, Tenancy

    async def hello(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("Hello, world!")

    tenancy = Tenancy(key="header:x-api-key", weights=weights) if tenants else None
    star = Starlette(routes=[Route("/", hello)])
    if workers:  # as a new user would: the default identity (the connection and the ticket)
        star.add_middleware(AdmitGate, rate=rate, settings=Settings(burst=10), tenants=tenancy)
    else:
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


def serve(port: int, rate: float, tenants: bool, weights: dict[str, float], per_key: dict[str, int],
          workers: bool) -> None:  # fmt: skip
    import uvicorn

    pin(0)
    served = slowapi_app(per_key) if per_key else app(rate, tenants, weights, workers)
    uvicorn.run(served, host="127.0.0.1", port=port, log_level="warning", access_log=False)


Counts = Counter[tuple[str, int]]  # (tenant, whole second since the start) -> 200s


async def ask(client: Http1Client, tenant: str, ok: Counts, start: float) -> tuple[int, int | None]:
    """One request; a 200 counts for its tenant in the second it was answered."""
    status, retry_after = await client.get("/")
    if status == 200:
        ok[tenant, int(time.monotonic() - start)] += 1
    return status, retry_after


async def abusive(port: int, tenant: str, worker: int, until: float, ok: Counts, start: float) -> None:
    """A connection that asks again 100 ms after each 429 (and at once after a 200), ignoring Retry-After."""
    client = Http1Client(HOST, port, cookies=False, headers={"x-api-key": tenant, "x-client": f"{tenant}-{worker}"})
    try:
        while time.monotonic() < until:
            if (await ask(client, tenant, ok, start))[0] != 200:
                await asyncio.sleep(0.1)
    finally:
        client.close()


async def worker(port: int, tenant: str, until: float, ok: Counts, start: float) -> None:
    """One worker of a pool (closed loop): asks again ``THINK`` after each answer, the Retry-After after a 429,
    on one keep-alive connection that keeps the gate's ticket."""
    client = Http1Client(HOST, port, headers={"x-api-key": tenant})
    try:
        while time.monotonic() < until:
            status, retry_after = await ask(client, tenant, ok, start)
            await asyncio.sleep(THINK if status == 200 else retry_after or 1)
    finally:
        client.close()


async def obedient(port: int, tenant: str, rate: float, until: float, ok: Counts, start: float) -> None:
    """New requests at ``rate``/s, each from a client of its own (on its own connection) that sleeps
    Retry-After and asks again."""
    ids = itertools.count()

    async def one(cid: int) -> None:
        client = Http1Client(HOST, port, cookies=False, headers={"x-api-key": tenant, "x-client": f"{tenant}-{cid}"})
        try:
            while time.monotonic() < until:
                status, retry_after = await ask(client, tenant, ok, start)
                if status == 200:
                    return
                await asyncio.sleep(retry_after or 1)
        finally:
            client.close()

    tasks = set()
    began = time.monotonic()
    for k in itertools.count():
        at = began + k / rate
        if at >= until:
            break
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        task = asyncio.create_task(one(next(ids)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()


async def load(port: int, scenario: str, rate: float, seconds: float) -> Counts:
    """Run ``scenario``'s clients for ``seconds``; their 200s by tenant and second."""
    start = time.monotonic()
    until = start + seconds
    ok: Counts = Counter()
    jobs = []
    if scenario == "weights-workers":
        jobs += [worker(port, t, until, ok, start) for t in ("gold", "x", "y") for _ in range(16)]
    elif scenario.startswith(WORKERS):
        connections = int(scenario.rsplit("-", 1)[1])
        jobs += [abusive(port, "abuser", w, until, ok, start) for w in range(20)]
        jobs += [worker(port, f"obedient-{i}", until, ok, start) for i in range(5) for _ in range(connections)]
    elif scenario.startswith("abuse"):
        jobs += [abusive(port, "abuser", w, until, ok, start) for w in range(20)]
        jobs += [obedient(port, f"obedient-{i}", 2 * rate / 6, until, ok, start) for i in range(5)]
    elif scenario.startswith("weights"):
        jobs += [abusive(port, t, w, until, ok, start) for t in ("gold", "x", "y") for w in range(10)]
    else:
        jobs += [abusive(port, "alone", w, until, ok, start) for w in range(20)]
    await asyncio.gather(*jobs, return_exceptions=True)
    return ok


def rates(ok: Counts, first: int, end: int) -> dict[str, float]:
    """Each tenant's 200s per second over the whole seconds [first, end)."""
    tenants = sorted({tenant for tenant, _ in ok})
    return {t: sum(ok[t, s] for s in range(first, end)) / max(1, end - first) for t in tenants}


def fair(scenario: str, rate: float, tenant: str) -> float | None:
    """``tenant``'s weighted share of ``rate`` in a contended scenario (None for a lone tenant)."""
    if scenario.startswith("lone"):
        return None
    if scenario.startswith("weights"):
        return rate * (3 if tenant == "gold" else 1) / 5
    return rate / 6


def run(scenario: str, rate: float, seconds: float, warmup: float) -> dict[str, object]:
    port = free_port()
    tenants = scenario != "abuse-single"
    weights = {"gold": 3.0} if scenario in ("weights", "weights-workers") else {}
    per_key = limits(scenario, rate) if scenario.endswith(SLOWAPI) else {}
    workers = WORKERS in scenario
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--rate", str(rate),
                              "--tenants", "1" if tenants else "0", "--weights", json.dumps(weights),
                              "--limits", json.dumps(per_key), "--workers", "1" if workers else "0"])  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        pin(1)
        ok = asyncio.run(load(port, scenario, rate, seconds))
    finally:
        child.terminate()
        child.wait(10)
    admitted = rates(ok, math.ceil(warmup), int(seconds))
    out: dict[str, object] = {"admitted_per_s": {k: round(v, 1) for k, v in admitted.items()}}
    out["share_of_H"] = {k: round(v / rate, 3) for k, v in admitted.items()}
    out["total_share_of_H"] = round(sum(admitted.values()) / rate, 3)
    if not scenario.startswith("lone"):
        out["share_of_fair"] = {k: round(v / (fair(scenario, rate, k) or 1), 3) for k, v in admitted.items()}
        if seconds >= EARLY[1]:
            early = rates(ok, *EARLY)
            out["share_of_fair_3_10"] = {k: round(v / (fair(scenario, rate, k) or 1), 3) for k, v in early.items()}
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
    parser.add_argument("--workers", default="0", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.rate, args.tenants == "1", json.loads(args.weights), json.loads(args.limits),
              args.workers == "1")  # fmt: skip
        return
    if not 0 < args.warmup < args.seconds <= 60:
        parser.error("need 0 < --warmup < --seconds <= 60")
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario {sorted(unknown)[0]!r}; known: {', '.join(SCENARIOS)}")
    results = {s: run(s, args.rate, args.seconds, args.warmup) for s in scenarios}
    print(json.dumps({"rate": args.rate, "seconds": args.seconds, "warmup": args.warmup, **results}, indent=1))


if __name__ == "__main__":
    main()
