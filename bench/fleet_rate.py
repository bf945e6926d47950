"""Fleet rate: four replicas sharing one budget in Redis admit the fleet's rate together, no more and no less.

    python bench/fleet_rate.py [--rate 200] [--offered 500] [--seconds 5] [--rounds 3] [--json]

Four uvicorn replicas (:func:`replica`: ``rate`` = the fleet's, ``backend`` = a throwaway redis-server, no
pacing and no tarpit, so each request is admitted or turned away at once) run on core 0. From core 1, open-loop
GETs at ``--offered`` requests/s over 16 keep-alive connections spread over the replicas. After two seconds for
the leases and the fleet's membership to settle, the 200s are counted for ``--seconds``. Reported per round and
as the median: requests admitted per second against ``--rate`` (target: within 5 %), and every status seen
(target: 200 and 429 only). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from fleet_herd import fleet  # noqa: E402

from lab.http1 import Http1Client  # noqa: E402
from lab.serving import pin  # noqa: E402

REPLICAS = 4
CONNECTIONS = 16
SETTLE = 2.0  # seconds before counting: the first leases, and every replica counting the others


def replica() -> object:
    """One replica (``uvicorn fleet_rate:replica --factory``): ``FLEET_RATE`` for the fleet, shared in ``REDIS_URL``."""
    from admitgate import AdmitGate, Settings

    async def ok(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return AdmitGate(ok, rate=float(os.environ["FLEET_RATE"]), backend=os.environ["REDIS_URL"], exempt=("/health",),
                     settings=Settings(burst=20, max_pacing_delay=0, tarpit=0))  # fmt: skip


async def offer(bases: list[str], rate: float, seconds: float) -> tuple[float, dict[int, int]]:
    """Open-loop GETs at ``rate``/s for ``SETTLE + seconds``; the 200s per second after ``SETTLE``, every status."""
    ports = [int(base.rsplit(":", 1)[1]) for base in bases]
    conns = [Http1Client("127.0.0.1", ports[i % len(ports)]) for i in range(CONNECTIONS)]
    interval = CONNECTIONS / rate
    start = time.monotonic()
    begin, end = start + SETTLE, start + SETTLE + seconds
    statuses: Counter[int] = Counter()
    admitted = 0

    async def run(conn: Http1Client, offset: float) -> None:
        nonlocal admitted
        await asyncio.sleep(offset)
        while (sent := time.monotonic()) < end:
            status, _ = await conn.get("/", timeout=30)
            statuses[status] += 1
            admitted += status == 200 and begin <= sent
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - sent)))
        conn.close()

    await asyncio.gather(*(run(c, i * interval / CONNECTIONS) for i, c in enumerate(conns)))
    return admitted / seconds, dict(statuses)


def main(rate: float, offered: float, seconds: float, rounds: int) -> dict:
    pin(1)
    runs, ratios, other = [], [], 0
    for _ in range(rounds):  # a fresh fleet and Redis each round
        with fleet(rate, REPLICAS, app="fleet_rate:replica") as bases:
            admitted, statuses = asyncio.run(offer(bases, offered, seconds))
        ratios.append(round(admitted / rate, 3))
        other += sum(n for status, n in statuses.items() if status not in (200, 429))
        runs.append({"admitted_per_s": round(admitted, 1), "ratio": ratios[-1], "statuses": statuses})
    return {"replicas": REPLICAS, "rate": rate, "offered_per_s": offered, "seconds": seconds, "runs": runs,
            "ratio_median": statistics.median(ratios), "other_statuses": other}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="the fleet's rate, requests/s")
    parser.add_argument("--offered", type=float, default=500.0, help="requests/s offered, all replicas together")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = main(args.rate, args.offered, args.seconds, args.rounds)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{REPLICAS} replicas sharing {args.rate:g}/s in Redis, {args.offered:g} requests/s offered")
        for run in out["runs"]:
            print(f"  admitted {run['admitted_per_s']:7.1f}/s = {run['ratio']:.3f} x the rate   {run['statuses']}")
        print(f"  median {out['ratio_median']:.3f} x the rate (target 0.95-1.05); "
              f"statuses other than 200/429: {out['other_statuses']} (target 0)")  # fmt: skip
