"""Ablation: each rule of the default estimator and of the gate's holds removed in turn, scored on modelled cells.

    python bench/ablation.py [--variants base,no-lag,...] [--seeds 3] [--json] [--out bench/results/ablation.json]

A rule stays only if removing it makes the cells worse. Each variant is the shipped gate and ``delay`` estimator
with one rule taken out (a subclass overriding that rule, nothing else), run on virtual time in front of the
event-loop model (``lab/loop_model.py``) over the cells below, seeds 1..N. The cells are the scenario matrix's
shapes and loads on a model (``bench/matrix.py`` runs them on a real server, for the default only) plus two the
matrix lacks: ``mix`` (a CPU-bound overload, then cheap requests from a closed loop: does the gate let go?) and
``twice`` (a second herd 40 s after the first: is the first one's state left behind?). Every cell is judged on the
matrix's targets; the table gives each variant's cells met over all seeds beside the base's, and each figure that
moved materially (the median over seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from admitgate.core.gate import Gate  # noqa: E402
from admitgate.core.settings import Settings  # noqa: E402
from admitgate.core.tuning import GATE  # noqa: E402
from admitgate.limit.capacity import OPEN_INFLIGHT, LiveCapacity  # noqa: E402
from admitgate.limit.delay import QueueDelay, _delivered  # noqa: E402
from admitgate.limit.window import Window  # noqa: E402
from admitgate.sim.summary import summarise  # noqa: E402
from lab.loop_model import Server, Shape, closed_figures, open_figures  # noqa: E402

SHAPES = {
    "cpu-0": Shape("cpu", burn=0.00005), "cpu-2": Shape("cpu", burn=0.002), "cpu-20": Shape("cpu", burn=0.020),
    "io-4x20-q1": Shape("io", 4, 0.02, 1.0), "io-20x100-q1": Shape("io", 20, 0.1, 1.0),
    "io-20x100-q2": Shape("io", 20, 0.1, 2.0), "io-100x500-q1": Shape("io", 100, 0.5, 1.0),
    "io-100x500-q2": Shape("io", 100, 0.5, 2.0),
}  # fmt: skip


# --- the variants: one rule out each ---------------------------------------------------------------------------


class NoStanding(QueueDelay):
    """Limits at the first window whose delay is over the target (no standing-queue test)."""

    def estimate(self, w: Window) -> float:
        if self.state == "open":
            base = self.baseline if self.baseline is not None else w.latency
            if self._delay(w, base) > self.target:
                self.state, self.mu = "limiting", max(0.0, _delivered(w))
        return super().estimate(w)


def _queued(w: Window, base: float) -> float:
    good = _delivered(w)
    waiting = w.busy - max(good, 0.0) * base
    return 0.0 if waiting <= 0 else waiting / good if good > 0 else math.inf


class NoLag(QueueDelay):
    """Reads no event-loop lag: the delay is the upstream's alone."""

    def _delay(self, w: Window, base: float) -> float:
        return math.inf if w.stalled else min(w.recent_latency - base, _queued(w, base))


class LatencyOnly(QueueDelay):
    """The upstream's queue from latency alone (not also from the work in flight)."""

    def _delay(self, w: Window, base: float) -> float:
        return math.inf if w.stalled else max(w.lag, w.recent_latency - base)


class LittleOnly(QueueDelay):
    """The upstream's queue from the work in flight alone (not also from latency)."""

    def _delay(self, w: Window, base: float) -> float:
        return math.inf if w.stalled else max(w.lag, _queued(w, base))


class NoStall(QueueDelay):
    """Requests in flight with none answered are no endless delay."""

    def estimate(self, w: Window) -> float:
        return super().estimate(dataclasses.replace(w, stalled=False))


