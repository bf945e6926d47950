"""The scenario matrix: the default gate judged on upstream shapes × loads × events it was not tuned on.

    python bench/matrix.py [--quick | --all] [--cells GLOB] [--rounds 3] [--ways default,typed,bare]
                           [--simulate] [--json] [--out bench/results/matrix.json]

Every cell runs three ways side by side in each round (their order rotated from round to round), each on a
fresh server (cold): ``default`` is ``AdmitGate(app)`` with no arguments, ``typed`` is ``AdmitGate(app,
rate=C)`` with C the route's true capacity (the reference), ``bare`` no gate (the baseline); ``metrics``
(``AdmitGate(app, metrics=CollectorRegistry())``) runs on closed-loop cells unless ``--ways`` says otherwise;
``bdp`` (the ``bdp`` estimator, the default before ``delay``) runs only when ``--ways`` names it.
The server (``bench/matrix_app.py``, one uvicorn process on its defaults) is pinned to core 0, the load to core 1,
loopback only. Figures are medians over rounds (a ratio to bare is taken within each round first), each printed
beside its target; the table and every round's figures go to ``bench/results/matrix.json``, where a run of a few
cells replaces those cells and keeps the others. The cells, targets and arithmetic: ``lab/matrix_cells.py``.
CPU capacity C is calibrated first (bare, wrk with 32 connections for 5 s, the median of 3). The default run
leaves out the few cells in ``lab.matrix_cells.SPARED`` so that its 3 rounds take about 2 hours; ``--all`` runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from matrix_load import (  # noqa: E402
    closed_loop,
    cpu_and_wait,
    herd,
    open_loop,
    own_autogroup,
    run_async,
    server,
    stats,
)
from matrix_report import save, table  # noqa: E402

from lab.matrix_cells import (  # noqa: E402
    CELLS,
    OPEN_LATE,
    QUICK,
    QUICK_ROUNDS,
    SHAPES,
    SPARED,
    Cell,
    Shape,
    closed_figures,
    closed_ratios,
    generator_lag,
    herd_figures,
    median,
    open_figures,
    targets,
    usage_figures,
)
from lab.serving import pin  # noqa: E402

WAYS = ("default", "typed", "bare")
CLOSED_S, OPEN_S, TIMEOUT_S, CLIENTS = 10.0, 15.0, 1.0, 2000
CALIBRATE_S, CALIBRATIONS = 5.0, 3


def capacity_of(shape: Shape, calibrated: dict[str, Any]) -> float:
    """The route's true capacity, requests/s: K / s for I/O, the calibrated bare rate for CPU."""
    return shape.workers / shape.service if shape.kind == "io" else calibrated[shape.id]["capacity"]


def calibrate(shapes: list[Shape]) -> dict[str, Any]:
    """Each CPU shape's capacity: bare, closed loop of 32 connections, :data:`CALIBRATE_S` s, median of 3."""
    out: dict[str, Any] = {}
    for shape in shapes:
        with server({**shape.server(), "way": "bare"}) as (base, _, _):
            closed_loop(base + shape.path, 1, 32)  # the process's first requests (imports, caches) left out
            runs = [closed_loop(base + shape.path, CALIBRATE_S, 32)["req_per_s"] for _ in range(CALIBRATIONS)]
        out[shape.id] = {"capacity": round(statistics.median(runs), 1), "runs": runs}
    return out


def measure(cell: Cell, shape: Shape, way: str, capacity: float, seed: int, deadline: float) -> dict[str, Any]:
    """One run of ``cell`` served ``way``: a fresh server, the cell's load, its figures (with the server's and,
    but for wrk, the generator's time on and waiting for a core) and the server's counters."""
    config = {**shape.server(), "way": way, "rate": capacity}
    with server(config) as (base, port, pid):
        processes = {"server": pid} if cell.load == "closed32" else {"server": pid, "generator": os.getpid()}
        before, began = {k: cpu_and_wait(p) for k, p in processes.items()}, time.monotonic()
        lags: list[float]
        if cell.load == "closed32":
            figures = closed_loop(base + shape.path, CLOSED_S, 32)
        elif cell.load == "open":
            target, lags = cell.multiple * capacity, []
            shots = run_async(open_loop(port, shape.path, target, OPEN_S, timeout=TIMEOUT_S, steps=cell.steps,
                                        seed=seed, lags=lags), OPEN_S + TIMEOUT_S + 30)  # fmt: skip
            figures = open_figures(shots, target=target, capacity=capacity, duration=OPEN_S, steps=cell.steps,
                                   workers=shape.workers)  # fmt: skip
            figures.update(generator_lag(lags, OPEN_LATE))
        else:
            new = cell.new_fraction * capacity
            result, lags = run_async(herd(base, shape.path, policy=cell.policy, new_rate=new, steps=cell.steps,
                                          clients=CLIENTS, deadline=deadline, seed=seed), deadline + 40)  # fmt: skip
            figures = herd_figures(result, capacity=capacity, new_rate=new, steps=cell.steps, workers=shape.workers,
                                   service=shape.service)  # fmt: skip
            figures.update(generator_lag(lags))
        figures.update(usage_figures(before, {k: cpu_and_wait(p) for k, p in processes.items()},
                                     time.monotonic() - began))  # fmt: skip
        counters = stats(base)
    if cell.load == "closed32":
        figures = closed_figures(figures, None if counters is None else counters["gate"])
    return {"figures": figures, "server": counters}


