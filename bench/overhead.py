"""HTTP overhead benchmark: hello-world Starlette behind each middleware, served by one process on core 0,
wrk on core 1, rounds interleaved in random order; the figure is the median of per-round ratios to bare.
Beside requests/s it reports the server's CPU time per request (/proc utime+stime over wrk's request
count): time stolen from this VM is not charged to the process, so that ratio is the steadier one.

    python bench/overhead.py [--rounds 10] [--duration 5] [--connections 32] [--json]
    python bench/overhead.py --instructions [--variants bare,admitgate,...] [--duration 10] [--json]

With ``--instructions``, each variant is served alone under valgrind's callgrind instead, and the figure is the
server's user-space instructions per HTTP request while wrk runs (counted only then: ``callgrind_control -i``),
the same from run to run whatever else the machine does. Under callgrind the server runs some 35 times slower;
while it is counted, the gates' clock is slowed by as much (the slowdown of the bare server, measured first), so
that work on a timer falls on as many requests as at full speed (that clock, a Python callable where the gates
otherwise read ``time.monotonic``, is counted against them). The kernel's part of a request (the sockets) is not
counted, and no gate adds to it: the ratio to bare is a lower bound on the CPU-time ratio.

Needs wrk (Debian package ``wrk``), and valgrind for ``--instructions``. Only 127.0.0.1 is targeted; every load
run is bounded by --duration.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from lab.serving import free_port, pin  # noqa: E402

VARIANTS = ["bare", "passthrough", "admitgate", "admitgate_tenants", "admitgate_tenants_closed",
            "admitgate_static_metrics", "admitgate_live",
            "admitgate_metrics",
            "prometheus_per_request",
            "slowapi", "slowapi_asgi"]  # fmt: skip


def start(variants: list[str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """One server process on core 0 serving every variant on its own port."""
    ports = {v: free_port() for v in variants}
    spec = ",".join(f"{v}:{p}" for v, p in ports.items())
    proc = subprocess.Popen([sys.executable, str(HERE / "apps.py"), spec], preexec_fn=lambda: pin(0))
    urls = {v: f"http://127.0.0.1:{p}/" for v, p in ports.items()}
    deadline = time.monotonic() + 30
    for url in urls.values():
        ready(proc, url, deadline)
    return proc, urls


def ready(proc: subprocess.Popen, url: str, deadline: float) -> None:
    """Wait until ``url`` answers 200, else RuntimeError once ``proc`` has exited or ``deadline`` has passed."""
    while True:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the benchmark server did not start ({url})")
        time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (Linux /proc): time stolen from the VM is not charged here."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, duration: float, connections: int, pid: int | None = None) -> tuple[float, float]:
    """(requests/s, server CPU µs per request) for one bounded wrk run."""
    cores = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    # Every variant gets the same header (a tenant's key): only the admitgate_tenants ones read it.
    cmd = [*cores, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "-H", "x-api-key: tenant-1", url]
    for _ in range(3):  # a run that completed no request (a server starved of the CPU all along) is run again
        before = cpu_seconds(pid) if pid else 0.0
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30, check=True).stdout
        used = cpu_seconds(pid) - before if pid else 0.0
        rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
        total = re.search(r"(\d+) requests in", out)
        if not rate or not total or "Non-2xx" in out:
            raise RuntimeError(f"wrk output not understood or non-2xx responses:\n{out}")
        if int(total.group(1)):
            return float(rate.group(1)), used / int(total.group(1)) * 1e6
    raise RuntimeError(f"wrk completed no request in three runs:\n{out}")


def interleaved(
    urls: dict[str, str], rounds: int, duration: float, connections: int, pid: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(requests/s, server CPU µs/request) per variant: a warm-up, then rounds in a fresh random order."""
    samples: dict[str, list[float]] = {v: [] for v in urls}
    cpu: dict[str, list[float]] = {v: [] for v in urls}
    for url in urls.values():  # warm-up
        wrk(url, 1, connections)
    for _ in range(rounds):
        order = list(urls)
        random.shuffle(order)
        for v in order:
            rate, cpu_us = wrk(urls[v], duration, connections, pid)
            samples[v].append(rate)
            cpu[v].append(cpu_us)
    return samples, cpu


