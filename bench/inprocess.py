"""In-process overhead: drive ASGI apps directly in a loop, no sockets (a far steadier figure than HTTP).

    python bench/inprocess.py [--rounds 15] [--requests 50000] [--json]

Reports, as medians over interleaved rounds:
* µs per request for a trivial ASGI app, a pure-ASGI pass-through around it, and AdmitGate on its
  admit path (non-binding rate) around it; the gate's *added* cost is gate − trivial, per round;
* the same behind the default gate (``AdmitGate(app)``: the ``delay`` estimator, with the probes it reads);
* the same around a Starlette hello-world app;
* the token pacer's decision alone (``TokenPacer.try_take``), in ns;
* with ``--instructions``: CPU instructions per request counted by valgrind's callgrind, which are
  the same from run to run whatever else the machine is doing (timings here drift by 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, Settings
from admitgate.core.pacer import TokenPacer

SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
         "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
         "server": ("127.0.0.1", 8000),
         "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"b"), (b"x-api-key", b"tenant-1")]}  # fmt: skip
REQUEST = {"type": "http.request", "body": b"", "more_body": False}


async def receive():
    return REQUEST


async def send(message):
    return None


async def trivial(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class PassThrough:
    """The cheapest possible pure-ASGI middleware: the floor any middleware can reach."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, send)


def starlette_hello() -> Starlette:
    async def hello(request):
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/", hello)])


def gate(app):
    return AdmitGate(app, rate=1e9, settings=Settings(burst=1e9))


def tenants(app):
    """Tenants on, keyed by x-api-key (the scope carries one): each request is decided in its tenant's pool."""
    from admitgate import Tenancy

    return AdmitGate(app, rate=1e9, settings=Settings(burst=1e9), tenants=Tenancy(key="header:x-api-key"))


def live(app, metrics: bool = False):
    """Live capacity (probes on every request), optionally with Prometheus metrics (read at scrape time)."""
    from prometheus_client import CollectorRegistry

    from admitgate import BandwidthDelay, LiveCapacity

    source = LiveCapacity(BandwidthDelay(seed=1), initial=1e9, ceiling=1e9)
    return AdmitGate(app, rate=source, metrics=CollectorRegistry() if metrics else None, settings=Settings(burst=1e9))


def default(app):
    """The default gate: ``delay`` with its probes. Its open rate's ceiling (100,000/s) is raised out of reach: this
    loop runs requests faster than any server takes them, and at the ceiling the gate would pace (a cost no server
    sees)."""
    from admitgate import LiveCapacity, QueueDelay

    return AdmitGate(app, rate=LiveCapacity(QueueDelay(), ceiling=1e9))


def variant_apps() -> dict:
    hello = starlette_hello()
    return {
        "trivial": trivial, "passthrough": PassThrough(trivial), "admitgate": gate(trivial),
        "admitgate-tenants": tenants(trivial), "admitgate-live": live(trivial),
        "admitgate-metrics": live(trivial, metrics=True), "admitgate-default": default(trivial),
        "starlette": hello, "starlette+passthrough": PassThrough(hello), "starlette+admitgate": gate(hello),
        "starlette+admitgate-metrics": live(hello, metrics=True),
    }  # fmt: skip


#: Requests between two turns of the event loop: a server's loop turns between requests, and the default gate's lag
#: monitor (a timer) must run, or the loop reads as stalled and the gate paces.
TURN = 10


async def drive(app, n: int) -> None:
    """``n`` requests through ``app`` one after another, the event loop turned every :data:`TURN`."""
    scope = dict(SCOPE)
    for i in range(n):
        await app(scope, receive, send)
        if i % TURN == 0:
            await asyncio.sleep(0)


async def time_app(app, n: int) -> float:
    start = time.perf_counter()
    await drive(app, n)
    return (time.perf_counter() - start) / n * 1e6


def pacer_ns(n: int) -> float:
    """One admission decision of a bare pacer, in ns, the loop included: times are precomputed, so nothing is
    subtracted and the figure cannot come out below zero on a noisy machine."""
    pacer = TokenPacer(1e9, 1e9)
    take = pacer.try_take
    times = [i * 1e-6 for i in range(1, n + 1)]
    start = time.perf_counter_ns()
    for now in times:
        take(1.0, now)
    return (time.perf_counter_ns() - start) / n


