"""Light tenants beside a busy one: is the capacity used, and are the light ones served on their first try?

    python bench/light_tenants.py [--light 10,50] [--period 2] [--busy 100] [--seconds 20] [--json]

The real :class:`~admitgate.core.tenants.Tenants` and :class:`~admitgate.core.gate.Gate` on a virtual clock
(decided as the middleware decides: the fast path, then ``admit``; holds end at their ends), at a typed-in
capacity of 100/s with the default settings. ``--light N`` tenants each have one client that asks once every
``--period`` seconds; tenant ``busy`` has ``--busy`` clients, each asking again 0.5 s after it is served
(200/s wanted from 100 clients). Every client obeys Retry-After. Max-min fairness gives each light tenant all
it asks (N / period requests/s) and the busy one the rest: the capacity is used whole, and a light tenant's
request is served on its first try (a light tenant asks far less than its share). Each case is run with
tenants on and with one pool (the same clients, no tenant key), side by side. ``rejected_per_s``: the 429s
sent, each a return the schedule asked for (a place told truly is asked for once).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from admitgate import Settings, Tenancy
from admitgate.core.gate import Gate, Verdict
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.core.tenants import Tenants

CAPACITY = 100.0
THINK = 0.5  # seconds a busy client waits after it is served


def run(light: int, period: float, busy: int, seconds: float, warmup: float, tenants: bool) -> dict:
    """One case; figures over [warmup, seconds)."""
    root = Gate(CAPACITY, Settings())
    table = Tenants(Tenancy(key="header:x-api-key"), root) if tenants else None
    priority = DEFAULT_CLASSES["default"]
    seq = itertools.count()
    # (time, seq, tenant, client, first try?, held decision)
    events: list[tuple[float, int, str, int, bool, object]] = []
    for i in range(light):
        events.append((i * period / light, next(seq), f"light-{i}", i, True, None))
    for c in range(busy):
        events.append((c * THINK / busy, next(seq), "busy", c, True, None))
    heapq.heapify(events)
    served = {"busy": 0, "light": 0}
    rejected = 0  # 429s sent: every client obeys, so each is a return the schedule asked for
    light_asked = light_first = 0
    while events:
        now, _, tenant, client, first, held = heapq.heappop(events)
        if now >= seconds:
            break
        counted = now >= warmup
        kind = "busy" if tenant == "busy" else "light"
        if held is None:
            if counted and kind == "light" and first:
                light_asked += 1
            key = (tenant, client)
            if table is None:
                decision = root.admit(1.0, priority, now, lambda key=key: key)
            elif table.try_take(1.0, now, tenant):
                decision = None
            else:
                decision = table.admit(1.0, priority, now, lambda key=key: key, tenant)
        else:
            decision = (root if table is None else table).end_hold(held, now)
        if decision is not None and decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), tenant, client, first, decision))
            continue
        if decision is None or decision.verdict is Verdict.ADMIT:
            if counted:
                served[kind] += 1
                light_first += kind == "light" and first
            if kind == "busy":
                again = now + THINK
            else:  # its next request is due at its next time (client i asks at i·period/light + k·period)
                start = client * period / light
                again = start + (math.floor((now - start) / period + 1e-9) + 1) * period
            heapq.heappush(events, (again, next(seq), tenant, client, True, None))
        else:  # a 429: back when told
            rejected += counted
            heapq.heappush(events, (now + decision.retry_after, next(seq), tenant, client, False, None))
    span = seconds - warmup
    light_rate = light / period
    return {
        "admitted_per_s": round((served["busy"] + served["light"]) / span, 1),
        "busy_per_s": round(served["busy"] / span, 1),
        "busy_max_min_share": round(CAPACITY - light_rate, 1),
        "light_per_s": round(served["light"] / span, 1),
        "light_asked_per_s": round(light_rate, 1),
        "light_first_try": round(light_first / light_asked, 3) if light_asked else None,
        "rejected_per_s": round(rejected / span, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--light", default="10,50", help="light tenants, comma-separated cases")
    parser.add_argument("--period", type=float, default=2.0)
    parser.add_argument("--busy", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {}
    for light in (int(n) for n in args.light.split(",")):
        for tenants in (True, False):
            case = f"light{light}-{'tenants' if tenants else 'one-pool'}"
            result[case] = run(light, args.period, args.busy, args.seconds, args.warmup, tenants)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for case, figures in result.items():
            print(f"{case:24s}", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
