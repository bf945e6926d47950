"""Herd benchmark: 2,000 clients released at once against a capacity-limited endpoint (20 workers × 100 ms
= 200 req/s), with 20 req/s of new arrivals on the same route, compared side by side in one run: admitgate
with a typed-in capacity (rate=200), admitgate learning it live (its defaults, no hint), the same when the
capacity halves 5 s into the herd, with 20 % of clients ignoring Retry-After, slowapi at 200/s, no gate.

    python bench/herd.py [--clients 2000] [--rounds 3] [--scenarios a,b] [--simulate] [--json]

Server (the demo app, one uvicorn worker, uvicorn's defaults) on core 0, herd on core 1, loopback only;
each run is bounded by --deadline seconds. Every herd client obeys Retry-After on its own keep-alive
connection; each new arrival makes one try on a new connection and counts as served only if that try
succeeds. Figures are medians over rounds, each beside its target; the bound is M / (μ − λ₀), or the
least T with ∫H dt = M when capacity changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from admitgate.sim.summary import summarise
from lab.herd import herd_ramp, run_herd
from lab.serving import demo_server, pin

CAPACITY, NEW = 200.0, 20.0
HALVING = [(5.0, 10)]  # 20 -> 10 workers 5 s into the herd

# name: (server args, herd options, the simulator's counterpart or None, targets)
SCENARIOS: dict[str, tuple[list[str], dict, dict | None, dict]] = {
    "admitgate static rate=200": (["--rate", "200"], {}, {},
                                  {"drain_ratio": 1.10, "edge_peak_to_avg": 1.3, "server_5xx": 0, "new_served": 0.95}),
    "admitgate live (no hint)": ([], {}, {"estimator": {"estimator": "bdp"}},
                                 {"drain_ratio": 1.15, "server_5xx": 0, "new_served": 0.95}),
    "admitgate live; capacity halves at 5 s": ([], {"steps": HALVING},
                                               {"estimator": {"estimator": "bdp"}, "capacity": [(11.0, 10)]},
                                               {"drain_ratio_integral": 1.15, "server_5xx": 20, "new_served": 0.90}),
    "admitgate live; 20 % ignore Retry-After": ([], {"ignore_fraction": 0.2},
                                                {"estimator": {"estimator": "bdp"}, "ignore_fraction": 0.2}, {}),
    "slowapi 200/s": ([], {}, None, {}),
    "no gate": (["--gate", "none"], {}, {"gate": False}, {}),
}  # fmt: skip
#: What serves each scenario: ``admitgate demo`` unless named here (slowapi is not in the package).
DEMO = ("-m", "admitgate", "demo")
PROGRAMS = {"slowapi 200/s": (str(Path(__file__).resolve().parent / "slowapi_demo.py"),)}
KEYS = ["drain_ratio", "drain_ratio_integral", "edge_peak_to_avg", "server_5xx", "new_served", "attempts",
        "retry_after_max", "herd_latency_p99_s", "background_p99_s", "finished"]  # fmt: skip


def run(scenario: str, clients: int, deadline: float) -> dict:
    server_args, options, _, _ = SCENARIOS[scenario]
    with demo_server(server_args, cpu=0, program=PROGRAMS.get(scenario, DEMO)) as base:
        result = asyncio.run(run_herd(base, clients, background_rate=NEW, deadline=deadline, **options))
    steps = options.get("steps", ())
    return summarise(result, CAPACITY - NEW, herd_ramp(20, 0.1, NEW, list(steps)) if steps else ())


def simulated(scenario: str, clients: int, seeds: int = 3) -> dict | None:
    """Median of the simulator's prediction for ``scenario`` over ``seeds`` seeds, or None if not modelled."""
    from admitgate.sim.engine import simulate
    from admitgate.sim.scenario import scenario_from

    options = SCENARIOS[scenario][2]
    if options is None:
        return None
    runs = [simulate(scenario_from("loopback-demo", clients=clients, seed=seed, **options))
            for seed in range(1, seeds + 1)]  # fmt: skip
    return {k: median([r.get(k) for r in runs]) for k in KEYS}


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def verdicts(m: dict, targets: dict) -> dict[str, bool]:
    """Each target met? Ratios and 5xx are upper bounds; the share of new arrivals served is a lower one."""
    out = {}
    for key, target in targets.items():
        value = m.get(key)
        out[key] = value is not None and (value >= target if key == "new_served" else value <= target)
    return out


def main(clients: int, rounds: int, scenarios: list[str], deadline: float, simulate: bool = False) -> dict:
    pin(1)
    try:  # the load generator must not be the bottleneck: uvloop where installed
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    per: dict[str, list[dict]] = {s: [] for s in scenarios}
    for _ in range(rounds):
        for s in scenarios:  # same order each round; each run starts a fresh server
            per[s].append(run(s, clients, deadline))
    medians = {s: {k: median([r.get(k) for r in runs]) for k in KEYS} for s, runs in per.items()}
    result: dict[str, Any] = {
        "clients": clients, "rounds": rounds, "bound_s": round(clients / (CAPACITY - NEW), 3), "median": medians,
        "targets": {s: SCENARIOS[s][3] for s in scenarios},
        "met": {s: verdicts(medians[s], SCENARIOS[s][3]) for s in scenarios}, "runs": per,
    }  # fmt: skip
    if simulate:
        result["simulated"] = {s: simulated(s, clients) for s in scenarios}
    return result


def shown(m: dict, targets: dict, met: dict, key: str, label: str) -> str:
    """``label value (target) ✓/✗``; new_served's target is a floor, the others are ceilings."""
    text = f"{label} {m.get(key)}"
    if key in targets:
        text += f" ({'≥' if key == 'new_served' else '≤'} {targets[key]}) {'✓' if met[key] else '✗'}"
    return text


def report(result: dict) -> str:
    lines = [f"{result['clients']} clients vs 200 req/s with 20 req/s of new arrivals on the same route; "
             f"M/(μ−λ₀) = {result['bound_s']} s; medians of {result['rounds']} rounds "
             "(target, ✓ met / ✗ not)"]  # fmt: skip
    for s, m in result["median"].items():
        targets, met = result["targets"][s], result["met"][s]
        drain = "drain_ratio_integral" if m.get("drain_ratio_integral") is not None else "drain_ratio"
        figures = [(drain, "drain/bound"), ("edge_peak_to_avg", "edge peak/avg"), ("server_5xx", "5xx"),
                   ("new_served", "new served")]  # fmt: skip
        lines.append(f"  {s}:")
        lines.append("    " + ", ".join(shown(m, targets, met, key, label) for key, label in figures))
        lines.append(f"    tries {m['attempts']}, Retry-After max {m['retry_after_max']}, "
                     f"herd p99 {m['herd_latency_p99_s']} s, new p99 {m['background_p99_s']} s")  # fmt: skip
        sim = (result.get("simulated") or {}).get(s)
        if sim:
            lines.append(f"    simulated (loopback-demo model, 3 seeds): drain/bound {sim.get(drain)}, "
                         f"edge peak/avg {sim['edge_peak_to_avg']}, 5xx {sim['server_5xx']}, "
                         f"new served {sim['new_served']}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated names (names hold no comma)")
    parser.add_argument("--simulate", action="store_true", help="also predict each scenario with the simulator")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unknown = [name for name in args.scenarios.split(",") if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}")
    out = main(args.clients, args.rounds, args.scenarios.split(","), args.deadline, args.simulate)
    print(json.dumps(out, indent=2) if args.json else report(out))