class NoAverage(QueueDelay):
    """μ is the newest window's delivered rate, not its average over the interval."""

    def estimate(self, w: Window) -> float:
        before = self.mu
        rate = super().estimate(w)
        if self.state == "limiting" and not self.collapsed and before is not None and self.mu != before:
            self.mu = max(max(0.0, _delivered(w)), self.tuning.least)
            spanned = w.now - self._windows[0][0] >= self.interval - 1e-9
            rate = max(self.mu * self._scale(w, self._windows[-1][1], spanned), self.tuning.least)
        return rate


def _scaled(cut: bool = True, rise: bool = True, double: bool = True) -> type[QueueDelay]:
    class Scaled(QueueDelay):
        def _scale(self, w: Window, delay: float, spanned: bool) -> float:
            t = self.tuning
            if delay > self.target:
                return max(1 - t.gain * (delay - self.target), 1 - t.max_cut) if cut else 1.0
            if not w.limiting:
                return 1.0
            if double and spanned and all(lim and d < self.target / 2 for _, d, lim in self._windows):
                return t.max_gain
            return 1 + t.gain * (self.target - delay) if rise else 1.0

    return Scaled


class NoRelease(QueueDelay):
    """Never opens again once it has limited."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.release = math.inf


class NoCollapse(QueueDelay):
    """A service that serves nothing is sent half its μ, not almost nothing."""

    def estimate(self, w: Window) -> float:
        rate = super().estimate(w)
        if self.collapsed and self.mu is not None:
            self.collapsed = False
            return self.mu * 0.5
        return rate


class Fifo(Gate):
    """Holds waiting for room are woken oldest first."""

    def room_freed(self) -> None:
        waiting, bound = self._room_waiters, self.bound
        if not waiting or bound is None:
            return
        free = bound.limit - (bound.inflight - bound.answered)
        while waiting and free >= 1:
            if waiting.popleft()():
                free -= 1


class RequeueHead(Gate):
    """A hold turned away is given the schedule's head, not a place at its tail."""

    def _requeue(self, key: Any, cost: float, now: float) -> Any:
        return self._reject(key, (self.schedule.head(now), cost, now), now, early=False)


