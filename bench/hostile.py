"""Hostile headers: what one rejection costs when the client built a header to be expensive to parse.

    python bench/hostile.py [--rounds 5] [--duration 2] [--connections 4] [--shapes a,b] [--inprocess-only] [--json]

Every request is refused (one token, spent first; tarpit off), so each figure is the cost of a 429:
* **server CPU µs per 429**: one uvicorn process with its default flags (httptools, proxy headers) on
  core 0, wrk on core 1 sending the same raw request over and over; utime+stime of the server over
  wrk's request count. It includes what uvicorn spends reading and parsing the header, so the same
  request is also sent to a bare app that answers 429 without looking at it (the floor), and the
  gate's own share is gate − bare per round;
* **in-process µs per rejection**: the same request driven through ``AdmitGate`` directly (no server).

Each header is about 60 KB; the gate trusts one proxy (``trusted_hops=1``) and reads the field the row
attacks (``forwarded="forwarded"`` for Forwarded rows). The ratio is hostile over harmless of the same
shape: one 60 KB line against ``x-pad`` 60 KB, many lines against as many ``x-pad`` lines. Medians of
interleaved rounds in random order. Needs wrk (Debian package ``wrk``); only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from overhead import cpu_seconds  # noqa: E402

from admitgate import AdmitGate, Identity, ManualClock, Settings  # noqa: E402
from lab.serving import free_port, pin  # noqa: E402

SIZE = 60_000
LINES = 2_000  # as many header lines as fit in about 60 KB

#: key -> (description, gate, header lines, key of the harmless baseline of the same shape)
SHAPES: dict[str, tuple[str, str, list[tuple[bytes, bytes]], str]] = {
    "harmless": ("harmless 60 KB", "xff", [(b"x-pad", b"a" * SIZE)], "harmless"),
    "harmless-fwd": ("harmless 60 KB (forwarded gate)", "fwd", [(b"x-pad", b"a" * SIZE)], "harmless-fwd"),
    "harmless-lines": ("harmless 2,000 lines", "xff", [(b"x-pad", b"203.0.113.7")] * LINES, "harmless-lines"),
    "fwd-semicolons": ("Forwarded ;;;", "fwd", [(b"forwarded", b";" * SIZE)], "harmless-fwd"),
    "fwd-commas": ("Forwarded ,,,", "fwd", [(b"forwarded", b"," * SIZE)], "harmless-fwd"),
    "fwd-for-semicolons": ("Forwarded for=;;;", "fwd", [(b"forwarded", b"for=" + b";" * SIZE)], "harmless-fwd"),
    "fwd-lines": ("Forwarded 2,000 lines", "fwd", [(b"forwarded", b"for=203.0.113.7")] * LINES, "harmless-lines"),
    "xff-commas": ("X-Forwarded-For ,,,", "xff", [(b"x-forwarded-for", b"," * SIZE)], "harmless"),
    "xff-lines": ("X-Forwarded-For 2,000 lines", "xff", [(b"x-forwarded-for", b"203.0.113.7")] * LINES,
                  "harmless-lines"),
    "cookie-lines": ("Cookie 2,000 lines", "xff", [(b"cookie", b"admitgate_rt=a.1.b")] * LINES, "harmless-lines"),
    "cookie-pairs": ("Cookie 60 KB of pairs", "xff", [(b"cookie", b"a=1; " * (SIZE // 5))], "harmless"),
    "cookie-names": ("Cookie xadmitgate_rt=…", "xff", [(b"cookie", b"xadmitgate_rt=" * (SIZE // 14))], "harmless"),
    "cookie-ticket": ("Cookie ticket 60 KB", "xff", [(b"cookie", b"admitgate_rt=" + b"a" * SIZE)], "harmless"),
    "authorization": ("Authorization 60 KB", "xff", [(b"authorization", b"Bearer " + b"a" * SIZE)], "harmless"),
}  # fmt: skip


def gate(kind: str, app=None) -> AdmitGate:
    """The gate under test: one token, which the caller spends first; every later request is a 429."""

    async def hello(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    forwarded = "forwarded" if kind == "fwd" else "x-forwarded-for"
    return AdmitGate(
        app or hello,
        rate=1,
        clock=ManualClock(0.0),
        settings=Settings(burst=1, max_pacing_delay=0, tarpit=0),
        identity=Identity(trusted_hops=1, forwarded=forwarded),
    )


# -- in-process ----------------------------------------------------------------------------------
def scope_for(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000), "headers": [(b"host", b"127.0.0.1:8000"), *headers]}  # fmt: skip


async def per_rejection_us(app: AdmitGate, headers: list[tuple[bytes, bytes]], n: int) -> float:
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        return None

    scope = scope_for(headers)
    start = time.perf_counter()
    for _ in range(n):
        await app(scope, receive, send)
    return (time.perf_counter() - start) / n * 1e6


async def inprocess(shapes: list[str], rounds: int, n: int) -> dict[str, list[float]]:
    gates = {kind: gate(kind) for kind in ("xff", "fwd")}
    for app in gates.values():
        await per_rejection_us(app, [], 1)  # spends the token
    samples: dict[str, list[float]] = {name: [] for name in shapes}
    order = list(shapes)
    for name in order:  # warm-up
        _, kind, headers, _ = SHAPES[name]
        await per_rejection_us(gates[kind], headers, max(1, n // 10))
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            _, kind, headers, _ = SHAPES[name]
            samples[name].append(await per_rejection_us(gates[kind], headers, n))
    return samples


# -- over HTTP -----------------------------------------------------------------------------------
async def bare(scope, receive, send):
    """The floor: a 429 that reads nothing of the request."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 429, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def serve(ports: dict[str, int]) -> None:
    """Child mode: both gates and the bare app, each on its port, in one uvicorn process with default flags."""
    import uvicorn

    async def run() -> None:
        apps = {"bare": bare, "xff": gate("xff"), "fwd": gate("fwd")}
        servers = [uvicorn.Server(uvicorn.Config(apps[kind], host="127.0.0.1", port=port, log_level="warning",
                                                 access_log=False)) for kind, port in ports.items()]  # fmt: skip
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(run())