def attempt(cell: Cell, way: str, capacity: float, seed: int, deadline: float) -> dict[str, Any]:
    """:func:`measure`, timed; a run that fails is recorded with its error (its figures then meet no target)."""
    began = time.monotonic()
    try:
        record = measure(cell, SHAPES[cell.shape], way, capacity, seed, deadline)
    except (RuntimeError, OSError, subprocess.SubprocessError, asyncio.TimeoutError, ValueError) as error:
        record = {"figures": {}, "error": f"{type(error).__name__}: {error}"}
    record["elapsed_s"] = round(time.monotonic() - began, 1)
    return record


def ways_of(cell: Cell, ways: list[str]) -> list[str]:
    """The ways a cell runs: ``metrics`` on closed-loop cells only."""
    return [w for w in ways if w != "metrics" or cell.load == "closed32"]


def run_rounds(cells: list[Cell], ways: list[str], rounds: int, calibrated: dict[str, Any],
               deadline: float) -> dict[str, dict[str, list[dict]]]:  # fmt: skip
    """Every cell's runs, per way, one per round: the ways of a cell side by side, their order rotated per round."""
    runs: dict[str, dict[str, list[dict]]] = {c.id: {w: [] for w in ways_of(c, ways)} for c in cells}
    for r in range(rounds):
        for cell in cells:
            own = ways_of(cell, ways)
            turn = r % len(own)
            order = own[turn:] + own[:turn]
            capacity = capacity_of(SHAPES[cell.shape], calibrated)
            for way in order:
                record = attempt(cell, way, capacity, r + 1, deadline)
                record.update(round=r + 1, position=order.index(way))
                runs[cell.id][way].append(record)
                print(f"  round {r + 1} {cell.id} {way}: {record['elapsed_s']} s {record.get('error', '')}",
                      file=sys.stderr, flush=True)  # fmt: skip
            if cell.load == "closed32" and "bare" in own:
                bare = runs[cell.id]["bare"][-1]["figures"]
                for way in own:
                    runs[cell.id][way][-1]["figures"].update(closed_ratios(runs[cell.id][way][-1]["figures"], bare))
    return runs


def judge(cell: Cell, runs: dict[str, list[dict]], capacity: float) -> dict[str, Any]:
    """A cell's medians over rounds, each way's targets and whether its median meets each."""
    shape = SHAPES[cell.shape]
    out: dict[str, Any] = {"load": cell.load, "event": cell.event, "steps": cell.steps, "capacity": capacity,
                           "ways": {}}  # fmt: skip
    for way, records in runs.items():
        keys = {k for r in records for k in r["figures"]}
        medians = {k: median([r["figures"].get(k) for r in records]) for k in sorted(keys)}
        goals = targets(cell, shape, way)
        out["ways"][way] = {"median": medians, "targets": {t.key: str(t) for t in goals},
                            "met": {t.key: t.met(medians) for t in goals}, "runs": records}  # fmt: skip
    default = out["ways"].get("default")
    out["met"] = None if default is None or not default["met"] else all(default["met"].values())
    return out


def select(patterns: str | None, quick: bool, every: bool = False) -> list[Cell]:
    """The cells ``--cells`` (comma-separated globs over cell ids) or ``--quick`` names; by default all but
    :data:`~lab.matrix_cells.SPARED`, and those too with ``every``."""
    if patterns:
        chosen = [c for c in CELLS if any(fnmatch.fnmatch(c.id, p) for p in patterns.split(","))]
    elif quick:
        chosen = [c for c in CELLS if c.id in QUICK]
    else:
        chosen = [c for c in CELLS if every or c.id not in SPARED]
    if not chosen:
        raise SystemExit(f"no cell matches {patterns!r}; cells: {', '.join(c.id for c in CELLS)}")
    return chosen


def main(args: argparse.Namespace) -> dict[str, Any]:
    scheduler = own_autogroup()
    pin(1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (so that the running server is terminated too)
    cells = select(args.cells, args.quick, args.all)
    ways = args.ways.split(",") if args.ways else [*WAYS, "metrics"]
    rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else 3)
    began = time.monotonic()
    calibrated = calibrate([SHAPES[s] for s in dict.fromkeys(c.shape for c in cells) if SHAPES[s].kind == "cpu"])
    runs = run_rounds(cells, ways, rounds, calibrated, args.deadline)
    judged = {c.id: judge(c, runs[c.id], capacity_of(SHAPES[c.shape], calibrated)) for c in cells}
    if args.simulate:
        from matrix_sim import simulated

        for c in cells:
            judged[c.id]["simulated"] = simulated(c, SHAPES[c.shape])
    return {"rounds": rounds, "ways": ways, "calibration": calibrated, "cells": judged,
            "wall_s": round(time.monotonic() - began, 1), "cores": os.cpu_count(), "scheduler": scheduler}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"a subset, {QUICK_ROUNDS} round: {', '.join(QUICK)}")
    parser.add_argument("--all", action="store_true", help=f"also the cells spared by default: {', '.join(SPARED)}")
    parser.add_argument("--cells", help="comma-separated globs over cell ids (shape/load), e.g. 'cpu-2/*,*/herd-obey'")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--ways", help="comma-separated: default, typed, bare, metrics, bdp (default: all but bdp, "
                                       "metrics on closed-loop cells only)")  # fmt: skip
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds a herd may take after its release")
    parser.add_argument("--simulate", action="store_true", help="also the simulator's counterparts (I/O herds)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "matrix.json", help="the results file")
    options = parser.parse_args()
    if options.list:
        print("\n".join(c.id for c in CELLS))
        sys.exit(0)
    unknown = set((options.ways or "default").split(",")) - {*WAYS, "metrics", "bdp"}
    if unknown:
        parser.error(f"unknown ways {sorted(unknown)}")
    out = main(options)
    save(out, options.out)
    print(json.dumps(out, indent=2) if options.json else table(out))
