"""The demo service: a capacity-limited endpoint, optionally behind a gate.

``/work`` is served by ``workers`` workers taking ``service_time`` s each (capacity
μ = workers / service_time requests/s). A request that cannot get a worker within
``queue_timeout`` s fails with 503, as an overloaded service does. ``/status`` uses
the same workers and is the *critical* background class; ``/health`` is exempt.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

#: Gate settings for the demo: /status is critical background traffic (λ_new).
DEMO_ROUTES = {"/status": {"class": "critical"}}
#: The static rate is set this far below capacity: at utilisation 1 a queue has no
#: drift back to empty and its waits random-walk into the upstream's timeout. Measured
#: (bench/herd.py, 2 rounds): 0.99 gave 11-18 upstream 503s per herd and no faster drain;
#: 0.975 gave none.
DEMO_UTILISATION = 0.975


class Upstream:
    """``workers`` slots of ``service_time`` s each, with a queue timeout (seconds)."""

    def __init__(self, workers: int = 20, service_time: float = 0.1, queue_timeout: float = 1.0) -> None:
        self.workers, self.service_time, self.queue_timeout = workers, service_time, queue_timeout
        self.busy = 0
        self.peak_busy = 0
        self.served = 0
        self.timeouts = 0
        self._slots: asyncio.Semaphore | None = None

    @property
    def capacity(self) -> float:
        """μ in requests/s."""
        return self.workers / self.service_time

    async def serve(self) -> bool:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        try:
            await asyncio.wait_for(self._slots.acquire(), self.queue_timeout)
        except asyncio.TimeoutError:
            self.timeouts += 1
            return False
        self.busy += 1
        self.peak_busy = max(self.peak_busy, self.busy)
        try:
            await asyncio.sleep(self.service_time)
        finally:
            self.busy -= 1
            self._slots.release()
        self.served += 1
        return True


def demo_app(upstream: Upstream | None = None, gate: str = "admitgate", **gate_options: Any) -> Starlette:
    """The demo Starlette app. ``gate``: ``"admitgate"``, ``"slowapi"`` or ``"none"``."""
    up = upstream or Upstream()

    async def work(request: Request) -> Response:
        if await up.serve():
            return PlainTextResponse("done")
        return PlainTextResponse("overloaded", status_code=503)

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def stats(request: Request) -> Response:
        if "service_time" in request.query_params:  # a live capacity change, for experiments
            try:
                up.service_time = max(0.001, float(request.query_params["service_time"]))
            except ValueError:
                return JSONResponse({"error": "service_time must be a number"}, status_code=400)
        return JSONResponse({"served": up.served, "timeouts": up.timeouts, "peak_busy": up.peak_busy,
                             "capacity": up.capacity})  # fmt: skip

    routes: list[BaseRoute] = [Route("/work", work), Route("/status", work), Route("/health", health),
                               Route("/stats", stats)]  # fmt: skip
    registry = gate_options.pop("metrics", None)
    if registry is not None:
        from .metrics import metrics_app

        routes.append(Route("/metrics", metrics_app(registry)))
    if gate == "slowapi":
        return _slowapi_app(routes, up)
    app = Starlette(routes=routes)
    if gate == "admitgate":
        from .middleware import AdmitGate

        options: dict[str, Any] = {"rate": up.capacity * DEMO_UTILISATION, "burst": up.workers, "routes": DEMO_ROUTES}
        if os.environ.get("ADMITGATE_CONFIG") or os.environ.get("ADMITGATE_ESTIMATOR"):
            from .config import load

            options.pop("rate")
            options.update(load())  # the deployment's file and ADMITGATE_* variables
        options.update(gate_options)
        options["metrics"] = registry
        options["exempt"] = (*options.get("exempt", ("/health", "/metrics")), "/stats")
        app.add_middleware(AdmitGate, **options)
    elif gate != "none":
        raise ValueError(f"unknown gate {gate!r}")
    return app


def _slowapi_app(routes: list[BaseRoute], up: Upstream) -> Starlette:
    """The same app behind slowapi at a static limit equal to capacity (its pure-ASGI middleware)."""
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware

    limiter = Limiter(
        key_func=lambda request: "all", default_limits=[f"{int(up.capacity)}/second"], headers_enabled=True
    )
    app = Starlette(routes=routes)
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    app.add_middleware(SlowAPIASGIMiddleware)
    return app
