"""Soak benchmark: ten minutes at twice the capacity against a real uvicorn, with clients that misbehave.

    python bench/soak.py [--minutes 10] [--clients 2000] [--json]

The demo service (20 workers × 100 ms = 200 req/s, the gate on its defaults: capacity learnt live)
runs under uvicorn with its default flags on core 0. On core 1, ``--clients`` clients loop for the
whole run: each asks for ``/work`` and, once served, thinks for a while and asks again, so that the
offered load of first attempts is about twice the capacity. 80 % of them obey Retry-After (sleep it
out, on their keep-alive connection, echoing the ticket cookie); 20 % ignore it and ask again every
100 ms; 5 % of all clients rotate their identity (a new connection and no cookie on every try), so
each of their tries is a stranger to the gate.

Every 10 s it samples the server's resident memory (/proc) and the gate's per-key structures from
/metrics (clients holding a place in the retry schedule, requests held by pacing). It reports: RSS
growth from the end of the warm-up (the first minute) to the end (target < 5 %), 5xx answered (target
0), and the largest size each structure reached against its cap. Loopback only; bounded by --minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from lab.http1 import Http1Client  # noqa: E402
from lab.serving import demo_process, pin  # noqa: E402

GAUGES = {"admitgate_schedule_clients": "holders", "admitgate_paced_waiting_requests": "waiters"}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def scrape(host: str, port: int) -> dict[str, float]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = (await reader.read()).decode()
    writer.close()
    out = {}
    for line in data.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES:
            out[GAUGES[name]] = float(value)
    return out


async def soak(host: str, port: int, pid: int, minutes: float, clients: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    start = time.monotonic()
    stop = start + minutes * 60
    statuses: dict[int, int] = {}
    think = clients / 400.0  # mean seconds between a client's served request and its next: ~400 first tries/s

    async def client(i: int) -> None:
        ignores, rotates = rng.random() < 0.2, rng.random() < 0.05
        conn = Http1Client(host, port, keep_alive=not rotates, cookies=not rotates)
        await asyncio.sleep(rng.uniform(0, think))
        while time.monotonic() < stop:
            status, retry_after = await conn.get("/work", timeout=30)
            statuses[status] = statuses.get(status, 0) + 1
            if 200 <= status < 300:
                delay = rng.expovariate(1 / think)
            elif ignores or retry_after is None:
                delay = 0.1
            else:
                delay = retry_after
            await asyncio.sleep(max(0.0, min(delay, stop - time.monotonic())))
        conn.close()

    samples: list[dict] = []

    async def sample() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(10)
            gauges = await scrape(host, port)
            samples.append({"t": round(time.monotonic() - start), "rss_mib": round(rss_mib(pid), 1), **gauges})

    sampler = asyncio.ensure_future(sample())
    await asyncio.gather(*(client(i) for i in range(clients)))
    sampler.cancel()
    warm = [s for s in samples if s["t"] >= 60] or samples
    growth = (warm[-1]["rss_mib"] / warm[0]["rss_mib"] - 1) if warm else None
    return {
        "minutes": minutes, "clients": clients, "statuses": dict(sorted(statuses.items())),
        "server_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "rss_after_warmup_mib": warm[0]["rss_mib"] if warm else None,
        "rss_end_mib": warm[-1]["rss_mib"] if warm else None,
        "rss_growth": round(growth, 4) if growth is not None else None,
        "max_holders": max((s.get("holders", 0) for s in samples), default=0),
        "max_waiters": max((s.get("waiters", 0) for s in samples), default=0),
        "samples": samples,
    }  # fmt: skip


def main(minutes: float, clients: int) -> dict:
    with demo_process([], cpu=0) as (base, pid):
        pin(1)
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        host, port = base.removeprefix("http://").split(":")
        return asyncio.run(soak(host, int(port), pid, minutes, clients))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = main(args.minutes, args.clients)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "soak.json").write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        growth = out["rss_growth"]
        print(f"{args.minutes:g} min at ~2x capacity, {args.clients} clients (20 % ignore Retry-After, 5 % rotate "
              "identity)")  # fmt: skip
        print(f"  statuses              {out['statuses']}")
        print(f"  5xx                   {out['server_5xx']}   (target 0)")
        print(f"  RSS after warm-up     {out['rss_after_warmup_mib']} MiB -> end {out['rss_end_mib']} MiB, growth "
              f"{growth:.1%}   (target < 5 %)")  # fmt: skip
        print(f"  most clients holding a place {out['max_holders']:g} (cap max_keys = 100,000); most held by pacing "
              f"{out['max_waiters']:g}")  # fmt: skip
