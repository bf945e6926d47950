"""Hello-world apps for the overhead benchmark (uvicorn factories: ``apps:bare`` etc.)."""

from __future__ import annotations

import os
import time

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, Settings


class _Clock:
    """The gates' clock: ``time.monotonic``; with ``BENCH_CLOCK_SLOWDOWN=k``, from the first SIGUSR1 on, k times
    slower. Under callgrind (``bench/overhead.py --instructions``, which signals as it starts counting) the server runs
    about k times slower than at full speed; on a clock slowed as much, the work a gate does on a timer (a refresh, a
    reallocation) falls on as many requests as at full speed, where on the real one it would be counted k times
    over. Before the signal it keeps time, so that the warm-up is a warm-up (a tenants' table opens after seconds)."""

    def __init__(self, slowdown: float) -> None:
        self.slowdown = slowdown
        self.since: float | None = None
        if slowdown != 1.0:
            import signal

            signal.signal(signal.SIGUSR1, lambda *_: self.since is None and setattr(self, "since", time.monotonic()))

    def __call__(self) -> float:
        now, since = time.monotonic(), self.since
        return now if since is None else since + (now - since) / self.slowdown


def _clock():
    """``time.monotonic`` itself unless ``BENCH_CLOCK_SLOWDOWN`` is set (see :class:`_Clock`)."""
    slowdown = float(os.environ.get("BENCH_CLOCK_SLOWDOWN", "1"))
    return time.monotonic if slowdown == 1.0 else _Clock(slowdown)


CLOCK = _clock()


async def hello(request):
    return PlainTextResponse("Hello, world!")


def _app() -> Starlette:
    return Starlette(routes=[Route("/", hello)])


class PassThrough:
    """The cheapest pure-ASGI middleware: the floor for any middleware."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)


def bare() -> Starlette:
    return _app()


def passthrough() -> Starlette:
    app = _app()
    app.add_middleware(PassThrough)
    return app


def admitgate() -> Starlette:
    app = _app()
    app.add_middleware(AdmitGate, rate=1e9, settings=Settings(burst=1e9), clock=CLOCK)  # admit path: never binding
    return app


def admitgate_tenants() -> Starlette:
    """Tenants on (keyed by x-api-key; the benchmark sends one), the static rate never binding: the tenant path
    (the table opens once its tenants have been measured asking for less than half of the capacity)."""
    from admitgate import Tenancy

    app = _app()
    app.add_middleware(AdmitGate, rate=1e9, settings=Settings(burst=1e9), tenants=Tenancy(key="header:x-api-key"),
                       clock=CLOCK)  # fmt: skip
    return app


def admitgate_tenants_closed() -> Starlette:
    """As admitgate_tenants, with the table kept closed (``open_below=0``): every request decided in its tenant's
    pool, as under contention."""
    from admitgate import Tenancy

    app = _app()
    tenancy = Tenancy(key="header:x-api-key", open_below=0.0)
    app.add_middleware(AdmitGate, rate=1e9, settings=Settings(burst=1e9), tenants=tenancy, clock=CLOCK)
    return app


def admitgate_tenants_flood() -> Starlette:
    """Tenants on (x-api-key) at a binding rate of 1,000/s, on the table's defaults: bench/tenant_keys.py."""
    from admitgate import Tenancy

    app = _app()
    app.add_middleware(AdmitGate, rate=1000.0, tenants=Tenancy(key="header:x-api-key"))
    return app


def _live(**options) -> Starlette:
    from admitgate import BandwidthDelay, LiveCapacity

    app = _app()
    live = LiveCapacity(BandwidthDelay(seed=1), initial=1e9, ceiling=1e9)  # probes on, never binding
    app.add_middleware(AdmitGate, rate=live, **options, settings=Settings(burst=1e9))
    return app


def admitgate_static_metrics() -> Starlette:
    """A static rate with Prometheus metrics (three integers per route and class, read at scrape time)."""
    from prometheus_client import CollectorRegistry

    app = _app()
    app.add_middleware(AdmitGate, rate=1e9, metrics=CollectorRegistry(), settings=Settings(burst=1e9))
    return app


def admitgate_live() -> Starlette:
    """Live capacity: the probes run on every request."""
    return _live()


def admitgate_metrics() -> Starlette:
    """Live capacity and Prometheus metrics (collected at scrape time)."""
    from prometheus_client import CollectorRegistry

    return _live(metrics=CollectorRegistry())


class PerRequestMetrics:
    """The common way to instrument an app: a prometheus-client Counter and Histogram observed on every request."""

    def __init__(self, app):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        registry = CollectorRegistry()
        self.app = app
        self.count = Counter("requests", "requests", registry=registry)
        self.latency = Histogram("latency_seconds", "latency", registry=registry)

    async def __call__(self, scope, receive, send):
        import time

        start = time.perf_counter()
        await self.app(scope, receive, send)
        self.count.inc()
        self.latency.observe(time.perf_counter() - start)


