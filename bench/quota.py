"""Per-key quota across a fleet: four replicas sharing one redis-server hold one key to its quota.

    python bench/quota.py [--limit 100/minute] [--seconds 60] [--rate 200] [--json]

Four uvicorn replicas (:func:`replica`: ``Quota(limit, key="header:x-api-key")``, ``backend`` = a throwaway
redis-server, a gate far above the offered load so only the quota refuses) run on core 0. From core 1,
eight workers (two per replica, each on its own keep-alive connection) send requests with one API key,
``--rate`` requests/s together. First the key spends its burst (until the first 429); then the 200s are
counted over ``--seconds`` and reported per quota window, the figure to hold to the limit (100/minute:
100 ± 5). Also reported: the burst, the 429s, anything else (5xx: target 0). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from fleet_herd import fleet  # noqa: E402

from admitgate.asgi.quota import parse_limit  # noqa: E402
from lab.serving import pin  # noqa: E402

REPLICAS = 4
WORKERS_PER_REPLICA = 2
KEY = "bench-key"


def replica() -> object:
    """One replica (``uvicorn quota:replica --factory``): ``QUOTA_LIMIT`` per API key, shared in ``REDIS_URL``."""
    from admitgate import AdmitGate, Identity, Quota, Settings

    async def ok(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return AdmitGate(ok, rate=100_000, backend=os.environ["REDIS_URL"], identity=Identity(ticket=False),
                     settings=Settings(max_pacing_delay=0, tarpit=0),
                     quota=Quota(os.environ["QUOTA_LIMIT"], key="header:x-api-key"))  # fmt: skip


async def hammer(bases: list[str], rate: float, seconds: float) -> dict:
    """Spend the burst, then count what the fleet admits for ``seconds``."""
    statuses: Counter[int] = Counter()
    admitted: list[float] = []  # monotonic times of the 200s after the burst
    phase = {"burst": 0, "spent": False, "end": 0.0}
    period = len(bases) * WORKERS_PER_REPLICA / rate

    async def worker(base: str) -> None:
        async with httpx.AsyncClient(base_url=base, headers={"x-api-key": KEY}, timeout=5) as client:
            while not phase["spent"] or time.monotonic() < phase["end"]:
                sent, measured = time.monotonic(), phase["spent"]  # a request sent during the burst is the burst's
                response = await client.get("/")
                if not measured:
                    if response.status_code == 429 and not phase["spent"]:
                        phase.update(spent=True, end=time.monotonic() + seconds)
                    elif response.status_code == 200:
                        phase["burst"] += 1
                else:
                    statuses[response.status_code] += 1
                    if response.status_code == 200:
                        admitted.append(time.monotonic())
                await asyncio.sleep(max(0.0, period - (time.monotonic() - sent)))

    await asyncio.gather(*(worker(base) for base in bases for _ in range(WORKERS_PER_REPLICA)))
    return {"burst": phase["burst"], "statuses": dict(statuses), "admitted": len(admitted)}


def main(limit: str, seconds: float, rate: float) -> dict:
    quota = parse_limit(limit)
    pin(1)
    with fleet(0, REPLICAS, app="quota:replica", env={"QUOTA_LIMIT": limit}) as bases:
        result = asyncio.run(hammer(bases, rate, seconds))
    per_window = result["admitted"] * quota.window / seconds
    other = sum(n for status, n in result["statuses"].items() if status not in (200, 429))
    return {"limit": limit, "replicas": REPLICAS, "seconds": seconds, "offered_per_s": rate,
            "burst_admitted": result["burst"], "admitted": result["admitted"],
            "admitted_per_window": round(per_window, 1), "window_s": quota.window, "quota": quota.limit,
            "statuses": result["statuses"], "other_statuses": other}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="100/minute")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s offered, all four replicas together")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = main(args.limit, args.seconds, args.rate)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"quota {out['limit']} on one key, {REPLICAS} replicas sharing Redis, {args.rate:g} requests/s offered")
        print(f"  burst admitted at the start      {out['burst_admitted']}   (the quota's burst: {out['quota']})")
        print(f"  admitted over the next {args.seconds:g} s      {out['admitted']}")
        print(f"  admitted per {out['window_s']:g} s window          {out['admitted_per_window']}   "
              f"(target {out['quota']} ± 5)")  # fmt: skip
        print(f"  statuses                         {out['statuses']}   (other than 200/429: {out['other_statuses']})")