def _counted(variant: str, duration: float, connections: int, slowdown: float) -> tuple[float, float]:
    """(instructions per request, requests/s) of ``variant`` served under callgrind, counted over one wrk run."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = dict(os.environ, PYTHONHASHSEED="0", BENCH_CLOCK_SLOWDOWN=str(slowdown))
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
               str(HERE / "apps.py"), f"{variant}:{port}"]  # fmt: skip
        proc = subprocess.Popen(cmd, preexec_fn=lambda: pin(0), env=env, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}/"
        try:
            ready(proc, url, time.monotonic() + 120)
            wrk(url, 3, connections)  # warm-up, not counted
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
            if slowdown != 1.0:
                os.kill(proc.pid, signal.SIGUSR1)  # (the gates' clock slows down from now: see apps._Clock)
            rate, _ = wrk(url, duration, connections)
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        finally:
            proc.terminate()
            log = proc.communicate(timeout=120)[1]
    collected = re.search(r"Collected : (\d+)", log)
    if not collected:
        raise RuntimeError(log[-2000:])
    return int(collected.group(1)) / (rate * max(1, round(duration))), rate


def instructions(duration: float, connections: int, variants: list[str]) -> dict:
    """User-space instructions per HTTP request of each variant under callgrind, and bare's over each one's."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    proc, urls = start(["bare"])
    try:
        wrk(urls["bare"], 1, connections)
        native, _ = wrk(urls["bare"], 3, connections)
    finally:
        proc.terminate()
        proc.wait(10)
    per_request, rate = {}, {}
    per_request["bare"], rate["bare"] = _counted("bare", duration, connections, 1.0)
    slowdown = native / rate["bare"]
    for v in variants:
        if v != "bare":
            per_request[v], rate[v] = _counted(v, duration, connections, slowdown)
    return {
        "duration_s": duration, "connections": connections, "bare_req_per_s": round(native),
        "slowdown": round(slowdown, 1),
        "instructions_per_request": {v: round(i) for v, i in per_request.items()},
        "req_per_s_under_callgrind": {v: round(r, 1) for v, r in rate.items()},
        "instruction_ratio_to_bare": {v: round(per_request["bare"] / i, 3) for v, i in per_request.items()},
    }  # fmt: skip


def main(rounds: int, duration: float, connections: int, variants: list[str]) -> dict:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    proc, urls = start(variants)
    try:
        samples, cpu = interleaved(urls, rounds, duration, connections, proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
    ratios = {v: [s / b for s, b in zip(samples[v], samples["bare"], strict=True)] for v in variants}
    cpu_ratios = {v: [b / c for c, b in zip(cpu[v], cpu["bare"], strict=True)] for v in variants}
    return {
        "rounds": rounds, "duration_s": duration, "connections": connections,
        "req_per_s_median": {v: round(statistics.median(s)) for v, s in samples.items()},
        "req_per_s_range": {v: [round(min(s)), round(max(s))] for v, s in samples.items()},
        "ratio_to_bare_median": {v: round(statistics.median(r), 3) for v, r in ratios.items()},
        "server_cpu_us_per_request_median": {v: round(statistics.median(c), 1) for v, c in cpu.items()},
        "cpu_ratio_to_bare_median": {v: round(statistics.median(r), 3) for v, r in cpu_ratios.items()},
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--duration", type=float, help="seconds per wrk run (default 5; 10 with --instructions)")
    parser.add_argument("--connections", type=int, help="wrk's connections (default 32; 8 with --instructions)")
    parser.add_argument("--variants", help="comma-separated (default: all; with --instructions bare, admitgate, "
                                           "admitgate_tenants, admitgate_tenants_closed)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request under callgrind instead (default variants: "
                             "bare, admitgate, admitgate_tenants, admitgate_tenants_closed; 8 connections, "
                             "10 s)")  # fmt: skip
    args = parser.parse_args()
    if args.instructions:
        chosen = (args.variants or "bare,admitgate,admitgate_tenants,admitgate_tenants_closed").split(",")
        counted = instructions(args.duration or 10.0, args.connections or 8, chosen)
        if args.json:
            print(json.dumps(counted, indent=2))
        else:
            print(f"bare at full speed {counted['bare_req_per_s']} requests/s; under callgrind "
                  f"{counted['slowdown']}x slower (the gates' clock slowed as much)")  # fmt: skip
            print(f"{'variant':26s} {'instructions/request':>20s} {'bare/variant':>12s}")
            for v, i in counted["instructions_per_request"].items():
                print(f"{v:26s} {i:20d} {counted['instruction_ratio_to_bare'][v]:12.3f}")
        sys.exit(0)
    chosen = (args.variants or ",".join(VARIANTS)).split(",")
    if "bare" not in chosen:
        chosen.insert(0, "bare")
    result = main(args.rounds, args.duration or 5.0, args.connections or 32, chosen)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{'variant':14s} {'req/s median':>12s} {'range':>13s} {'ratio to bare':>13s} "
              f"{'CPU µs/req':>10s} {'CPU ratio':>9s}")  # fmt: skip
        for v in chosen:
            lo, hi = result["req_per_s_range"][v]
            print(f"{v:14s} {result['req_per_s_median'][v]:12d} {f'{lo}-{hi}':>13s} "
                  f"{result['ratio_to_bare_median'][v]:13.3f} {result['server_cpu_us_per_request_median'][v]:10.1f} "
                  f"{result['cpu_ratio_to_bare_median'][v]:9.3f}")  # fmt: skip
