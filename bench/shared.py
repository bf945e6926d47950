"""Shared-budget benchmark: the admit path with the Redis backend vs in memory vs slowapi on Redis.

    python bench/shared.py [--rounds 5] [--duration 5] [--json]

One server process (core 0) serves every variant; wrk drives them from core 1, rounds interleaved;
a throwaway redis-server (or the one at REDIS_URL) runs beside wrk. Reports requests/s as medians
with their ratio to the in-memory gate and the server's CPU per request. Then, in a separate short
run per Redis variant, **Redis round trips per 1,000 decisions**, counted by Redis itself with MONITOR:
every command a client sent while the variant was loaded (commands a Lua script runs inside Redis are
not round trips). The gate's lease loop runs all the time, whichever variant is loaded; its idle rate
is reported beside.
Only loopback; every run is bounded by --duration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from overhead import interleaved, start, wrk  # noqa: E402

from lab.redis import wait_for_redis  # noqa: E402
from lab.serving import free_port  # noqa: E402

VARIANTS = ["bare", "admitgate", "admitgate_redis", "slowapi_asgi", "slowapi_redis"]


def redis_server() -> tuple[subprocess.Popen | None, str]:
    if os.environ.get("REDIS_URL"):
        return None, os.environ["REDIS_URL"]
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    cores = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    args = [*cores, binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", tempfile.gettempdir()]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    wait_for_redis(url)
    return proc, url


class RoundTrips:
    """Counts commands clients send to Redis (MONITOR; script-internal commands excluded)."""

    def __init__(self, url: str) -> None:
        self.count = 0
        self._stop = threading.Event()
        self._client = redis.Redis.from_url(url)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(0.2)

    def _run(self) -> None:
        with self._client.monitor() as monitor:
            while not self._stop.is_set():
                command = monitor.next_command()
                if command and command["client_type"] != "lua" and not command["command"].startswith("MONITOR"):
                    self.count += 1

    def close(self) -> None:
        self._stop.set()
        self._client.ping()  # wakes the monitor up
        self._thread.join(5)


def round_trips(url: str, variant_url: str, seconds: float, connections: int) -> tuple[float, float]:
    """(round trips per 1,000 decisions while ``variant_url`` is loaded, idle round trips per second)."""
    counter = RoundTrips(url)
    time.sleep(seconds)  # idle: the lease loop alone
    idle = counter.count / seconds
    counter.count = 0
    rate, _ = wrk(variant_url, seconds, connections)
    busy = counter.count
    counter.close()
    decisions = rate * max(1, round(seconds))
    return busy / decisions * 1000, idle


def main(rounds: int, duration: float, connections: int) -> dict:
    server, url = redis_server()
    os.environ["REDIS_URL"] = url
    trips: dict[str, float] = {}
    try:  # the throwaway redis-server goes away even when the app server fails to start
        proc, urls = start(VARIANTS)
        try:
            rates, cpu = interleaved(urls, rounds, duration, connections, proc.pid)
            for v in ("admitgate", "admitgate_redis", "slowapi_redis"):
                trips[v], idle = round_trips(url, urls[v], max(1.0, min(duration, 2.0)), connections)
            trips["idle_per_second"] = idle
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    memory = rates["admitgate"]
    return {
        "rounds": rounds, "duration_s": duration, "connections": connections,
        "req_per_s_median": {v: round(statistics.median(r)) for v, r in rates.items()},
        "ratio_to_in_memory_gate_median": {v: round(statistics.median(a / b for a, b in zip(r, memory, strict=True)), 3)
                                           for v, r in rates.items()},
        "server_cpu_us_per_request_median": {v: round(statistics.median(c), 1) for v, c in cpu.items()},
        "redis_round_trips_per_1000_decisions": {v: round(t, 2) for v, t in trips.items()},
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = main(args.rounds, args.duration, args.connections)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        trips = result["redis_round_trips_per_1000_decisions"]
        print(f"{'variant':16s} {'req/s':>7s} {'vs in-memory gate':>17s} {'CPU µs/req':>10s} {'round trips/1000':>16s}")
        for v in VARIANTS:
            rt = f"{trips[v]:16.2f}" if v in trips else f"{'':16s}"
            print(
                f"{v:16s} {result['req_per_s_median'][v]:7d} {result['ratio_to_in_memory_gate_median'][v]:17.3f} "
                f"{result['server_cpu_us_per_request_median'][v]:10.1f} {rt}"
            )
        print(f"idle round trips per second (the lease loop): {trips['idle_per_second']:.1f}")
