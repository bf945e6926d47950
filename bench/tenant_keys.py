"""A million tenant keys against a real uvicorn on loopback: memory bounded, an established tenant keeps its share.

    python bench/tenant_keys.py [--keys 1000000] [--steady 20] [--json]

The server (core 0) is a Starlette hello-world behind
``AdmitGate(rate=1000, tenants=Tenancy(key="header:x-api-key"))`` on the defaults (``max_tenants`` 10,000).
wrk (core 1, one thread, 2,000 connections: more than pacing holds at the flood's share, so most are
refused at once) sends every request with a key never seen before (``k<run>-<n>``), in runs of 20 s until
``--keys`` requests have gone; beside it one established tenant (``steady``, ten keep-alive connections)
asks ``--steady`` requests/s from before the flood to its end. After each run: the server's resident memory
(VmRSS), the keys sent so far, and what the steady tenant was served. A flood of new keys competes as one
tenant (the newcomers' pool), and the steady tenant asks far less than half of the capacity, so it should
be served all it asks; the table's state is bounded (pools and candidate keys at most ``max_tenants``
each), so memory should level off, not grow with the keys.
Only 127.0.0.1 is targeted; every run is bounded in time. Writes bench/results/tenant_keys.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from overhead import start  # noqa: E402

from lab.http1 import Http1Client  # noqa: E402

RUN_S = 20
#: wrk connections: more than the pacing queue holds at the flood's share (rate × max_pacing_delay), so it is refused
CONNECTIONS = 2000
#: the steady tenant's connections (a request on one waits for the answer before the next)
STEADY_CONNECTIONS = 10
#: wrk: a fresh key for every request (run prefix from the script's argument), and the count of 5xx answers
#: (counted in each thread's Lua state, summed from the threads in done(), as wrk's setup.lua example does).
LUA = """
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  prefix, n, errors = "k" .. args[1] .. "-", 0, 0
end
function request()
  n = n + 1
  return wrk.format("GET", "/", {["x-api-key"] = prefix .. n})
end
function response(status, headers, body)
  if status >= 500 then errors = errors + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do total = total + thread:get("errors") end
  io.write(string.format("5xx: %d\\n", total))
end
"""


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (Linux /proc)."""
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def flood(url: str, run: int, seconds: int, script: str) -> tuple[int, int]:
    """One bounded wrk run on core 1: (requests sent, 5xx answers)."""
    cores = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    cmd = [*cores, "wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", script, url, "--", str(run)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    total, errors = re.search(r"(\d+) requests in", out), re.search(r"5xx: (\d+)", out)
    if not total or not errors:
        raise RuntimeError(f"wrk output not understood:\n{out}")
    return int(total.group(1)), int(errors.group(1))


class Steady:
    """One established tenant asking ``rate`` requests/s on its own connection (its own thread and loop)."""

    def __init__(self, port: int, rate: float) -> None:
        self.port, self.rate = port, rate
        self.counts = {"asked": 0, "served": 0, "refused": 0, "failed": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Steady:
        self._thread.start()
        return self

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    async def _run(self) -> None:
        await asyncio.gather(*(self._connection(i) for i in range(STEADY_CONNECTIONS)))

    async def _connection(self, index: int) -> None:
        """One of the tenant's connections: a request every STEADY_CONNECTIONS / rate seconds, on its own clock."""
        http = Http1Client("127.0.0.1", self.port, headers={"x-api-key": "steady"})
        period = STEADY_CONNECTIONS / self.rate
        next_at = time.monotonic() + index * period / STEADY_CONNECTIONS
        while not self._stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            status, _ = await http.get("/", timeout=5.0)
            self.counts["asked"] += 1
            kind = "served" if 200 <= status < 300 else "refused" if status == 429 else "failed"
            self.counts[kind] += 1
        http.close()


def main(keys: int, steady_rate: float, run_s: int = RUN_S) -> dict:
    proc, urls = start(["admitgate_tenants_flood"])
    url = urls["admitgate_tenants_flood"]
    port = int(url.rsplit(":", 1)[1].rstrip("/"))
    rows = []
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(LUA)
        script = f.name
    try:
        steady = Steady(port, steady_rate).start()
        time.sleep(3.0)  # the steady tenant is established before the flood
        before = steady.snapshot()
        rows.append({"keys": 0, "rss_mb": round(rss_mb(proc.pid), 1), "steady": before})
        sent = fivexx = 0
        run = 0
        while sent < keys:
            run += 1
            mark = steady.snapshot()
            n, errors = flood(url, run, run_s, script)
            sent, fivexx = sent + n, fivexx + errors
            now = steady.snapshot()
            asked = now["asked"] - mark["asked"]
            rows.append({"keys": sent, "rss_mb": round(rss_mb(proc.pid), 1), "flood_per_s": round(n / run_s),
                         "steady_asked": asked, "steady_served_share": round((now["served"] - mark["served"]) /
                                                                             max(asked, 1), 4)})  # fmt: skip
            print(f"  {sent:>9,} keys  RSS {rows[-1]['rss_mb']:7.1f} MB  steady served "
                  f"{rows[-1]['steady_served_share']:.1%} of {asked}", file=sys.stderr)  # fmt: skip
        steady.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(script)
    first = next((r for r in rows if r["keys"] >= 100_000), rows[-1])
    flood_rows = rows[1:]
    return {
        "keys": sent,
        "server_5xx": fivexx,
        "rss_mb_before": rows[0]["rss_mb"],
        "rss_mb_at_100k": first["rss_mb"],
        "rss_mb_at_end": rows[-1]["rss_mb"],
        "rss_growth_after_100k_mb": round(rows[-1]["rss_mb"] - first["rss_mb"], 1),
        "steady_served_share_min": min(r["steady_served_share"] for r in flood_rows),
        "rows": rows,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--steady", type=float, default=20.0, help="the established tenant's requests/s")
    parser.add_argument("--run", type=int, default=RUN_S, help="seconds per wrk run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "tenant_keys.json")
    args = parser.parse_args()
    out = main(args.keys, args.steady, args.run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['keys']:,} distinct keys, {out['server_5xx']} 5xx; server RSS {out['rss_mb_before']} MB before, "
              f"{out['rss_mb_at_100k']} MB at 100k keys, {out['rss_mb_at_end']} MB at the end "
              f"(+{out['rss_growth_after_100k_mb']} MB after 100k); the steady tenant was served at least "
              f"{out['steady_served_share_min']:.1%} of what it asked in every run")  # fmt: skip
