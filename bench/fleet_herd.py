"""Fleet herd benchmark: one retry schedule for four replicas that share a budget in Redis.

    python bench/fleet_herd.py [--clients 5000] [--rate 400] [--rounds 3] [--scenario upstream|bare]
                               [--against DIR] [--trace] [--tenant] [--json]

Four uvicorn replicas (``bench/apps.py:fleet_replica``, the gate's defaults, ``rate`` = the fleet's
capacity, ``backend`` = a throwaway redis-server) run on core 0; a herd of ``--clients`` obeying
clients, split 70/10/10/10 over the replicas (each client keeps to its replica, on its own keep-alive
connection), is released at once from core 1.

``--scenario upstream`` (the default): behind the fleet, one capacity-limited service (``admitgate demo --gate
none``: ``rate`` × 0.1 s workers of 0.1 s each, a 503 after 1 s without a worker; core 1), which every replica
forwards ``/work`` to; beside the herd, new arrivals at ``--new`` requests/s (one try each, on a new connection,
spread over the replicas as the herd is) from 3 s before the release. H = rate − new. ``bare``: the replicas
answer at once (the budget's rate is the only limit), no new arrivals, H = rate.

Reported per round and as medians: the drain time against M/H, the largest Retry-After against M/H, the most
clients told to come back within one second against H, new arrivals served, and 5xx. ``--against DIR``: rounds
alternate between the replicas running the code in ``DIR`` (a checkout, first on their ``PYTHONPATH``) and this
one's, and each is reported apart. ``--trace``: per round, when each replica leased in the first 2 s after the
release, what it published, what each replica's herd was told in its first 0.5 s, and the herd's clients served and
told to come back in each second. ``--tenant``: the replicas
have tenants (keyed by ``x-api-key``) and the whole herd is one tenant's. Loopback only; each run is bounded by
--deadline seconds.
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
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from shared import redis_server  # noqa: E402

from admitgate.sim.summary import summarise  # noqa: E402
from lab.herd import run_herd  # noqa: E402
from lab.serving import demo_server, free_port, pin  # noqa: E402

SPLIT = (7, 1, 1, 1)
SERVICE_TIME = 0.1  # seconds per request at the upstream


def replicas(url: str, rate: float, n: int = 4, app: str = "apps:fleet_replica",
             env: dict[str, str] | None = None) -> tuple[list[subprocess.Popen], list[str]]:  # fmt: skip
    """Start ``n`` uvicorn replicas of ``app`` (a factory in bench/) sharing ``url``; wait until they answer."""
    env = {**os.environ, "REDIS_URL": url, "FLEET_RATE": str(rate), **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE.parent)) if p)
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


def one_round(clients: int, rate: float, deadline: float, scenario: str, new: float, code: str | None = None,
              trace: bool = False, tenant: bool = False) -> dict:  # fmt: skip
    """One herd against a fresh fleet (and upstream); ``code``: a checkout the replicas import admitgate from."""
    env, headers = ({"FLEET_TENANTS": "1"}, {"x-api-key": "big"}) if tenant else ({}, None)
    if code is not None:
        env["PYTHONPATH"] = code
    upstream = scenario == "upstream"
    new = new if upstream else 0.0
    with contextlib.ExitStack() as stack:
        if upstream:
            workers = str(round(rate * SERVICE_TIME))
            env["FLEET_UPSTREAM"] = stack.enter_context(demo_server(
                ["--gate", "none", "--workers", workers, "--service-time", str(SERVICE_TIME), "--queue-timeout", "1"],
                cpu=1))  # fmt: skip
        traces = stack.enter_context(tempfile.TemporaryDirectory()) if trace else None
        if traces is not None:
            env["FLEET_TRACE"] = traces
        bases = stack.enter_context(fleet(rate, env=env))
        time.sleep(1.0)  # leases and membership settle
        warmup = 3.0 if upstream else 0.5
        release = time.monotonic() + warmup
        result = asyncio.run(
            run_herd(
                bases,
                clients,
                split=SPLIT,
                path="/work" if upstream else "/",
                background_rate=new,
                warmup=warmup,
                deadline=deadline,
                headers=headers,
            )
        )
        leases = read_traces(traces, release) if traces is not None else None
    summary = summarise(result, rate - new)
    bound = clients / (rate - new)
    summary["retry_after_max_ratio"] = round((summary["retry_after_max"] or 0) / bound, 3)
    summary["promised_peak_ratio"] = round(summary["promised_peak_per_s"] / (rate - new), 2)
    if leases is not None:
        herd = [a for a in result.attempts if a.client >= 0]
        seconds = range(int(max((a.done for a in herd), default=0.0)) + 1)
        served = Counter(int(a.done) for a in herd if 200 <= a.status < 300)
        told = Counter(int(a.done + a.retry_after) for a in herd if a.retry_after is not None)
        summary["trace"] = {
            "leases": leases,
            "told_first_half_second": first_told(result, clients),
            "served_per_s": [served[s] for s in seconds],
            "told_per_s": [told[s] for s in seconds],
        }
    return summary


def read_traces(directory: str, release: float) -> list[list[tuple]]:
    """Each replica's leases from 0.5 s before the release to 2 s after it: (started, took, published backlog,
    fleet backlog read, leases out of turn so far), seconds from the release;
    replicas by process id (started in the split's order)."""
    replicas = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as lines:
            rows = [json.loads(line) for line in lines]
        replicas.append([(round(r["start"] - release, 3), round(r["end"] - r["start"], 3), round(r["published"]),
                          round(r["fleet"]), r.get("out_of_turn"))
                         for r in rows if -0.5 <= r["start"] - release <= 2.0])  # fmt: skip
    return replicas


def first_told(result, clients: int) -> list[dict[str, int]]:
    """For each replica (in the split's order), the Retry-After values its herd was told in the first 0.5 s after
    its first answer there: ``{value: clients}``."""
    edges = [round(sum(SPLIT[: k + 1]) / sum(SPLIT) * clients) for k in range(len(SPLIT))]
    told: list[list[tuple[float, int]]] = [[] for _ in SPLIT]
    for a in result.attempts:
        if a.client >= 0 and a.retry_after is not None:
            told[next(k for k, edge in enumerate(edges) if a.client < edge)].append((a.done, a.retry_after))
    out = []
    for rows in told:
        begin = min((done for done, _ in rows), default=0.0)
        out.append(dict(sorted(Counter(str(ra) for done, ra in rows if done <= begin + 0.5).items())))
    return out


KEYS = ["drain_ratio", "retry_after_max_ratio", "retry_after_max", "promised_peak_per_s", "promised_peak_ratio",
        "server_5xx", "new_served", "attempts"]  # fmt: skip


def main(clients: int, rate: float, rounds: int, deadline: float, scenario: str = "upstream", new: float = 40.0,
         against: str | None = None, trace: bool = False, tenant: bool = False) -> dict:  # fmt: skip
    pin(1)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    codes = [against, None] if against else [None]
    runs: dict[str, list[dict]] = {"before" if code else "this": [] for code in codes}
    for _ in range(rounds):
        for code in codes:
            runs["before" if code else "this"].append(one_round(clients, rate, deadline, scenario, new, code, trace,
                                                                tenant))  # fmt: skip
    hdr = rate - (new if scenario == "upstream" else 0.0)
    out = {
        "clients": clients,
        "fleet_rate": rate,
        "split": SPLIT,
        "scenario": scenario,
        "tenant": tenant,
        "new_per_s": new if scenario == "upstream" else 0.0,
        "headroom": hdr,
        "bound_s": round(clients / hdr, 3),
    }
    for label, rows in runs.items():
        out[label] = {"median": {k: statistics.median(r[k] for r in rows if r[k] is not None) if any(
            r[k] is not None for r in rows) else None for k in KEYS},
            "runs": [{k: r[k] for k in KEYS if k in r} | ({"trace": r["trace"]} if "trace" in r else {})
                     for r in rows]}  # fmt: skip
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=400.0, help="the fleet's capacity, requests/s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--scenario", choices=["upstream", "bare"], default="upstream")
    parser.add_argument("--new", type=float, default=40.0, help="new arrivals beside the herd, requests/s")
    parser.add_argument("--against", metavar="DIR", help="alternate rounds with the code checked out in DIR")
    parser.add_argument("--trace", action="store_true", help="the replicas' leases and first answers, per round")
    parser.add_argument("--tenant", action="store_true", help="tenants on; the whole herd in one tenant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = main(args.clients, args.rate, args.rounds, args.deadline, args.scenario, args.new, args.against,
               args.trace, args.tenant)  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.clients} clients split 70/10/10/10 over 4 replicas ({out['scenario']}), "
              f"H = {out['headroom']:g}/s, M/H = {out['bound_s']:.2f} s; medians of {args.rounds} rounds")  # fmt: skip
        for label in ("before", "this"):
            if label not in out:
                continue
            m = out[label]["median"]
            print(f" {label}")
            print(f"  drain / (M/H)           {m['drain_ratio']}   (target <= 1.15)")
            print(f"  largest Retry-After     {m['retry_after_max']} s = {m['retry_after_max_ratio']} x M/H"
                  "   (target <= 1.2)")  # fmt: skip
            print(f"  most told to one second {m['promised_peak_per_s']} = {m['promised_peak_ratio']} x H"
                  "   (target <= 1.2)")  # fmt: skip
            print(f"  new arrivals served     {m['new_served']}")
            print(f"  5xx                     {m['server_5xx']}   (target 0)")
            for r in out[label]["runs"]:
                trace = r.pop("trace", None)
                print("  round:", r)
                if trace:
                    print("   told in the first 0.5 s:", trace["told_first_half_second"])
                    for k, leases in enumerate(trace["leases"]):
                        print(f"   replica {k} leases:", leases)
