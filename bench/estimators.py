"""Estimator trials: every estimator and a static limit against capacity steps, a ramp and 2x overload.

    python bench/estimators.py [--seeds 7] [--phases 0,1,2] [--json]

Runs on the herd simulator's virtual clock with the real gate, probes and estimators (one core,
about 14 s per estimator and seed: each change at each of ``trials.PHASES``). Prints the per-figure median
over the seeds (a settle time's over every seed and phase) as a markdown table, how many seeds met each
criterion, and the share of the runs settled within 5 s; writes bench/results/estimators.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=7)
    parser.add_argument("--estimators", default=",".join(trials.ESTIMATORS))
    parser.add_argument("--phases", type=lambda text: tuple(float(x) for x in text.split(",")), default=trials.PHASES,
                        help="seconds each change is moved by, comma-separated (default: %(default)s)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "estimators.json",
                        help="where to write the JSON (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()
    noload = trials.noload_p99()
    medians, out = [], {}
    for name in args.estimators.split(","):
        runs = [trials.run(name, seed, noload, args.phases) for seed in range(1, args.seeds + 1)]
        medians.append(trials.median(runs))
        passes = {k: sum(r.passes()[k] for r in runs) for k in runs[0].passes()}
        within = {step: round(medians[-1].within(step), 3) for step in trials.STEPS}
        out[name] = {"median": medians[-1].__dict__, "seeds_passing": passes, "seeds": args.seeds,
                     "phases": args.phases, "within_5s": within}  # fmt: skip
        print(f"  {name}: seeds meeting each criterion (of {args.seeds}): {passes}", file=sys.stderr)
        print(f"  {name}: runs settled within 5 s (of {args.seeds} × {len(args.phases)}): {within}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out, default=str) if args.json else trials.table(medians))


if __name__ == "__main__":
    main()
