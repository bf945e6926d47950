"""The retry schedule in the simulator: static and live H, four scenarios, obeying and ignoring clients, big herds.

    python bench/schedule.py [--seeds 5] [--json]

Runs the herd simulator (the real Gate, its schedule and estimators, on a virtual clock; one core) on
the embedded scenarios cache-expiry, step-down (capacity halves 5 s into the herd), ramp (5 to 20
workers over 10 s) and outage-recovery (no capacity for the first 10 s while the herd arrives), each
with a *static* gate (a typed-in capacity; where capacity moves, the operator's figure follows it through
a replacing external probe) and a *live* one (the default estimator, no capacity hint). New arrivals
(20/s, one try each) share the herd's route. Figures are medians over seeds of: drain time against
the least T with ∫H dt = M (M/H for cache-expiry), 5xx (median and worst seed) against 1 % of M, and
the share of new arrivals served on their one try during the herd.

Then herds of 20,000, 40,000 and 100,000 clients at H = μ − λ₀ ≈ 180/s (static): edge peak/average,
5xx, and the most clients told to come back within the same second, against 1.2 × H.
Writes bench/results/schedule.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from admitgate.sim.engine import simulate  # noqa: E402
from admitgate.sim.scenario import scenario_from  # noqa: E402

SCENARIOS = ("cache-expiry", "step-down", "ramp", "outage-recovery")
MODES = ("static", "live")


def run(name: str, mode: str, ignore: float, seed: int, **extra: Any) -> dict:
    options: dict[str, Any] = {"seed": seed, "ignore_fraction": ignore, **extra}
    if mode == "live":
        options["estimator"] = {"estimator": "bdp"}
    else:
        options["capacity_known"] = name != "cache-expiry"
    return simulate(scenario_from(name, **options))


def cell(runs: list[dict]) -> dict:
    ratio = "drain_ratio_integral" if "drain_ratio_integral" in runs[0] else "drain_ratio"
    m = runs[0]["clients"]
    drain = statistics.median(r[ratio] for r in runs)
    fivexx = [r["server_5xx"] for r in runs]
    return {
        "drain_ratio": round(drain, 3),
        "drain_ok": drain <= 1.2,
        "5xx_median": statistics.median(fivexx),
        "5xx_max": max(fivexx),
        "5xx_ok": statistics.median(fivexx) <= 0.01 * m,
        "new_served": round(statistics.median(r["new_served"] or 0 for r in runs), 3),
        "attempts_per_client": round(statistics.median(r["attempts"] for r in runs) / m, 2),
    }


def big(clients: int) -> dict:
    r = simulate(scenario_from("cache-expiry", clients=clients, duration=2000.0))
    headroom = r["clients"] / r["bound_s"]
    return {"clients": clients, "headroom": round(headroom, 1), "drain_ratio": r["drain_ratio"],
            "edge_peak_to_avg": r["edge_peak_to_avg"], "server_5xx": r["server_5xx"],
            "promised_peak_per_s": r["promised_peak_per_s"],
            "crowd_ok": r["promised_peak_per_s"] <= 1.2 * headroom,
            "retry_after_max": r["retry_after_max"]}  # fmt: skip


def main(seeds: int) -> dict:
    table = {f"{name}/{mode}/{ignore:.0%}": cell([run(name, mode, ignore, s) for s in range(1, seeds + 1)])
             for name in SCENARIOS for mode in MODES for ignore in (0.0, 0.2)}  # fmt: skip
    return {"seeds": seeds, "matrix": table, "big": [big(n) for n in (20_000, 40_000, 100_000)]}


def markdown(result: dict) -> str:
    rows = ["| scenario | gate | ignore Retry-After | drain / bound | 5xx median (worst) | new served | tries/client |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, c in result["matrix"].items():
        name, mode, ignore = key.split("/")
        ok = "✓" if c["drain_ok"] else "✗"
        bad = "✓" if c["5xx_ok"] else "✗"
        fivexx = f"{c['5xx_median']:g} ({c['5xx_max']}) {bad}"
        rows.append(f"| {name} | {mode} | {ignore} | {c['drain_ratio']} {ok} | {fivexx} | {c['new_served']:.1%} "
                    f"| {c['attempts_per_client']} |")  # fmt: skip
    rows += ["", "| clients | H /s | drain / (M/H) | edge peak/avg | 5xx | most told one second (≤ 1.2 H) "
             "| Retry-After max |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for b in result["big"]:
        ok = "✓" if b["crowd_ok"] else "✗"
        rows.append(f"| {b['clients']:,} | {b['headroom']} | {b['drain_ratio']} | {b['edge_peak_to_avg']} | "
                    f"{b['server_5xx']} | {b['promised_peak_per_s']} {ok} | {b['retry_after_max']} |")  # fmt: skip
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "schedule.json", help="where to write JSON")
    args = parser.parse_args()
    out = main(args.seeds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1) if args.json else markdown(out))