async def main(rounds: int, n: int) -> dict:
    variants = variant_apps()
    for app in variants.values():  # warm up
        await time_app(app, 2000)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    added: list[float] = []
    added_live: list[float] = []
    added_default: list[float] = []
    added_tenants: list[float] = []
    added_metrics: list[float] = []
    added_starlette: list[float] = []
    pacer: list[float] = []
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        got = {name: await time_app(variants[name], n) for name in order}
        for name, value in got.items():
            samples[name].append(value)
        added.append(got["admitgate"] - got["trivial"])
        added_live.append(got["admitgate-live"] - got["trivial"])
        added_default.append(got["admitgate-default"] - got["trivial"])
        added_tenants.append(got["admitgate-tenants"] - got["trivial"])
        added_metrics.append(got["admitgate-metrics"] - got["trivial"])
        added_starlette.append(got["starlette+admitgate"] - got["starlette"])
        pacer.append(pacer_ns(n))
    med = {name: round(statistics.median(v), 3) for name, v in samples.items()}
    return {
        "rounds": rounds,
        "requests_per_round": n,
        "us_per_request_median": med,
        "admitgate_added_us_median": round(statistics.median(added), 3),
        "admitgate_live_added_us_median": round(statistics.median(added_live), 3),
        "admitgate_default_added_us_median": round(statistics.median(added_default), 3),
        "admitgate_tenants_added_us_median": round(statistics.median(added_tenants), 3),
        "admitgate_metrics_added_us_median": round(statistics.median(added_metrics), 3),
        "starlette_metrics_ratio_median": round(statistics.median(s / g for s, g in zip(
            samples["starlette"], samples["starlette+admitgate-metrics"], strict=True)), 3),
        "admitgate_added_over_starlette_us_median": round(statistics.median(added_starlette), 3),
        "starlette_ratio_median": round(statistics.median(
            s / g for s, g in zip(samples["starlette"], samples["starlette+admitgate"], strict=True)), 3),
        "pacer_decision_ns_median": round(statistics.median(pacer), 1),
    }  # fmt: skip


def _run_variant(name: str, n: int) -> None:
    """Child mode: run ``n`` requests through one variant (the parent counts instructions)."""
    asyncio.run(drive(variant_apps()[name], n))


def instructions(name: str, n: int) -> int:
    """Total instructions (callgrind Ir) of a child process running ``n`` requests of ``name``.

    The child's hash seed is fixed: string hashes decide dict collisions, and with a random seed the same
    code's count moves by a few hundred instructions a request between runs.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
               "--child", name, "--requests", str(n)]  # fmt: skip
        env = dict(os.environ, PYTHONHASHSEED="0")
        log = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True, env=env).stderr
    match = re.search(r"Collected : (\d+)", log)
    if not match:
        raise RuntimeError(log[-2000:])
    return int(match.group(1))


def instruction_counts(n: int) -> dict:
    per_request = {}
    for name in (
        "trivial",
        "passthrough",
        "admitgate",
        "admitgate-tenants",
        "admitgate-live",
        "admitgate-default",
        "admitgate-metrics",
        "starlette",
        "starlette+admitgate",
        "starlette+admitgate-metrics",
    ):
        per_request[name] = (instructions(name, n) - instructions(name, 0)) / n
    return {
        "requests": n,
        "instructions_per_request": {k: round(v) for k, v in per_request.items()},
        "admitgate_added_instructions": round(per_request["admitgate"] - per_request["trivial"]),
        "admitgate_tenants_added_instructions": round(per_request["admitgate-tenants"] - per_request["trivial"]),
        "admitgate_live_added_instructions": round(per_request["admitgate-live"] - per_request["trivial"]),
        "admitgate_default_added_instructions": round(per_request["admitgate-default"] - per_request["trivial"]),
        "admitgate_metrics_added_instructions": round(per_request["admitgate-metrics"] - per_request["trivial"]),
        "starlette_metrics_instruction_ratio": round(
            per_request["starlette"] / per_request["starlette+admitgate-metrics"], 4
        ),
        "starlette_instruction_ratio": round(per_request["starlette"] / per_request["starlette+admitgate"], 4),
    }


if __name__ == "__main__":
    if "--child" in sys.argv:
        _run_variant(sys.argv[sys.argv.index("--child") + 1], int(sys.argv[sys.argv.index("--requests") + 1]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    args = parser.parse_args()
    result = asyncio.run(main(args.rounds, args.requests))
    if args.instructions:
        result["callgrind"] = instruction_counts(min(args.requests, 5000))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, value in result["us_per_request_median"].items():
            print(f"{name:24s} {value:8.3f} µs/request")
        print(f"admitgate added (vs trivial app)     {result['admitgate_added_us_median']:.3f} µs")
        print(f"admitgate added (vs Starlette hello) {result['admitgate_added_over_starlette_us_median']:.3f} µs")
        print(f"admitgate live added (vs trivial)    {result['admitgate_live_added_us_median']:.3f} µs")
        print(f"admitgate default added (vs trivial) {result['admitgate_default_added_us_median']:.3f} µs")
        print(f"admitgate tenants added (vs trivial) {result['admitgate_tenants_added_us_median']:.3f} µs")
        print(f"admitgate live+metrics added         {result['admitgate_metrics_added_us_median']:.3f} µs")
        print(f"Starlette ratio gate+metrics/bare    {result['starlette_metrics_ratio_median']:.3f}")
        print(f"Starlette throughput ratio gate/bare {result['starlette_ratio_median']:.3f}")
        print(f"pacer decision                       {result['pacer_decision_ns_median']:.1f} ns")
        if "callgrind" in result:
            cg = result["callgrind"]
            for name, value in cg["instructions_per_request"].items():
                print(f"{name:24s} {value:8d} instructions/request")
            print(f"admitgate added                      {cg['admitgate_added_instructions']} instructions")
            print(f"Starlette instruction ratio bare/gate {cg['starlette_instruction_ratio']:.4f}")
