"""A paced request does not buffer its body: while held, the gate reads at most its first message.

A request with no body or a small one has that message read (to notice a client that gives up); a larger
or chunked body is not read at all. The body stays with the server, whose flow control stops the client;
once admitted, the app reads the whole body, byte for byte. In-process with an injected clock, and through
a real uvicorn (both of its HTTP implementations) with a body of 64 MiB streamed by httpx.
"""

from __future__ import annotations

import hashlib
import random

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ManualClock, Settings

SIZE = 64 * 1024 * 1024


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(("framing", "most"), [([], 1), ([(b"content-length", b"100000")], 0),
                                               ([(b"transfer-encoding", b"chunked")], 0)])  # fmt: skip
async def test_a_held_request_reads_at_most_its_first_message(clock: ManualClock, framing, most: int) -> None:
    chunks = [{"type": "http.request", "body": bytes([i]) * 1000, "more_body": i < 99} for i in range(100)]
    read = 0
    read_before_the_app: list[int] = []
    received = bytearray()

    async def receive():
        nonlocal read
        await anyio.sleep(0)
        if read == len(chunks):
            await anyio.sleep_forever()
        read += 1
        return chunks[read - 1]

    async def long_sleep(seconds: float) -> None:  # a hold on the injected clock that lets the watcher run freely
        clock.advance(seconds)
        for _ in range(1000):
            await anyio.sleep(0)

    async def app(scope, receive, send):
        read_before_the_app.append(read)
        more = True
        while more:
            message = await receive()
            received.extend(message["body"])
            more = message["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = AdmitGate(app, rate=2, settings=Settings(burst=1, max_pacing_delay=1.0), clock=clock, sleep=long_sleep)
    scope = {"type": "http", "method": "POST", "path": "/", "headers": framing, "client": ("127.0.0.1", 1)}

    async def ignore(message) -> None:
        pass

    await gate(dict(scope), receive, ignore)  # the only token
    read, received[:] = 0, b""
    await gate(dict(scope), receive, ignore)
    assert gate.gate.stats.paced == 1
    assert read_before_the_app[1] <= most, read_before_the_app  # the rest was left to the server
    assert received == b"".join(c["body"] for c in chunks)


def uploads_app(progress: dict[str, int]) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hi")

    async def upload(request: Request) -> JSONResponse:
        progress["sent_when_admitted"] = progress["sent"]
        digest, size = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            size += len(chunk)
        return JSONResponse({"sha256": digest.hexdigest(), "bytes": size})

    app = Starlette(routes=[Route("/", hello), Route("/upload", upload, methods=["POST"])])
    app.add_middleware(AdmitGate, rate=1, settings=Settings(burst=1, max_pacing_delay=3.0, tarpit=0))
    return app


@pytest.mark.integration
@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_paced_upload_reaches_the_app_intact_without_being_read_while_held(serve, http: str, framing: str) -> None:
    data = random.Random(7).randbytes(SIZE)
    progress = {"sent": 0}

    def body():  # uneven chunks, counted as httpx takes them
        rng, at = random.Random(11), 0
        while at < SIZE:
            step = rng.randint(1, 256 * 1024)
            progress["sent"] = min(SIZE, at + step)
            yield data[at : at + step]
            at += step

    app = uploads_app(progress)
    with serve(app, http=http) as base, httpx.Client(base_url=base, timeout=60) as client:
        assert client.get("/").status_code == 200  # the only token: the upload is paced (about 1 s)
        length = {"content-length": str(SIZE)} if framing == "content-length" else {}
        response = client.post("/upload", content=body(), headers=length)
    assert response.status_code == 200
    assert response.json() == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": SIZE}
    gate = app.middleware_stack
    while not isinstance(gate, AdmitGate):
        gate = gate.app
    assert gate.gate.stats.paced == 1
    # While it was held, flow control stopped the client after the socket buffers and the server's own
    # (64 KiB) filled: nowhere near the whole body had been sent when the app was called.
    assert progress["sent_when_admitted"] < SIZE // 4, progress
