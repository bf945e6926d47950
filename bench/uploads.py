"""Paced uploads: the server's memory while 1,000 uploads are held by the gate, against the idle server.

    python bench/uploads.py [--uploads 1000] [--body-mib 1] [--hold 3] [--variant gate|unread] [--tree DIR] [--json]

One uvicorn process (default flags: httptools, one worker) on core 0 serves an app that reads each body
and counts its bytes. ``gate``: behind AdmitGate with one token a second and room to pace every upload
(``max_pacing_delay`` 1.5 s per upload), so after the first one each is held in turn; ``unread``: no gate,
the app itself waits before reading (what uvicorn alone keeps for a request whose body nobody reads yet).

The clients (asyncio streams on core 1) open all uploads at once, send the head with a Content-Length
and then the body in 64 KiB writes, each awaited (``drain``), so a client sends only as fast as the
server's flow control lets it. Once every upload has arrived and the clients have stopped making
progress for a second, the server's RSS (``/proc/<pid>/status``) is sampled for ``--hold`` seconds.
Reported: idle RSS (started, one request served), held RSS (the largest sample), the difference per
upload, how many were held, and what the clients got to send. ``--tree`` serves another checkout's
``admitgate`` (for example an older commit, ``git archive <commit> admitgate | tar -x -C DIR``).
Only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHUNK = 64 * 1024
BLOCK = memoryview(bytes(CHUNK))
MIB = 1024 * 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


# -- the server (child process) ------------------------------------------------------------------
def serve(port: int, variant: str, uploads: int, tree: str) -> None:
    sys.path.insert(0, tree)
    import anyio
    import uvicorn

    import admitgate
    from admitgate import AdmitGate, Identity, Settings
    from lab.serving import pin

    pin(0)
    counts = {"completed": 0, "bytes": 0, "parked": 0}

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        path = scope["path"]
        if path == "/stats":
            held = gated.gate.waiters if gated is not None else counts["parked"]
            body = json.dumps({**counts, "held": held, "admitgate": admitgate.__file__}).encode()
        else:  # /upload, or /warmup (spends the gate's one token)
            if path == "/upload" and variant == "unread":
                counts["parked"] += 1
                await anyio.sleep_forever()  # the bench ends first
            size, more = 0, True
            while more:
                message = await receive()
                size += len(message.get("body", b""))
                more = message.get("more_body", False)
            if path == "/upload":
                counts["completed"] += 1
                counts["bytes"] += size
            body = str(size).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    gated = None
    if variant == "gate":
        knobs = Settings(burst=1, max_pacing_delay=1.5 * (uploads + 10), max_waiters=uploads + 10,
                         standing_queue=3600, tarpit=0)  # fmt: skip
        gated = AdmitGate(app, rate=1, settings=knobs, identity=Identity(ticket=False), exempt=["/stats"])
    uvicorn.run(gated or app, host="127.0.0.1", port=port, log_level="warning")


# -- the clients (parent) --------------------------------------------------------------------------
async def upload(port: int, size: int, sent: list[int], index: int, path: str = "/upload") -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-length: %d\r\n\r\n" % (path.encode(), size))
        while sent[index] < size:
            step = min(CHUNK, size - sent[index])
            writer.write(BLOCK[:step])
            await writer.drain()
            sent[index] += step
        await reader.readuntil(b"\r\n\r\n")  # the response head: it was admitted and read
    finally:
        writer.close()


async def stats(port: int) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stats HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
    response = await reader.read()
    writer.close()
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


async def measure(port: int, pid: int, uploads: int, size: int, hold: float) -> dict:
    from lab.serving import pin

    pin(1)
    await upload(port, 1024, [0], 0, "/warmup")  # spends the one token, so every upload after it is paced
    readings = []
    for _ in range(5):
        readings.append(rss_mib(pid))
        await asyncio.sleep(0.1)
    idle = statistics.median(readings)
    sent = [0] * uploads
    tasks = [asyncio.create_task(upload(port, size, sent, i)) for i in range(uploads)]
    start, last, still_since = time.monotonic(), -1, time.monotonic()
    while True:  # until every upload has arrived and the clients have been stopped for a second
        await asyncio.sleep(0.25)
        arrived = await stats(port)
        total = sum(sent)
        if total != last:
            last, still_since = total, time.monotonic()
        everyone = arrived["held"] + arrived["completed"] >= uploads
        if everyone and time.monotonic() - still_since >= 1.0:
            break
        if time.monotonic() - start > 120:
            raise RuntimeError(f"uploads did not settle: {arrived}")
    samples = []
    for _ in range(max(1, int(hold / 0.25))):
        samples.append(rss_mib(pid))
        await asyncio.sleep(0.25)
    during = await stats(port)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    held = max(samples)
    return {
        "uploads": uploads,
        "body_mib": size / MIB,
        "rss_idle_mib": round(idle, 1),
        "rss_held_mib": round(held, 1),
        "rss_held_minus_idle_mib": round(held - idle, 1),
        "kib_per_held_upload": round((held - idle) * 1024 / max(1, during["held"]), 1),
        "held": during["held"],
        "completed": during["completed"],
        "completed_bytes_ok": during["bytes"] == during["completed"] * size,
        "clients_sent_mib": round(sum(sent) / MIB, 1),
        "admitgate": during["admitgate"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=int, default=1000)
    parser.add_argument("--body-mib", type=float, default=1.0, help="each upload's body (0: no body)")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds of RSS samples while held")
    parser.add_argument("--variant", choices=["gate", "unread"], default="gate")
    parser.add_argument("--tree", default=str(HERE.parent), help="directory holding the admitgate package to serve")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # child mode: the port
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.variant, args.uploads, args.tree)
        return
    sys.path.insert(0, str(HERE.parent))
    from lab.serving import free_port

    port = free_port()
    child = [sys.executable, __file__, "--serve", str(port), "--variant", args.variant, "--uploads", str(args.uploads),
             "--tree", args.tree]  # fmt: skip
    server = subprocess.Popen(child)
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                    break
            except OSError:
                time.sleep(0.05)
        result = asyncio.run(measure(port, server.pid, args.uploads, int(args.body_mib * MIB), args.hold))
    finally:
        server.kill()  # not terminate: uvicorn would wait for the held requests (a held upload's leaving is
        server.wait(30)  # noticed when its hold ends), and only the measurement was wanted
    result["variant"] = args.variant
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
