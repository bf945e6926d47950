"""Herd benchmark: 2,000 clients released at once against a capacity-limited endpoint
(20 workers x 100 ms = 200 req/s) with 20 req/s of critical background traffic, compared side
by side in one run: no gate, slowapi at a static 200/s, and admitgate (schedule and jitter
spreading; 20 % of clients ignoring Retry-After, recognisable or not).

    python bench/herd.py [--clients 2000] [--rounds 3] [--scenarios a,b] [--json]

Server (the demo app, one uvicorn worker) on core 0, herd on core 1, loopback only; each run is
bounded by --deadline seconds. Figures are medians over rounds; the bound is M / (μ − λ₀).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from admitgate.herd import run_herd, summarise
from admitgate.serving import demo_server, pin

# name: (server args, herd options)
SCENARIOS: dict[str, tuple[list[str], dict]] = {
    "no-gate": (["--gate", "none"], {}),
    "slowapi-200/s": (["--gate", "slowapi"], {}),
    "admitgate": (["--gate", "admitgate", "--spread", "schedule"], {}),
    "admitgate-jitter": (["--gate", "admitgate", "--spread", "jitter"], {}),
    "admitgate-unrecognisable": (["--gate", "admitgate"], {"recognisable": False}),
    "admitgate-20%-ignore": (["--gate", "admitgate"], {"ignore_fraction": 0.2}),
    "admitgate-20%-ignore-unrecognisable": (["--gate", "admitgate"], {"ignore_fraction": 0.2, "recognisable": False}),
}
KEYS = ["drain_ratio", "drain_s", "edge_peak_to_avg", "server_5xx", "attempts", "retry_after_max",
        "herd_latency_p99_s", "background_success", "background_p99_s", "finished"]  # fmt: skip


def run(scenario: str, clients: int, deadline: float) -> dict:
    server_args, options = SCENARIOS[scenario]
    with demo_server(server_args, cpu=0) as base:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(run_herd(base, clients, background_rate=20.0, deadline=deadline, **options))
    return summarise(result, headroom=200.0 - 20.0)


# The simulator's counterpart of each scenario (slowapi is not modelled: the simulator drives admitgate only).
SIMULATED: dict[str, dict | None] = {
    "no-gate": {"gate": False},
    "slowapi-200/s": None,
    "admitgate": {},
    "admitgate-jitter": {"spread": "jitter"},
    "admitgate-unrecognisable": {"recognisable": False},
    "admitgate-20%-ignore": {"ignore_fraction": 0.2},
    "admitgate-20%-ignore-unrecognisable": {"ignore_fraction": 0.2, "recognisable": False},
}


def simulated(scenario: str, clients: int, seeds: int = 3) -> dict | None:
    """Median of the simulator's prediction for ``scenario`` over ``seeds`` seeds, or None if not modelled."""
    from admitgate.sim import scenario_from, simulate

    options = SIMULATED.get(scenario)
    if options is None:
        return None
    runs = [simulate(scenario_from("loopback-demo", clients=clients, seed=seed, **options))
            for seed in range(1, seeds + 1)]  # fmt: skip
    return {k: median([r[k] for r in runs]) for k in KEYS}


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def main(clients: int, rounds: int, scenarios: list[str], deadline: float, simulate: bool = False) -> dict:
    pin(1)
    per: dict[str, list[dict]] = {s: [] for s in scenarios}
    for _ in range(rounds):
        for s in scenarios:  # same order each round; each run starts a fresh server
            per[s].append(run(s, clients, deadline))
    result = {
        "clients": clients, "rounds": rounds, "bound_s": round(clients / 180.0, 3),
        "median": {s: {k: median([r[k] for r in runs]) for k in KEYS} for s, runs in per.items()},
        "runs": per,
    }  # fmt: skip
    if simulate:
        result["simulated"] = {s: simulated(s, clients) for s in scenarios}
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--simulate", action="store_true", help="also predict each scenario with the simulator")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = main(args.clients, args.rounds, args.scenarios.split(","), args.deadline, args.simulate)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.clients} clients, bound M/(μ−λ₀) = {result['bound_s']} s, medians of {args.rounds} rounds")
        print(f"{'scenario':38s} {'drain/bound':>11s} {'edge pk/avg':>11s} {'5xx':>5s} {'tries':>6s} "
              f"{'RA max':>6s} {'p99 s':>6s} {'bg ok':>6s}")  # fmt: skip
        for s, m in result["median"].items():
            print(f"{s:38s} {m['drain_ratio']!s:>11s} {m['edge_peak_to_avg']!s:>11s} {m['server_5xx']!s:>5s} "
                  f"{m['attempts']!s:>6s} {m['retry_after_max']!s:>6s} {m['herd_latency_p99_s']!s:>6s} "
                  f"{m['background_success']!s:>6s}")  # fmt: skip
        if args.simulate:
            print("\nreal vs simulated (loopback-demo model, medians of 3 seeds): drain/bound and edge peak/avg")
            for s, m in result["median"].items():
                sim = result["simulated"].get(s)
                if sim is None:
                    print(f"{s:38s} not modelled")
                    continue
                dd = (sim["drain_ratio"] / m["drain_ratio"] - 1) * 100
                peak = m["edge_peak_to_avg"]
                dp = (sim["edge_peak_to_avg"] / peak - 1) * 100 if peak else float("nan")
                print(f"{s:38s} drain {m['drain_ratio']} vs {sim['drain_ratio']} ({dd:+.1f} %), "
                      f"peak/avg {m['edge_peak_to_avg']} vs {sim['edge_peak_to_avg']} ({dp:+.1f} %)")  # fmt: skip
