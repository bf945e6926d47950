"""Estimator trials: every estimator and a static limit against capacity steps, a ramp and 2x overload.

    python bench/estimators.py [--seeds 7] [--json]

Runs on the herd simulator's virtual clock with the real gate, probes and estimators (one core,
about 3 s per estimator and seed). Prints the per-figure median over the seeds as a markdown table,
and how many seeds met each criterion; writes bench/results/estimators.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trials  # bench/trials.py, beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=7)
    parser.add_argument("--estimators", default=",".join(trials.ESTIMATORS))
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "estimators.json",
                        help="where to write the JSON (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()
    noload = trials.noload_p99()
    medians, out = [], {}
    for name in args.estimators.split(","):
        runs = [trials.run(name, seed, noload) for seed in range(1, args.seeds + 1)]
        medians.append(trials.median(runs))
        passes = {k: sum(r.passes()[k] for r in runs) for k in runs[0].passes()}
        out[name] = {"median": medians[-1].__dict__, "seeds_passing": passes, "seeds": args.seeds}
        print(f"  {name}: seeds meeting each criterion (of {args.seeds}): {passes}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out, default=str) if args.json else trials.table(medians))


if __name__ == "__main__":
    main()
