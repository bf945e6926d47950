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
/metrics (clients holding a place in the retry schedule, requests held by pacing), and every second the
gate's state (μ, its rate, the estimator's state, in flight and the in-flight limit). It reports: RSS
growth from the end of the warm-up (the first minute) to the end (target < 5 %), the 5xx answered in each
second of the run, by kind of client, beside the gate's state in that second and the one before, and how many
came after the first second of the overload (target 0: the overload starts with the run, and a request let in
within its first second waits up to the demo's 1 s queue timeout for its 503, so second 2 on), and the largest
size each structure reached against its cap. Loopback only; bounded by --minutes (a float: 1.5 is 90 s).
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
#: The gate's state, read every second to place each 503 beside what the gate knew then.
TRACED = {"admitgate_capacity_requests_per_second": "mu", "admitgate_rate_requests_per_second": "rate",
          "admitgate_inflight_requests": "inflight", "admitgate_inflight_limit_requests": "inflight_limit",
          "admitgate_latency_seconds": "latency", "admitgate_baseline_latency_seconds": "baseline"}  # fmt: skip


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def scrape(host: str, port: int, names: dict[str, str] = GAUGES) -> dict[str, float | str]:
    """The gauges in ``names`` (metric -> key) from /metrics, and the estimator's state under ``state``."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = (await reader.read()).decode()
    writer.close()
    out: dict[str, float | str] = {}
    for line in data.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = round(float(value), 4)
        elif name.startswith("admitgate_estimator_state{") and float(value) == 1:
            out["state"] = name.partition('state="')[2].partition('"')[0]
    return out


async def soak(host: str, port: int, pid: int, minutes: float, clients: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    start = time.monotonic()
    stop = start + minutes * 60
    statuses: dict[int, int] = {}
    failed: dict[int, dict[str, int]] = {}  # second of the run -> kind of client -> 5xx answered in it
    think = clients / 400.0  # mean seconds between a client's served request and its next: ~400 first tries/s

    async def client(i: int) -> None:
        ignores, rotates = rng.random() < 0.2, rng.random() < 0.05
        kind = "rotating" if rotates else "ignoring" if ignores else "obeying"
        conn = Http1Client(host, port, keep_alive=not rotates, cookies=not rotates)
        await asyncio.sleep(rng.uniform(0, think))
        while time.monotonic() < stop:
            status, retry_after = await conn.get("/work", timeout=30)
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500:
                tally = failed.setdefault(int(time.monotonic() - start), {})
                tally[kind] = tally.get(kind, 0) + 1
            if 200 <= status < 300:
                delay = rng.expovariate(1 / think)
            elif ignores or retry_after is None:
                delay = 0.1
            else:
                delay = retry_after
            await asyncio.sleep(max(0.0, min(delay, stop - time.monotonic())))
        conn.close()

    samples: list[dict] = []
    trace: dict[int, dict] = {}  # second of the run -> the gate's state then

    async def sample() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(1)
            t = int(time.monotonic() - start)
            trace[t] = await scrape(host, port, TRACED)
            if t // 10 > (samples[-1]["t"] // 10 if samples else 0):
                gauges = await scrape(host, port)
                samples.append({"t": t, "rss_mib": round(rss_mib(pid), 1), **gauges})

    sampler = asyncio.ensure_future(sample())
    await asyncio.gather(*(client(i) for i in range(clients)))
    sampler.cancel()
    warm = [s for s in samples if s["t"] >= 60] or samples
    growth = (warm[-1]["rss_mib"] / warm[0]["rss_mib"] - 1) if warm else None
    late = {t: n for t, n in failed.items() if t >= 2}  # after the first second of overload and its 1 s queue
    return {
        "minutes": minutes, "clients": clients, "statuses": dict(sorted(statuses.items())),
        "server_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "server_5xx_after_first_second": sum(sum(k.values()) for k in late.values()),
        "server_5xx_by_second": {t: failed[t] for t in sorted(failed)},
        "gate_around_5xx": {t: trace.get(t) for t in sorted({u for t in failed for u in (t - 1, t)}) if t in trace},
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
        print(f"  5xx                   {out['server_5xx']}, {out['server_5xx_after_first_second']} after the first "
              "second of overload   (target 0)")  # fmt: skip
        print(f"  RSS after warm-up     {out['rss_after_warmup_mib']} MiB -> end {out['rss_end_mib']} MiB, growth "
              f"{growth:.1%}   (target < 5 %)")  # fmt: skip
        print(f"  most clients holding a place {out['max_holders']:g} (cap max_keys = 100,000); most held by pacing "
              f"{out['max_waiters']:g}")  # fmt: skip
