"""Fleet herd benchmark: one retry schedule for four replicas that share a budget in Redis.

    python bench/fleet_herd.py [--clients 5000] [--rate 400] [--rounds 3] [--tenant] [--json]

Four uvicorn replicas (``bench/apps.py:fleet_replica``, the gate's defaults, ``rate`` = the fleet's
capacity, ``backend`` = a throwaway redis-server) run on core 0; a herd of ``--clients`` obeying
clients, split 70/10/10/10 over the replicas (each client keeps to its replica, on its own keep-alive
connection), is released at once from core 1. Reported per round and as medians: the drain time
against M/H_fleet, the largest Retry-After against M/H_fleet, the most clients told to come back
within one second, and 5xx. ``--tenant``: the replicas have tenants (keyed by ``x-api-key``) and the whole
herd is one tenant's. Loopback only; each run is bounded by --deadline seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from shared import redis_server  # noqa: E402

from admitgate.sim.summary import summarise  # noqa: E402
from lab.herd import run_herd  # noqa: E402
from lab.serving import free_port, pin  # noqa: E402

SPLIT = (7, 1, 1, 1)


def replicas(url: str, rate: float, n: int = 4, app: str = "apps:fleet_replica",
             env: dict[str, str] | None = None) -> tuple[list[subprocess.Popen], list[str]]:  # fmt: skip
    """Start ``n`` uvicorn replicas of ``app`` (a factory in bench/) sharing ``url``; wait until they answer."""
    env = {**os.environ, "REDIS_URL": url, "FLEET_RATE": str(rate), **(env or {})}
    ports = [free_port() for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--factory", "--port", str(p),
                               "--host", "127.0.0.1", "--log-level", "warning"], cwd=HERE, env=env,
                              preexec_fn=lambda: pin(0)) for p in ports]  # fmt: skip
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    deadline = time.monotonic() + 30
    for base in bases:
        while True:
            try:
                httpx.get(base + "/health", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas did not start") from None
                time.sleep(0.1)
    return procs, bases


@contextlib.contextmanager
def fleet(
    rate: float, n: int = 4, app: str = "apps:fleet_replica", env: dict[str, str] | None = None
) -> Iterator[list[str]]:
    """A throwaway redis-server and ``n`` replicas of ``app`` sharing it: yields their base URLs, then stops them."""
    server, url = redis_server()
    try:
        procs, bases = replicas(url, rate, n, app, env)
        try:
            yield bases
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


def one_round(clients: int, rate: float, deadline: float, tenant: bool = False) -> dict:
    env, headers = ({"FLEET_TENANTS": "1"}, {"x-api-key": "big"}) if tenant else (None, None)
    with fleet(rate, env=env) as bases:
        time.sleep(1.0)  # leases and membership settle
        result = asyncio.run(run_herd(bases, clients, split=SPLIT, path="/", background_rate=0, warmup=0.5,
                                      deadline=deadline, headers=headers))  # fmt: skip
    summary = summarise(result, rate)
    bound = clients / rate
    summary["retry_after_max_ratio"] = round((summary["retry_after_max"] or 0) / bound, 3)
    return summary


KEYS = ["drain_ratio", "retry_after_max_ratio", "retry_after_max", "promised_peak_per_s", "server_5xx", "attempts"]


def main(clients: int, rate: float, rounds: int, deadline: float, tenant: bool = False) -> dict:
    pin(1)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    runs = [one_round(clients, rate, deadline, tenant) for _ in range(rounds)]
    return {"clients": clients, "fleet_rate": rate, "split": SPLIT, "tenant": tenant, "bound_s": clients / rate,
            "median": {k: statistics.median(r[k] for r in runs) for k in KEYS},
            "runs": [{k: r[k] for k in KEYS} for r in runs]}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=400.0, help="the fleet's capacity, requests/s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--tenant", action="store_true", help="tenants on; the whole herd in one tenant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = main(args.clients, args.rate, args.rounds, args.deadline, args.tenant)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        m = out["median"]
        print(f"{args.clients} clients split 70/10/10/10 over 4 replicas, fleet H = {args.rate:g}/s, "
              f"M/H = {out['bound_s']:.2f} s; medians of {args.rounds} rounds")  # fmt: skip
        print(f"  drain / (M/H)           {m['drain_ratio']}   (target <= 1.15)")
        print(
            f"  largest Retry-After     {m['retry_after_max']} s = {m['retry_after_max_ratio']} x M/H   (target <= 1.2)"
        )
        print(f"  most told to one second {m['promised_peak_per_s']}")
        print(f"  5xx                     {m['server_5xx']}   (target 0)")
        for r in out["runs"]:
            print("  round:", r)
