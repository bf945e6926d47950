"""Live capacity on a real server: the demo behind AdmitGate with the bdp estimator, 2x overload, a step.

    python bench/estimator_live.py [--seconds 40] [--json]

The demo service (20 workers × 100 ms: 200/s) runs in its own process on core 0, with
``ADMITGATE_ESTIMATOR=bdp`` and metrics at /metrics. An open-loop Poisson load of 400/s (2x) runs
on core 1, with no retries. Halfway through, the service gets twice as slow (``/stats?service_time=0.2``:
capacity 100/s, baseline latency doubled). Every 0.5 s the script reads the gate's capacity estimate
from /metrics. It reports, per phase: the estimate against the truth, and when it was first within 15 %
after the step; goodput; p99 latency of 200s (client-side, so it includes pacing); the admitted rate's
coefficient of variation per second; and the 5xx count. Loopback only; bounded by --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from lab.http1 import Http1Client  # noqa: E402
from lab.serving import free_port, pin  # noqa: E402

GAUGES = {"admitgate_capacity_requests_per_second": "mu", "admitgate_rate_requests_per_second": "rate",
          "admitgate_baseline_latency_seconds": "baseline", "admitgate_latency_seconds": "latency"}  # fmt: skip


async def scrape(port: int) -> dict[str, float | str]:
    """The gate's gauges and estimator state from /metrics."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = (await reader.read()).decode()
    writer.close()
    out: dict[str, float | str] = {}
    for line in data.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES:
            out[GAUGES[name]] = round(float(value), 4)
        elif name.startswith("admitgate_estimator_state{"):
            out["state"] = name.split('state="')[1].split('"')[0]
    return out


async def get(port: int, path: str) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


async def run(port: int, seconds: float, rate: float) -> dict:
    start = time.monotonic()
    step_at = seconds / 2
    results: list[tuple[float, int, float]] = []  # (sent, status, latency)
    estimates: list[tuple[float, dict, float]] = []
    pool = [Http1Client("127.0.0.1", port, cookies=False) for _ in range(256)]
    free = list(pool)
    stepped = False

    async def one(conn: Http1Client) -> None:
        sent = time.monotonic()
        status, _ = await conn.get("/work", timeout=10)
        results.append((sent - start, status, time.monotonic() - sent))
        free.append(conn)

    tasks = set()
    next_sample = 0.0
    while (now := time.monotonic() - start) < seconds:
        if not stepped and now >= step_at:
            await get(port, "/stats?service_time=0.2")
            stepped = True
        if now >= next_sample:
            next_sample += 0.5
            estimates.append((now, await scrape(port), 200.0 if now < step_at else 100.0))
        if free:
            task = asyncio.ensure_future(one(free.pop()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.sleep(random.expovariate(rate))
    await asyncio.gather(*tasks)
    for conn in pool:
        conn.close()

    def phase(lo: float, hi: float, truth: float) -> dict:
        window = [(t, s, lat) for t, s, lat in results if lo <= t < hi]
        ok = [lat for _, s, lat in window if s == 200]
        per_second = [sum(1 for t, s, _ in window if s == 200 and int(t) == sec) for sec in range(int(lo), int(hi))]
        est = [e["mu"] for t, e, _ in estimates if lo <= t < hi and "mu" in e]
        return {
            "goodput_of_capacity": round(len(ok) / ((hi - lo) * truth), 3),
            "p99_latency_s": round(sorted(ok)[int(0.99 * len(ok))], 3) if ok else None,
            "admitted_cv": round(statistics.pstdev(per_second) / statistics.fmean(per_second), 3)
            if per_second
            else None,
            "estimate_median": round(statistics.median(est), 1) if est else None,
            "truth": truth,
            "5xx": sum(1 for _, s, _ in window if s >= 500),
            "transport_errors": sum(1 for _, s, _ in window if s == 0),
        }

    first_within = next((t - step_at for t, e, truth in estimates
                         if t >= step_at and "mu" in e and abs(e["mu"] / truth - 1) <= 0.15), None)  # fmt: skip
    return {
        "before_step": phase(5.0, step_at, 200.0),
        "after_step": phase(step_at + 5.0, seconds, 100.0),
        "estimate_within_15pct_after_step_s": None if first_within is None else round(first_within, 1),
        "estimates": [(round(t, 1), e) for t, e, _ in estimates],  # e: mu, rate, baseline, latency, state
    }


def main(seconds: float) -> dict:
    port = free_port()
    env = {**os.environ, "ADMITGATE_ESTIMATOR": "bdp", "ADMITGATE_CAPACITY_INITIAL": "100"}
    server = subprocess.Popen([sys.executable, "-m", "admitgate", "demo", "--port", str(port), "--quiet"], env=env,
                              preexec_fn=lambda: pin(0))  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                asyncio.run(get(port, "/stats"))
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("demo server did not start") from None
                time.sleep(0.2)
        if (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {1})
        return asyncio.run(run(port, seconds, 400.0))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = main(args.seconds)
    if args.json:
        print(json.dumps(result))
    else:
        for name in ("before_step", "after_step"):
            print(name, result[name])
        print("estimate within 15 % of the truth after the step:", result["estimate_within_15pct_after_step_s"], "s")
        print("estimates (t, μ):", result["estimates"])
