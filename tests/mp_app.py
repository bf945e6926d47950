"""An app for the multiprocess-metrics test: ``uvicorn tests.mp_app:app --workers 2``."""

from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, BandwidthDelay, LiveHeadroom
from admitgate.metrics import metrics_app


async def hello(request):
    return PlainTextResponse("hi")


app = Starlette(routes=[Route("/", hello), Route("/metrics", metrics_app())])
app.add_middleware(AdmitGate, rate=LiveHeadroom(BandwidthDelay(seed=1), initial=1e6, ceiling=1e6), burst=1e6,
                   metrics=REGISTRY)  # fmt: skip
