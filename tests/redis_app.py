"""A replica for the shared-budget tests: ``REDIS_URL=... FLEET_RATE=200 [FLEET_NAME=...] uvicorn tests.redis_app:app``.

``/`` is gated (no pacing, no tarpit: admitted or 429 at once; with ``HERD=1``, the gate's defaults);
``/count`` (exempt) reports this replica's admissions and the backend's state as JSON.
"""

import json
import os

from admitgate import AdmitGate, Settings
from admitgate.backends.shared import RedisBudget


async def inner(scope, receive, send):
    if scope["path"] == "/count":
        gate = replica.gate
        backend = replica.backend
        state = {
            "admitted": gate.pacer.taken,
            "rejected": gate.stats.rejected,
            "degraded": backend.degraded,
            "errors": backend.errors,
            "replicas": backend.replicas,
            "round_trips": backend.round_trips,
            "granted": backend.granted,
            "rate": gate.pacer.rate,
            "fleet": backend.fleet_rate,
        }
        body = json.dumps(state).encode()  # fmt: skip
    else:
        body = b"ok"
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}
    )
    await send({"type": "http.response.body", "body": body})


# the fleet's budget: FLEET_NAME names its keys (a test's own, on a Redis others may use too)
budget = RedisBudget(os.environ["REDIS_URL"], name=os.environ.get("FLEET_NAME", "admitgate"))
if os.environ.get("HERD"):  # the library's defaults (pacing, tarpit), as a fleet facing a herd would run
    replica = AdmitGate(inner, rate=float(os.environ["FLEET_RATE"]), exempt=("/count",), backend=budget)
else:  # no pacing, no tarpit: each request is admitted or gets its 429 at once
    replica = AdmitGate(
        inner,
        rate=float(os.environ.get("FLEET_RATE", "200")),
        exempt=("/count",),
        backend=budget,
        settings=Settings(burst=20, max_pacing_delay=0, tarpit=0),
    )
app = replica
