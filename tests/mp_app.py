"""Apps for the multiprocess-metrics tests: ``uvicorn tests.mp_app:app --workers 2`` (live capacity, floor 3
per worker) and ``tests.mp_app:static_app`` (a static rate of 5/s per worker that rejects most of a burst).
Starlette builds a middleware stack at its first call, so only the served app's gate is ever constructed."""

from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, BandwidthDelay, Identity, LiveCapacity, Settings
from admitgate.metrics import metrics_app


async def hello(request):
    return PlainTextResponse("hi")


app = Starlette(routes=[Route("/", hello), Route("/metrics", metrics_app())])
app.add_middleware(
    AdmitGate,
    rate=LiveCapacity(BandwidthDelay(seed=1), initial=1e6, ceiling=1e6, floor=3),
    metrics=REGISTRY,
    settings=Settings(burst=1e6),
)

static_app = Starlette(routes=[Route("/", hello), Route("/metrics", metrics_app())])
static_app.add_middleware(
    AdmitGate,
    rate=5,
    metrics=REGISTRY,
    settings=Settings(burst=1, max_pacing_delay=0, tarpit=0),
    identity=Identity(ticket=False),
)
