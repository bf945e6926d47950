"""The app for the multi-worker tests: ``uvicorn tests.workers_app:app --workers 2`` with ``rate=20``.

``/who`` answers this worker's pid, the rate its gate admits, and a ticket its gate signs;
``/verify?ticket=...`` answers whether this worker's gate knows a ticket (signed by any worker)."""

import os
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from admitgate import AdmitGate


def gate_of(request: Request) -> AdmitGate:
    layer = request.app.middleware_stack
    while not isinstance(layer, AdmitGate):
        layer = layer.app
    return layer


async def who(request: Request) -> JSONResponse:
    gate = gate_of(request)
    assert gate.ticket is not None
    ticket = gate.ticket.issue(gate.ticket.new_id(), time.time() + 60)
    return JSONResponse({"pid": os.getpid(), "rate": gate.gate.static_rate, "ticket": ticket})


async def verify(request: Request) -> JSONResponse:
    gate = gate_of(request)
    assert gate.ticket is not None
    return JSONResponse({"pid": os.getpid(), "known": gate.ticket.verify(request.query_params["ticket"], time.time())
                         is not None})  # fmt: skip


bad = Starlette(routes=[Route("/who", who)])
bad.add_middleware(AdmitGate, rate=0)  # a bad configuration: the start-up must fail

app = Starlette(routes=[Route("/who", who), Route("/verify", verify)])
app.add_middleware(AdmitGate, rate=20, exempt=["/who", "/verify"])
