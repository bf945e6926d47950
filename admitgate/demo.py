"""The demo service: a capacity-limited endpoint, optionally behind a gate.

``/work`` is served by ``workers`` workers taking ``service_time`` s each (capacity
μ = workers / service_time requests/s). A request that cannot get a worker within
``queue_timeout`` s fails with 503, as an overloaded service does. ``/stats`` reports the
service's counters and changes its capacity on the fly (``?workers=10``, ``?service_time=0.2``);
``/health`` and ``/stats`` are exempt from the gate.

The gate runs on the library's defaults: no classes, and a capacity learnt live (no hint), unless
``rate`` types one in (μ, requests/s) or ``ADMITGATE_*`` variables configure it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route


class Upstream:
    """``workers`` slots of ``service_time`` s each, with a queue timeout (seconds); both can change live."""

    def __init__(self, workers: int = 20, service_time: float = 0.1, queue_timeout: float = 1.0) -> None:
        self.workers, self.service_time, self.queue_timeout = workers, service_time, queue_timeout
        self.busy = 0
        self.peak_busy = 0
        self.served = 0
        self.timeouts = 0
        self._slots: asyncio.Semaphore | None = None
        self._owed = 0  # slots a shrink takes out of service as requests finish, before anyone waiting gets them

    @property
    def capacity(self) -> float:
        """μ in requests/s."""
        return self.workers / self.service_time

    async def resize(self, workers: int) -> None:
        """Serve with ``workers`` slots from now on: a shrink takes free slots at once and busy ones as they
        finish, ahead of the requests waiting for one (as the service loses workers, not places in its queue);
        a growth adds them."""
        slots = self._semaphore()
        while workers > self.workers:
            if self._owed:
                self._owed -= 1  # a slot a shrink had yet to take: it stays in service
            else:
                slots.release()
            self.workers += 1
        while workers < self.workers:
            if slots.locked():
                self._owed += 1
            else:
                await slots.acquire()  # (a free slot: taken without waiting)
            self.workers -= 1

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        return self._slots

    async def serve(self) -> bool:
        """Serve one request: True when served, False when no worker came free within the queue timeout."""
        slots = self._semaphore()
        try:
            await asyncio.wait_for(slots.acquire(), self.queue_timeout)
        except asyncio.TimeoutError:
            self.timeouts += 1
            return False
        self.busy += 1
        self.peak_busy = max(self.peak_busy, self.busy)
        try:
            await asyncio.sleep(self.service_time)
        finally:
            self.busy -= 1
            if self._owed:
                self._owed -= 1
            else:
                slots.release()
        self.served += 1
        return True


def demo_app(upstream: Upstream | None = None, gate: str = "admitgate", **gate_options: Any) -> Starlette:
    """The demo Starlette app. ``gate``: ``"admitgate"`` or ``"none"`` (bench/slowapi_demo.py
    serves it behind slowapi); ``gate_options`` go to
    :class:`~admitgate.asgi.middleware.AdmitGate` (none: its defaults, a capacity learnt live)."""
    up = upstream or Upstream()

    async def work(request: Request) -> Response:
        if await up.serve():
            return PlainTextResponse("done")
        return PlainTextResponse("overloaded", status_code=503)

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def stats(request: Request) -> Response:
        query = request.query_params
        try:  # a live capacity change, for experiments
            if "service_time" in query:
                up.service_time = max(0.001, float(query["service_time"]))
            if "workers" in query:
                await up.resize(max(0, int(query["workers"])))
        except ValueError:
            return JSONResponse({"error": "service_time and workers must be numbers"}, status_code=400)
        return JSONResponse({"served": up.served, "timeouts": up.timeouts, "peak_busy": up.peak_busy,
                             "capacity": up.capacity})  # fmt: skip

    routes: list[BaseRoute] = [Route("/work", work), Route("/health", health), Route("/stats", stats)]
    registry = gate_options.pop("metrics", None)
    if registry is not None:
        from .metrics import metrics_app

        routes.append(Route("/metrics", metrics_app(registry)))
    app = Starlette(routes=routes)
    if gate == "admitgate":
        from .asgi.middleware import AdmitGate

        options: dict[str, Any] = {}
        if any(name.startswith("ADMITGATE_") for name in os.environ):
            from .config import load

            options.update(load())  # the deployment's file and ADMITGATE_* variables
        options.update(gate_options)
        options["metrics"] = registry
        options["exempt"] = (*options.get("exempt", ("/health", "/metrics")), "/stats")
        app.add_middleware(AdmitGate, **options)
    elif gate != "none":
        raise ValueError(f"unknown gate {gate!r}")
    return app
