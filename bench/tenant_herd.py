"""A herd in one tenant beside a small tenant, against a real uvicorn on loopback.

    python bench/tenant_herd.py [--clients 2000] [--small 10] [--tenants 1] [--new 0] [--rounds 1] [--rate R]
                                [--compare] [--slowapi] [--json]

``admitgate demo`` on its defaults (the capacity learnt live, no hint) with tenants on
(``ADMITGATE_TENANTS_KEY=header:x-api-key``). 2,000 clients of tenant ``big`` are released at once (each
on its own keep-alive connection, obeying Retry-After); beside them 10 clients of tenant ``small`` each ask
once a second, obeying Retry-After, from 6 s before the release until the herd has drained. No new
arrivals without a key. Reported beside the targets of the fair-share issue: how long the small tenant's
requests took to be served (first try to 2xx) during the herd, the Retry-After values it was told (a small
tenant is served within one Retry-After of 1-2 s), and the herd's drain time against M / (μ − the small
tenant's rate), where μ = 200/s (20 workers × 100 ms). Server on core 0, load on core 1. Also against
M / (μ − what the small tenant was served during the drain) (``herd_drain_ratio_left``): without tenants the small
tenant is pushed back and the herd drains on its share, so ``--compare`` reads the two like for like there.

``--tenants N`` spreads the herd over N tenant keys (client i is tenant ``big-{i mod N}``: a cache expiring
across a platform's customers), and ``--new R`` sends R new arrivals/s without a key beside it (their share
served on the one try they make is ``new_served``); the bound is then M / (μ − small − R). ``--rate R`` types
the capacity in (the demo's ``--rate``), and ``--compare`` runs each round a second time without tenants (the
same clients, one pool), so that what tenants cost is read apart from what the live estimator costs.
``--slowapi`` runs the rounds against the same service behind slowapi instead (``bench/slowapi_demo.py``), each
``x-api-key`` held to μ − the small tenant's rate per second (190/s: what a slowapi user types in so that the
herd's tenant gets its share), as its users write it: fixed windows of a second, Retry-After sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from admitgate.sim.summary import summarise
from lab.herd import run_herd
from lab.http1 import Http1Client
from lab.serving import demo_server, pin

HERE = Path(__file__).resolve().parent
CAPACITY = 200.0
WARMUP = 6.0


async def small_tenant(port: int, clients: int, until: asyncio.Event, log: list[dict]) -> None:
    """``clients`` clients of tenant ``small``, each asking once a second and obeying Retry-After."""
    start = time.monotonic()

    async def client(index: int) -> None:
        http = Http1Client("127.0.0.1", port, headers={"x-api-key": "small"})
        await asyncio.sleep(index / clients)
        while not until.is_set():
            first, told = time.monotonic(), []
            while not until.is_set():
                status, retry_after = await http.get("/work")
                if 200 <= status < 300 or retry_after is None:
                    break
                told.append(retry_after)
                await asyncio.sleep(retry_after)
            log.append({"at": first - start - WARMUP, "wait": time.monotonic() - first, "told": told,
                        "status": status})  # fmt: skip
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - first)))
        http.close()

    await asyncio.gather(*(client(i) for i in range(clients)))


async def one_round(base: str, clients: int, small: int, tenants: int = 1, new: float = 0.0) -> dict:
    port = int(base.rsplit(":", 1)[1])
    done, log = asyncio.Event(), []
    side = asyncio.ensure_future(small_tenant(port, small, done, log))
    keys = {"x-api-key": "big"} if tenants == 1 else lambda i: {"x-api-key": f"big-{i % tenants}"}
    result = await run_herd(base, clients, background_rate=new, warmup=WARMUP, deadline=90.0, headers=keys)
    done.set()
    await side
    herd = summarise(result, CAPACITY - small - new)
    during = [r for r in log if 0 <= r["at"] <= herd["drain_s"]]
    waits = sorted(r["wait"] for r in during)
    told = [t for r in during for t in r["told"]]
    # What the small tenant was served during the drain (requests/s), and the herd's bound at what it left: without
    # tenants the small tenant is pushed back and the herd takes its share, so its drain is read against this bound.
    small_served = sum(200 <= r["status"] < 300 for r in during) / herd["drain_s"] if herd["drain_s"] else 0.0
    bound_left = clients / (CAPACITY - small_served - new)
    return {
        "herd_drain_ratio": herd["drain_ratio"], "herd_drain_s": herd["drain_s"], "bound_s": herd["bound_s"],
        "small_served_per_s": round(small_served, 2), "bound_left_s": round(bound_left, 3),
        "herd_drain_ratio_left": round(herd["drain_s"] / bound_left, 3),
        "server_5xx": herd["server_5xx"], "herd_finished": herd["finished"], "new_served": herd["new_served"],
        "small_requests": len(during),
        "small_first_try": round(sum(not r["told"] for r in during) / len(during), 3) if during else None,
        "small_wait_p50_s": round(statistics.median(waits), 3) if waits else None,
        "small_wait_max_s": round(waits[-1], 3) if waits else None,
        "small_retry_after_max": max(told, default=None),
        "small_retried_more_than_once": sum(len(r["told"]) > 1 for r in during),
        "small_5xx": sum(r["status"] >= 500 for r in during),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--tenants", type=int, default=1, help="tenants the herd is spread over (default 1)")
    parser.add_argument("--new", type=float, default=0.0, help="new arrivals/s without a key beside the herd")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rate", type=float, help="the capacity typed in, requests/s (default: learnt live)")
    parser.add_argument("--compare", action="store_true",
                        help="each round also without tenants (no key read: one pool), alternating")  # fmt: skip
    parser.add_argument("--slowapi", action="store_true",
                        help="behind slowapi, each key held to μ − the small tenant's rate")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.slowapi and (args.compare or args.rate is not None or args.tenants != 1 or args.new):
        # (its limit is per key: N herd keys would each have μ − small, and keyless new arrivals share an address)
        parser.error("--slowapi runs the herd in one tenant beside the small one alone: no --compare, --rate, "
                     "--tenants or --new")  # fmt: skip
    if args.compare and "ADMITGATE_CONFIG" in os.environ:  # (a config file may turn tenants on in the "off" rounds)
        parser.error("--compare needs ADMITGATE_CONFIG unset")
    runs = []
    if args.slowapi:
        limit = int(CAPACITY - args.small)
        for _ in range(args.rounds):
            with demo_server(["--per-key", str(limit)], cpu=0, program=(str(HERE / "slowapi_demo.py"),)) as base:
                pin(1)
                run = asyncio.run(one_round(base, args.clients, args.small, args.tenants, args.new))
            runs.append({"gate": f"slowapi {limit}/second per key", **run})
    for _ in range(0 if args.slowapi else args.rounds):
        for tenants in (True, False) if args.compare else (True,):
            if tenants:
                os.environ["ADMITGATE_TENANTS_KEY"] = "header:x-api-key"  # the demo server reads it
            else:  # (every tenants' setting: any one of them left, the demo server builds a table on the defaults)
                for name in [n for n in os.environ if n.startswith("ADMITGATE_TENANTS_")]:
                    del os.environ[name]
            with demo_server([] if args.rate is None else ["--rate", str(args.rate)], cpu=0) as base:
                pin(1)
                run = asyncio.run(one_round(base, args.clients, args.small, args.tenants, args.new))
            runs.append({"tenants_on": tenants, **run})
    out = {"clients": args.clients, "small": args.small, "tenants": args.tenants, "new": args.new, "rate": args.rate,
           "runs": runs, "targets": {"small_retry_after_max": 2, "small_retried_more_than_once": 0}}  # fmt: skip
    print(json.dumps(out, indent=1) if args.json else "\n".join(json.dumps(r) for r in runs))


if __name__ == "__main__":
    main()