class PlaceWithinWindow(Gate):
    """A returning client is held only within a new request's pacing window, not up to the lead."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.place_hold = self.max_pacing_delay


@dataclasses.dataclass(frozen=True)
class Variant:
    """The gate of a variant: its estimator class, gate class, gate tuning, in-flight floor and settings."""

    doc: str
    estimator: type[QueueDelay] = QueueDelay
    gate: type[Gate] = Gate
    tuning: dict[str, Any] = dataclasses.field(default_factory=dict)
    inflight_floor: float = OPEN_INFLIGHT
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> Gate:
        capacity = LiveCapacity(self.estimator(), inflight_floor=self.inflight_floor)
        return self.gate(capacity, Settings(**self.settings), tuning=dataclasses.replace(GATE, **self.tuning))


VARIANTS: dict[str, Variant] = {
    "base": Variant("the default as it ships"),
    "no-standing": Variant("limit at the first window over the target (no standing-queue test)", NoStanding),
    "no-lag": Variant("no event-loop lag in the delay", NoLag),
    "latency-only": Variant("the upstream's queue read from latency alone", LatencyOnly),
    "little-only": Variant("the upstream's queue read from the work in flight alone", LittleOnly),
    "no-stall": Variant("no stall verdict (in flight, nothing answered)", NoStall),
    "no-average": Variant("μ the newest window's delivered rate, not averaged over the interval", NoAverage),
    "no-cut": Variant("no cut of the rate while the delay is over the target", _scaled(cut=False)),
    "no-raise": Variant("no raise of the rate while the delay is under the target", _scaled(rise=False)),
    "no-double": Variant("no doubling after a whole interval limited with no queue", _scaled(double=False)),
    "no-release": Variant("never open again once limited", NoRelease),
    "no-collapse": Variant("a service serving nothing is sent half its μ", NoCollapse),
    "floor-4": Variant("in-flight limit from 4 (not 100)", inflight_floor=4.0),
    "floor-32": Variant("in-flight limit from 32 (not 100)", inflight_floor=32.0),
    "no-floor": Variant("no in-flight limit", inflight_floor=0.0),
    "fifo": Variant("holds for room woken oldest first", gate=Fifo),
    "requeue-head": Variant("a hold turned away placed at the schedule's head", gate=RequeueHead),
    "room-window": Variant("room holds within the pacing window only", tuning={"room_latencies": 0.0}),
    "place-window": Variant("returning clients held within the pacing window only", gate=PlaceWithinWindow),
}

# --- the cells -------------------------------------------------------------------------------------------------


def _closed(shape: str, variant: Variant | None, seed: int) -> dict[str, Any]:
    gate = variant.build() if variant else None
    server = Server(SHAPES[shape], gate, seed)
    out: list[Any] = []
    server.closed_loop(32, 0.0, 10.0, out)
    server.run(10.5)
    return {**closed_figures(out, 0.0, 10.0), "held": gate.stats.paced if gate else 0}


def _open(shape: str, multiple: float, variant: Variant, seed: int) -> dict[str, Any]:
    server = Server(SHAPES[shape], variant.build(), seed)
    out: list[Any] = []
    server.open_loop(multiple * SHAPES[shape].capacity, 15.0, out)
    server.run(17.0)
    return open_figures(out, 3.0, 15.0, 1.0)


def _herd(shape_name: str, variant: Variant, seed: int, ignore: float = 0.0, new_share: float = 0.1,
          steps: tuple[tuple[float, int], ...] = ()) -> dict[str, Any]:  # fmt: skip
    shape = SHAPES[shape_name]
    server = Server(shape, variant.build(), seed)
    new, release = new_share * shape.capacity, 6.0
    result = server.herd(2000, release, release + 60, new, ignore)
    for at, workers in steps:
        server.at(release + at, lambda t, n: server.set_workers(t, n), workers)
    server.run(release + 61)
    ramp = [(0.0, shape.capacity - new)]
    for at, workers in steps:
        ramp += [(at, ramp[-1][1]), (at, max(0.0, workers / shape.service - new))]
    s = summarise(result, shape.capacity - new, ramp if steps else ())
    return {"drain": s.get("drain_ratio_integral", s["drain_ratio"]), "new": s["new_served"],
            "r5xx": s["server_5xx"], "edge": s["edge_peak_to_avg"]}  # fmt: skip


def _mix(variant: Variant | None, seed: int) -> dict[str, Any]:
    """A CPU-bound route overloaded at 2× for 6 s, then cheap requests from 32 connections for 10 s."""
    gate = variant.build() if variant else None
    server = Server(SHAPES["cpu-2"], gate, seed)
    server.open_loop(2 * SHAPES["cpu-2"].capacity, 6.0, [])
    before: dict[str, int] = {}

    def cheap(t: float, _: Any) -> None:
        server.burn = 0.00005
        if gate is not None:
            before["held"] = gate.stats.paced

    server.at(8.0, cheap)
    out: list[Any] = []
    server.closed_loop(32, 8.0, 18.0, out)
    server.run(18.5)
    return {**closed_figures(out, 8.0, 18.0), "held": gate.stats.paced - before["held"] if gate else 0}


def _twice(variant: Variant, seed: int) -> dict[str, Any]:
    """Two 2,000-client herds, at 6 s and 46 s: the second one's figures."""
    shape = SHAPES["io-20x100-q1"]
    server = Server(shape, variant.build(), seed)
    new = 0.1 * shape.capacity
    server.herd(2000, 6.0, 100.0, new)
    second = server.herd(2000, 46.0, 100.0, first=10**6)
    server.run(101.0)
    s = summarise(second, shape.capacity - new)
    return {"drain": s["drain_ratio"], "edge": s["edge_peak_to_avg"]}


