"""A herd behind a real nginx beside the same herd reached directly, and a flooder beside honest newcomers, in one
run, written to one results file.

    python bench/proxy_herd.py [--clients 2000] [--identities 2000] [--deadline 90] [--honest-for 20]
                               [--parts herd,flood] [--out FILE] [--json]

**Herd.** The demo app (20 workers × 100 ms = 200 req/s, one uvicorn worker with its default flags, the gate with
its defaults) on core 0; 2,000 clients released at once on core 1, each on its own keep-alive connection, keeping no
cookies and sleeping as urllib3's ``Retry`` does (Retry-After as told), beside 20 req/s of new arrivals, one try each
on a new connection. Reached directly; behind nginx with its typical lines (X-Forwarded-For, no port); behind nginx
with the client's port forwarded (``Forwarded: for="addr:port"``, ``Identity(trusted_hops=1,
forwarded="forwarded")``); and behind nginx with its typical lines with the clients from 250 networks (8 to a /24 of
127.1.0.0/16, new arrivals among them: real herds come from many addresses, which X-Forwarded-For carries; the other
cases come from 127.0.0.1 alone). nginx (``lab/nginx.py``: its own config in a temp directory, a free loopback port, its
upstream without keep-alive, as nginx's defaults are) is not pinned.

**Flood.** The demo app with ``--rate 200``; honest newcomers at 20/s from 127.0.0.1, each on a connection of its
own, keeping its cookie and obeying Retry-After until served, for ``--honest-for`` s; 6 s in, one source rotates
``--identities`` identities within a second and never comes back: a new connection each from 127.0.1.1 (another
/24), or with ``trusted_hops=1`` reached directly, a forged X-Forwarded-For each (the deployment mistake the docs
warn about). Figures: the Retry-After told to honest newcomers from the flood on, and their wait from first try
to service.

Each figure stands beside its target; only 127.0.0.0/8 is targeted, and every run is bounded by ``--deadline``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from admitgate.sim.summary import summarise  # noqa: E402
from lab.herd import run_herd  # noqa: E402
from lab.http1 import Http1Client  # noqa: E402
from lab.nginx import TYPICAL, WITH_PORT, nginx_proxy  # noqa: E402
from lab.serving import demo_server, pin  # noqa: E402

CAPACITY, NEW = 200.0, 20.0
FORWARDED_PORT = {"ADMITGATE_TRUSTED_HOPS": "1", "ADMITGATE_FORWARDED": "forwarded"}
#: Networks (IPv4 /24s of 127.0.0.0/8) the clients of a herd from many networks come from, CLIENTS_PER_NET each.
NETWORKS, CLIENTS_PER_NET = 250, 8


def many_networks(index: int) -> str:
    """The local address of connection ``index`` (herd clients first, then new arrivals) in a herd from many
    networks: 8 clients to a /24, 250 /24s, new arrivals spread over the same /24s."""
    net = index // CLIENTS_PER_NET % NETWORKS
    return f"127.1.{net}.{10 + index % CLIENTS_PER_NET}"


#: name -> (nginx lines in front, or None: reached directly; the gate's environment; the local address of each
#: connection, or None: 127.0.0.1 for all)
HERDS: dict[str, tuple[str | None, dict[str, str], Callable[[int], str] | None]] = {
    "direct": (None, {}, None),
    "nginx, typical lines": (TYPICAL, {}, None),
    "nginx, port forwarded": (WITH_PORT, FORWARDED_PORT, None),
    "nginx, typical lines, 250 networks": (TYPICAL, {}, many_networks),
}
HERD_TARGETS = {"drain_ratio": 1.15, "new_served": 0.95, "server_5xx": 0, "new_429_held": 0}
#: A 429 that took this long (seconds) was held: the tarpit of a client back before its time (1 s), or a pacing
#: hold that ended in a 429.
HELD = 0.5
HERD_KEYS = ["drain_ratio", "new_served", "server_5xx", "edge_peak_to_avg", "attempts", "retry_after_max",
             "finished", "bound_s", "drain_s", "status_counts"]  # fmt: skip
#: name -> (the gate's environment, how the flooder rotates identities)
FLOODS: dict[str, tuple[dict[str, str], str]] = {
    "connections from one /24": ({}, "connections"),
    "forged X-Forwarded-For, trusted_hops=1": ({"ADMITGATE_TRUSTED_HOPS": "1"}, "forged"),
}
FLOOD_AT = 6.0


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (the demo server, a child process, reads ADMITGATE_* from it)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def herd(name: str, clients: int, deadline: float) -> dict[str, Any]:
    lines, env, addresses = HERDS[name]
    errors: list[str] = []
    with environment(env), demo_server([], cpu=0) as app:
        if lines is None:
            result = asyncio.run(run_herd(app, clients, background_rate=NEW, deadline=deadline, policy="urllib3",
                                          addresses=addresses))  # fmt: skip
        else:
            with nginx_proxy(int(app.rsplit(":", 1)[1]), lines, errors=errors) as base:
                result = asyncio.run(run_herd(base, clients, background_rate=NEW, deadline=deadline,
                                              policy="urllib3", addresses=addresses))  # fmt: skip
        service = httpx.get(app + "/stats", timeout=10).json()
    summary = summarise(result, CAPACITY - NEW)
    out = {k: summary.get(k) for k in HERD_KEYS}
    # where a 5xx came from: the demo service's own 503 (no worker within its queue timeout), or nginx's (an
    # upstream error in its log)
    out["service_503"], out["nginx_errors"] = service["timeouts"], [line.split(" ", 4)[-1] for line in errors]
    # 429s answered to new arrivals (fresh cookie-less connections), and those held first: the tarpit of a client
    # taken for one back early, or a pacing hold that ended in a 429 (from outside the two look alike)
    fresh = [a for a in result.attempts if a.client < 0 and a.status == 429]
    out["new_429"], out["new_429_held"] = len(fresh), sum(a.done - a.sent >= HELD for a in fresh)
    out["met"] = {k: out[k] is not None and (out[k] >= t if k == "new_served" else out[k] <= t)
                  for k, t in HERD_TARGETS.items()}  # fmt: skip
    return out


async def flood_run(port: int, identities: int, how: str, honest_for: float, seed: int = 1) -> dict[str, Any]:
    """Honest newcomers for ``honest_for`` s, the flood FLOOD_AT s in; their Retry-Afters and waits from the flood
    on."""
    rng = random.Random(seed)
    start = time.monotonic()
    told: list[tuple[float, int]] = []  # (seconds since start, Retry-After) told to honest newcomers
    waits: list[tuple[float, float]] = []  # (first try, seconds until served) of honest newcomers
    unserved: list[float] = []
    flood_status: dict[int, int] = {}

    async def honest() -> None:
        client = Http1Client("127.0.0.1", port, keep_alive=False, cookies=True)
        first = time.monotonic() - start
        while time.monotonic() - start < honest_for + 60:
            status, retry_after = await client.get("/work")
            if 200 <= status < 300:
                waits.append((first, time.monotonic() - start - first))
                return
            if retry_after is None:
                await asyncio.sleep(1.0)
                continue
            told.append((time.monotonic() - start, retry_after))
            await asyncio.sleep(retry_after)
        unserved.append(first)

    async def forged(i: int) -> None:
        await asyncio.sleep(max(0.0, start + FLOOD_AT + i / identities - time.monotonic()))
        headers: dict[str, str] = {}
        local = ("127.0.1.1", 0)
        if how == "forged":
            headers = {"X-Forwarded-For": f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.7"}
            local = ("127.0.0.1", 0)
        status = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError, asyncio.TimeoutError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            writer.write(f"GET /work HTTP/1.1\r\nHost: gate\r\n{extra}\r\n".encode())
            line = await asyncio.wait_for(reader.readline(), 30)
            status = int(line.split(b" ", 2)[1])
            writer.close()
        flood_status[status] = flood_status.get(status, 0) + 1

    tasks = [asyncio.ensure_future(forged(i)) for i in range(identities)]
    honest_tasks = []
    at = 0.0
    while at < honest_for:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        honest_tasks.append(asyncio.ensure_future(honest()))
        at += rng.expovariate(NEW)
    await asyncio.gather(*tasks, *honest_tasks)
    after = [r for t, r in told if t >= FLOOD_AT]
    waited = [w for t, w in waits if t >= FLOOD_AT]
    return {
        "honest_newcomers": len(honest_tasks), "honest_unserved": len(unserved),
        "honest_retry_after_p50": statistics.median(after) if after else None,
        "honest_retry_after_max": max(after, default=None),
        "honest_wait_p50_s": round(statistics.median(waited), 3) if waited else None,
        "honest_wait_max_s": round(max(waited), 3) if waited else None,
        "flood_statuses": flood_status,
    }  # fmt: skip


def flood(name: str, identities: int, honest_for: float) -> dict[str, Any]:
    env, how = FLOODS[name]
    with environment(env), demo_server(["--rate", str(int(CAPACITY))], cpu=0) as app:
        return asyncio.run(flood_run(int(app.rsplit(":", 1)[1]), identities, how, honest_for))


def main(clients: int, identities: int, deadline: float, parts: list[str], honest_for: float = 20.0) -> dict[str, Any]:
    pin(1)
    try:  # the load generator must not be the bottleneck: uvloop where installed
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    bound = round(clients / (CAPACITY - NEW), 3)
    out: dict[str, Any] = {"clients": clients, "identities": identities, "bound_s": bound, "herd_targets": HERD_TARGETS}
    if "herd" in parts:
        out["herd"] = {name: herd(name, clients, deadline) for name in HERDS}
    if "flood" in parts:
        out["flood"] = {name: flood(name, identities, honest_for) for name in FLOODS}
    return out


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['clients']} cookie-less clients (urllib3 Retry) vs 200 req/s with 20 req/s of new arrivals; "
             f"M/(μ−λ₀) = {result['bound_s']} s; targets {result['herd_targets']}"]  # fmt: skip
    for name, m in result.get("herd", {}).items():
        mark = " ".join(f"{k} {m[k]} {'✓' if ok else '✗'}" for k, ok in m["met"].items())
        lines.append(f"  {name}: {mark} (of {m['new_429']} 429s to new arrivals); edge peak/avg "
                     f"{m['edge_peak_to_avg']}, tries {m['attempts']}, "
                     f"Retry-After max {m['retry_after_max']}, finished {m['finished']}; statuses "
                     f"{m['status_counts']}, the service's 503s {m['service_503']}, nginx errors "
                     f"{len(m['nginx_errors'])}")  # fmt: skip
    for name, m in result.get("flood", {}).items():
        lines.append(f"  flood ({result['identities']} identities in 1 s), {name}: honest Retry-After p50/max "
                     f"{m['honest_retry_after_p50']}/{m['honest_retry_after_max']} s, wait to service p50/max "
                     f"{m['honest_wait_p50_s']}/{m['honest_wait_max_s']} s, unserved {m['honest_unserved']} of "
                     f"{m['honest_newcomers']}; flood statuses {m['flood_statuses']}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--identities", type=int, default=2000)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--honest-for", type=float, default=20.0, help="seconds of honest newcomers in a flood run")
    parser.add_argument("--parts", default="herd,flood")
    parser.add_argument("--out", help="write the results (JSON) here too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = main(args.clients, args.identities, args.deadline, args.parts.split(","), args.honest_for)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if args.json else report(result))