def lua_request(headers: list[tuple[bytes, bytes]], port: int) -> str:
    """A wrk script that sends this raw request (wrk.headers cannot repeat a field name)."""
    raw = b"GET / HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % port
    raw += b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n"
    text = raw.decode("latin-1").replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    return f'local req = "{text}"\nrequest = function() return req end\n'


def wrk(port: int, headers: list[tuple[bytes, bytes]], duration: float, connections: int, pid: int) -> float:
    """Server CPU µs per response for one bounded wrk run (every response must be the gate's 429)."""
    cores = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua_request(headers, port))
    try:
        cmd = [*cores, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "-s", script.name,
               f"http://127.0.0.1:{port}/"]  # fmt: skip
        before = cpu_seconds(pid)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30, check=True).stdout
        used = cpu_seconds(pid) - before
    finally:
        os.unlink(script.name)
    total = re.search(r"(\d+) requests in", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if not total or not non_2xx or int(non_2xx.group(1)) != int(total.group(1)) or "Socket errors" in out:
        raise RuntimeError(f"expected only 429s and no socket errors:\n{out}")
    return used / int(total.group(1)) * 1e6


def over_http(
    shapes: list[str], rounds: int, duration: float, connections: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Server CPU µs per 429 for each shape: (through its gate, through the bare app)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    ports = {"xff": free_port(), "fwd": free_port(), "bare": free_port()}
    spec = ",".join(f"{k}:{p}" for k, p in ports.items())
    proc = subprocess.Popen([sys.executable, __file__, "--serve", spec], preexec_fn=lambda: pin(0))
    try:
        deadline = time.monotonic() + 30
        for port in ports.values():
            while True:
                try:  # the first request spends a gate's one token
                    if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code in (200, 429):
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("benchmark server did not start")
                time.sleep(0.1)
        runs = [(name, target) for name in shapes for target in ("gate", "bare")]
        samples: dict[str, dict[str, list[float]]] = {"gate": {n: [] for n in shapes}, "bare": {n: [] for n in shapes}}
        for name, target in runs:  # warm-up
            _, kind, headers, _ = SHAPES[name]
            wrk(ports[kind if target == "gate" else "bare"], headers, 1, connections, proc.pid)
        for _ in range(rounds):
            random.shuffle(runs)
            for name, target in runs:
                _, kind, headers, _ = SHAPES[name]
                port = ports[kind if target == "gate" else "bare"]
                samples[target][name].append(wrk(port, headers, duration, connections, proc.pid))
        return samples["gate"], samples["bare"]
    finally:
        proc.terminate()
        proc.wait(10)


def summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median µs per shape and, per round, hostile over the same round's harmless baseline (median of ratios)."""
    out = {}
    for name, values in samples.items():
        base = samples[SHAPES[name][3]]
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        out[name] = {"us": round(statistics.median(values), 1), "ratio": round(statistics.median(ratios), 2)}
    return out


def main(shapes: list[str], rounds: int, duration: float, connections: int, requests: int, http: bool) -> dict:
    shapes = list(dict.fromkeys(s for name in shapes for s in (SHAPES[name][3], name)))  # with their baselines
    result: dict = {"rounds": rounds, "header_bytes": SIZE, "lines": LINES}
    result["shapes"] = {name: SHAPES[name][0] for name in shapes}
    result["inprocess_us_per_rejection"] = summary(asyncio.run(inprocess(shapes, rounds, requests)))
    if http:
        gated, floor = over_http(shapes, rounds, duration, connections)
        result.update(duration_s=duration, connections=connections)
        result["server_cpu_us_per_429"] = summary(gated)
        result["bare_429_cpu_us"] = {n: round(statistics.median(v), 1) for n, v in floor.items()}
        result["gate_share_cpu_us"] = {
            n: round(statistics.median(g - b for g, b in zip(gated[n], floor[n], strict=True)), 1) for n in shapes
        }
    return result


if __name__ == "__main__":
    if "--serve" in sys.argv:
        serve({k: int(p) for k, p in (item.split(":") for item in sys.argv[sys.argv.index("--serve") + 1].split(","))})
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--requests", type=int, default=300, help="in-process rejections per shape per round")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"some of: {', '.join(SHAPES)}")
    parser.add_argument("--inprocess-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = args.shapes.split(",")
    if unknown := set(chosen) - set(SHAPES):
        parser.error(f"unknown shapes: {', '.join(sorted(unknown))}")
    result = main(chosen, args.rounds, args.duration, args.connections, args.requests, not args.inprocess_only)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        nan = float("nan")
        http_rows = result.get("server_cpu_us_per_429", {})
        print(f"{'header':32s} {'server CPU µs/429':>17s} {'ratio':>6s} {'bare 429':>8s} {'gate share':>10s} "
              f"{'in-process µs':>13s} {'ratio':>6s}")  # fmt: skip
        for key, row in result["inprocess_us_per_rejection"].items():
            name = result["shapes"][key]
            served = http_rows.get(key, {"us": nan, "ratio": nan})
            floor = result.get("bare_429_cpu_us", {}).get(key, nan)
            share = result.get("gate_share_cpu_us", {}).get(key, nan)
            print(f"{name:32s} {served['us']:17.1f} {served['ratio']:6.2f} {floor:8.1f} {share:10.1f} "
                  f"{row['us']:13.1f} {row['ratio']:6.2f}")  # fmt: skip