def _judge_closed(got: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    ratio = got["rps"] / bare["rps"]
    return {"ratio": ratio, "held": got["held"], "rejected": got["not_served"],
            "ok": ratio >= 0.95 and got["not_served"] == 0 and got["held"] == 0}  # fmt: skip


def _judge_open(got: dict[str, Any], capacity: float, multiple: float, p99: float) -> dict[str, Any]:
    if multiple < 1:
        return {"served": got["goodput"] / got["offered"], "r429": got["r429"],
                "ok": got["r429"] == 0 and got["goodput"] >= 0.98 * got["offered"]}  # fmt: skip
    goodput = got["goodput"] / capacity
    ok = goodput >= 0.9 and (got["p99"] or math.inf) <= p99 and got["timeouts"] <= 0.01 and got["r5xx"] == 0
    return {"goodput": goodput, "p99": got["p99"], "timeouts": got["timeouts"], "r5xx": got["r5xx"], "ok": ok}


def _judge_herd(got: dict[str, Any], cut: bool = False) -> dict[str, Any]:
    ok = (got["drain"] <= 1.15 and got["new"] >= 0.95 and got["r5xx"] <= (20 if cut else 0)
          and (got["edge"] or math.inf) <= 1.5)  # fmt: skip
    return {**got, "ok": ok}


def _closed_cell(shape: str, v: Variant, s: int) -> dict[str, Any]:
    return _judge_closed(_closed(shape, v, s), _closed(shape, None, s))


def _open_cell(shape: str, multiple: float, p99: float, v: Variant, s: int) -> dict[str, Any]:
    return _judge_open(_open(shape, multiple, v, s), SHAPES[shape].capacity, multiple, p99)


def _herd_cell(shape: str, v: Variant, s: int, cut: bool = False, **kw: Any) -> dict[str, Any]:
    return _judge_herd(_herd(shape, v, s, **kw), cut)


def _mix_cell(v: Variant, s: int) -> dict[str, Any]:
    return _judge_closed(_mix(v, s), _mix(None, s))


def _twice_cell(v: Variant, s: int) -> dict[str, Any]:
    return _judge_herd({**_twice(v, s), "new": 1.0, "r5xx": 0})


def _cells() -> dict[str, Callable[[Variant, int], dict[str, Any]]]:
    """Each cell: a function of (variant, seed) to its judged figures."""
    cells: dict[str, Callable[[Variant, int], dict[str, Any]]] = {}
    for shape in ("cpu-0", "cpu-2", "cpu-20", "io-4x20-q1", "io-20x100-q1", "io-100x500-q1"):
        cells[f"{shape}/closed32"] = partial(_closed_cell, shape)
    for shape, multiple, p99 in (("cpu-2", 0.5, 1.0), ("cpu-2", 2, 0.25), ("cpu-2", 5, 0.25), ("cpu-20", 2, 0.25),
                                 ("cpu-20", 5, 0.25), ("io-4x20-q1", 2, 0.27), ("io-20x100-q1", 2, 0.35),
                                 ("io-20x100-q1", 5, 0.35), ("io-100x500-q1", 2, 0.75)):  # fmt: skip
        cells[f"{shape}/open{multiple:g}"] = partial(_open_cell, shape, multiple, p99)
    for shape in ("io-4x20-q1", "io-20x100-q1", "io-100x500-q2"):
        cells[f"{shape}/herd-obey"] = partial(_herd_cell, shape)
    cells["io-20x100-q1/herd-ignore20"] = partial(_herd_cell, "io-20x100-q1", ignore=0.2)
    cells["io-20x100-q2/cut"] = partial(_herd_cell, "io-20x100-q2", steps=((5.0, 10),), cut=True)
    cells["io-20x100-q2/double"] = partial(_herd_cell, "io-20x100-q2", steps=((5.0, 40),))
    cells["io-20x100-q2/outage"] = partial(_herd_cell, "io-20x100-q2", steps=((3.0, 0), (8.0, 20)), cut=True)
    cells["io-20x100-q2/new40"] = partial(_herd_cell, "io-20x100-q2", new_share=0.4)
    cells["cpu-2/mix"] = _mix_cell
    cells["io-20x100-q1/twice"] = _twice_cell
    return cells


CELLS = _cells()
#: A figure moved materially: (+1: higher is worse, -1: lower is worse, the least change that counts).
MATERIAL = {"ratio": (-1, 0.02), "held": (1, 50), "rejected": (1, 50), "served": (-1, 0.02), "goodput": (-1, 0.02),
            "p99": (1, 0.03), "timeouts": (1, 0.005), "r429": (1, 50), "drain": (1, 0.03), "new": (-1, 0.02),
            "r5xx": (1, 5), "edge": (1, 0.15)}  # fmt: skip


def score(name: str, seed: int, cells: list[str] | None = None) -> dict[str, Any]:
    """One variant, one seed: each cell's judged figures."""
    variant = VARIANTS[name]
    return {cell: CELLS[cell](variant, seed) for cell in (cells or CELLS)}


def _median(runs: list[dict[str, Any]], cell: str, key: str) -> float | None:
    values = [r[cell][key] for r in runs if r[cell].get(key) is not None]
    return statistics.median(values) if values else None


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant: cells met over all seeds, and each figure that moved materially from the base's median."""
    base = runs["base"]
    out: dict[str, Any] = {}
    for name, own in runs.items():
        moved: dict[str, list[str]] = {"worse": [], "better": []}
        for cell in own[0]:
            for key, (sign, least) in MATERIAL.items():
                b, x = _median(base, cell, key), _median(own, cell, key)
                if b is None or x is None or abs(x - b) <= least:
                    continue
                moved["worse" if (x - b) * sign > 0 else "better"].append(f"{cell} {key} {b:.3g} → {x:.3g}")
        out[name] = {"met": sum(r[c]["ok"] for r in own for c in r), "of": sum(len(r) for r in own), **moved}
    return out


def table(result: dict[str, Any]) -> str:
    """The variants beside the base: cells met, and what moved."""
    base = result["compared"]["base"]["met"]
    lines = [f"cells met over seeds 1-{result['seeds']} (base {base} of {result['compared']['base']['of']})", ""]
    for name, c in result["compared"].items():
        lines.append(f"{name:14s} {c['met']:3d} ({c['met'] - base:+d})  {VARIANTS[name].doc}")
        lines += [f"    worse  {m}" for m in c["worse"]] + [f"    better {m}" for m in c["better"]]
    return "\n".join(lines)


def _job(args: tuple[str, int, list[str] | None]) -> tuple[str, int, dict[str, Any]]:
    name, seed, cells = args
    return name, seed, score(name, seed, cells)


def main(names: list[str], seeds: int, cells: list[str] | None, workers: int) -> dict[str, Any]:
    jobs = [(name, seed, cells) for name in names for seed in range(1, seeds + 1)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with ProcessPoolExecutor(workers) as pool:
        for name, _, figures in sorted(pool.map(_job, jobs), key=lambda j: (j[0], j[1])):
            runs[name].append(figures)
    return {"seeds": seeds, "cells": list(cells or CELLS), "runs": runs, "compared": compare(runs)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (base is always run)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cells", help="comma-separated cell ids (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ablation.json")
    options = parser.parse_args()
    chosen = list(dict.fromkeys(["base", *options.variants.split(",")]))
    unknown = [n for n in chosen if n not in VARIANTS] + [c for c in (options.cells or "").split(",") if c and c
                                                          not in CELLS]  # fmt: skip
    if unknown:
        parser.error(f"unknown variants or cells {unknown}; variants: {', '.join(VARIANTS)}; cells: {', '.join(CELLS)}")
    result = main(chosen, options.seeds, options.cells.split(",") if options.cells else None, options.workers)
    options.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if options.json else table(result))