def prometheus_per_request() -> Starlette:
    app = _app()
    app.add_middleware(PerRequestMetrics)
    return app


def admitgate_redis() -> Starlette:
    """The admit path with the shared budget in Redis (``REDIS_URL``): token leases, never binding."""
    import os

    app = _app()
    app.add_middleware(AdmitGate, rate=1e6, backend=os.environ["REDIS_URL"], settings=Settings(burst=50_000))
    return app


def fleet_replica() -> Starlette:
    """One replica of a fleet sharing ``FLEET_RATE``/s through ``REDIS_URL``, on the gate's defaults; with
    ``FLEET_TENANTS=1``, tenants keyed by the ``x-api-key`` header. ``/`` answers at once; ``/work`` is forwarded to
    ``FLEET_UPSTREAM`` (the fleet's one capacity-limited service, over kept-alive connections) and answered with its
    status (502 if it could not be reached). With ``FLEET_TRACE`` (a directory), every lease is appended to a file
    of this process there as a JSON line (see :func:`trace_leases`)."""
    import os

    from admitgate import Tenancy
    from admitgate.backends.shared import RedisBudget

    tenants = Tenancy(key="header:x-api-key") if os.environ.get("FLEET_TENANTS") == "1" else None
    upstream = os.environ.get("FLEET_UPSTREAM")
    app = _app() if upstream is None else Starlette(routes=[Route("/", hello), Route("/work", _forward(upstream))])
    budget = RedisBudget(os.environ["REDIS_URL"])
    if os.environ.get("FLEET_TRACE"):
        trace_leases(budget, os.path.join(os.environ["FLEET_TRACE"], f"{os.getpid()}.jsonl"))
    app.add_middleware(AdmitGate, rate=float(os.environ["FLEET_RATE"]), backend=budget, tenants=tenants)
    return app


def _forward(base: str):
    """A route forwarding GET to ``base`` + ``/work`` on a pool of kept-alive connections (lab's lean client)."""
    import urllib.parse

    from lab.http1 import Http1Client

    url = urllib.parse.urlsplit(base)
    idle: list[Http1Client] = []

    async def work(request):
        client = idle.pop() if idle else Http1Client(url.hostname or "127.0.0.1", url.port or 80, cookies=False)
        status, _ = await client.get("/work")
        if client.connected:
            idle.append(client)
        return PlainTextResponse("ok" if status == 200 else "upstream", status_code=status or 502)

    return work


def trace_leases(budget, path: str) -> None:
    """Append each of ``budget``'s leases to ``path`` as a JSON line: ``start`` and ``end`` (``time.monotonic``, one
    clock for every process of the machine), the backlog it published, the fleet's backlog it read, its grant
    (tokens/s), and the leases out of turn so far."""
    import json

    lease = budget.lease
    out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the life of the process)

    async def traced(now: float) -> bool:
        start = time.monotonic()
        ok = await lease(now)
        out.write(json.dumps({"start": start, "end": time.monotonic(), "ok": ok, "published": budget._backlog,
                              "fleet": budget.fleet_backlog, "grant": budget._grant_rate,
                              "out_of_turn": getattr(budget, "out_of_turn", None)}) + "\n")  # fmt: skip
        return ok

    budget.lease = traced


def slowapi_redis() -> Starlette:
    """slowapi's pure-ASGI middleware with Redis storage (``REDIS_URL``), non-binding limit."""
    return _slowapi("SlowAPIASGIMiddleware", storage_uri=__import__("os").environ["REDIS_URL"])


def _slowapi(middleware_name: str, storage_uri: str | None = None) -> Starlette:
    import slowapi.middleware
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    app = _app()
    options = {"storage_uri": storage_uri} if storage_uri else {}
    app.state.limiter = Limiter(key_func=get_remote_address, default_limits=["1000000/second"], **options)
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)
    app.add_middleware(getattr(slowapi.middleware, middleware_name))
    return app


def slowapi() -> Starlette:
    """slowapi's default middleware (SlowAPIMiddleware, a BaseHTTPMiddleware), non-binding limit."""
    return _slowapi("SlowAPIMiddleware")


def slowapi_asgi() -> Starlette:
    """slowapi's pure-ASGI middleware, non-binding limit."""
    return _slowapi("SlowAPIASGIMiddleware")


def serve_all(ports: dict[str, int]) -> None:
    """Serve every variant from ONE process (one uvicorn server per port on one event loop), so
    process-level luck (memory layout, hash seeds) is shared instead of biasing one variant."""
    import asyncio

    import uvicorn

    async def run() -> None:
        servers = [
            uvicorn.Server(uvicorn.Config(globals()[name](), host="127.0.0.1", port=port, access_log=False,
                                          log_level="warning", lifespan="off"))
            for name, port in ports.items()
        ]  # fmt: skip
        await asyncio.gather(*(s.serve() for s in servers))

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


if __name__ == "__main__":
    import sys

    serve_all({name: int(port) for name, port in (item.split(":") for item in sys.argv[1].split(","))})
