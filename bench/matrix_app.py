"""The scenario matrix's server app (a uvicorn factory: ``matrix_app:build``), configured by ``MATRIX_SERVER``.

``MATRIX_SERVER`` is a JSON object: ``way`` (``default``: ``AdmitGate(app)``; ``typed``: ``AdmitGate(app,
rate=rate)``; ``metrics``: ``AdmitGate(app, metrics=CollectorRegistry())``; ``bare``: no gate), ``workers``,
``service`` (s) and ``queue`` (s) of the ``/io`` upstream, ``burn_ms`` of ``/cpu``, and ``rate`` (requests/s,
``typed`` only); ``bdp``: ``AdmitGate(app)`` with the ``bdp`` estimator, the default before ``delay``.

- ``/io``: a request takes one of ``workers`` slots for ``service`` seconds; one that gets no slot within
  ``queue`` seconds is answered 503 (:class:`admitgate.demo.Upstream`). μ = workers / service.
- ``/cpu``: burns ``burn_ms`` of CPU on the event loop, then answers 200 (0: a plain hello world).
- ``/stats``: outside the gated app (a dispatcher in front of it, so the gated app is exactly what a user
  writes): ``?workers=N``, ``?burn_ms=B``, ``?outage=seconds`` (no worker for that long, then as before)
  change the service live; the answer holds the service's and the gate's counters.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from admitgate import AdmitGate
from admitgate.demo import Upstream


def gate_counters(gated: Any) -> dict[str, Any]:
    """The gate's counters (requests) and its current rate (requests/s): the one place that reads the gate's
    internals, so that it alone changes when they move. ``gated``: the ``AdmitGate`` instance, or None."""
    if gated is None:
        return {}
    gate = gated.gate
    stats = gate.stats
    return {"admitted_at_once": gate.pacer.taken, "paced": stats.paced, "rejected": stats.rejected,
            "abandoned": stats.abandoned, "scheduled": stats.scheduled, "rate": round(gate.pacer.rate, 1)}  # fmt: skip


class Service:
    """The routes' state: the ``/io`` upstream, ``/cpu``'s burn and the counters ``/stats`` reports."""

    def __init__(self, workers: int, service: float, queue: float, burn_ms: float) -> None:
        self.upstream = Upstream(workers, service, queue)
        self.burn_s = burn_ms / 1000
        self.cpu_served = 0
        self._outage: asyncio.Task[None] | None = None

    async def io(self, request: Request) -> Response:
        if await self.upstream.serve():
            return PlainTextResponse("done")
        return PlainTextResponse("overloaded", status_code=503)

    async def cpu(self, request: Request) -> Response:
        end = time.perf_counter() + self.burn_s
        while time.perf_counter() < end:
            pass
        self.cpu_served += 1
        return PlainTextResponse("Hello, world!")

    async def outage(self, seconds: float) -> None:
        """No worker for ``seconds``, then as many as before."""
        workers = self.upstream.workers
        await self.upstream.resize(0)
        await asyncio.sleep(seconds)
        await self.upstream.resize(workers)

    async def change(self, query: Any) -> None:
        if "burn_ms" in query:
            self.burn_s = max(0.0, float(query["burn_ms"])) / 1000
        if "workers" in query:
            await self.upstream.resize(max(0, int(query["workers"])))
        if "outage" in query:
            self._outage = asyncio.get_running_loop().create_task(self.outage(float(query["outage"])))

    def counters(self) -> dict[str, Any]:
        up = self.upstream
        return {"io_served": up.served, "io_503": up.timeouts, "io_peak_busy": up.peak_busy, "workers": up.workers,
                "cpu_served": self.cpu_served, "burn_ms": self.burn_s * 1000}  # fmt: skip


def dispatcher(gated: Any, control: Any) -> Any:
    """An ASGI app sending ``/stats`` to ``control`` and everything else (lifespan too) to ``gated``."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/stats":
            await control(scope, receive, send)
        else:
            await gated(scope, receive, send)

    return app


def build() -> Any:
    """The server the matrix drives, as ``MATRIX_SERVER`` configures it (see the module docstring)."""
    config = json.loads(os.environ.get("MATRIX_SERVER", "{}"))
    way = config.get("way", "bare")
    service = Service(int(config.get("workers", 20)), float(config.get("service", 0.1)),
                      float(config.get("queue", 1.0)), float(config.get("burn_ms", 0.0)))  # fmt: skip
    inner = Starlette(routes=[Route("/io", service.io), Route("/cpu", service.cpu)])
    gated: Any = None
    if way == "default":
        gated = AdmitGate(inner)
    elif way == "typed":
        gated = AdmitGate(inner, rate=float(config["rate"]))
    elif way == "bdp":
        from admitgate.limit.estimators import capacity_from_config

        gated = AdmitGate(inner, rate=capacity_from_config({"estimator": "bdp"}))
    elif way == "metrics":
        from prometheus_client import CollectorRegistry

        gated = AdmitGate(inner, metrics=CollectorRegistry())
    elif way != "bare":
        raise ValueError(f"unknown way {way!r}")

    async def stats(request: Request) -> Response:
        try:
            await service.change(request.query_params)
        except ValueError:
            return JSONResponse({"error": "workers, burn_ms and outage must be numbers"}, status_code=400)
        return JSONResponse({**service.counters(), "gate": gate_counters(gated)})

    control = Starlette(routes=[Route("/stats", stats)])
    return dispatcher(gated if gated is not None else inner, control)
