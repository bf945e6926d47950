"""Estimator trials: each capacity estimator against capacity steps, a ramp and sustained overload.

The trials run the herd simulator (:mod:`admitgate.sim.engine`) with open-loop demand (Poisson arrivals
that do not retry) and a live :class:`~admitgate.limit.capacity.LiveCapacity`, so the real gate, probes
and estimators are judged on virtual time. True capacity is 20 workers × lognormal service times
(mean 100 ms): 200 requests/s.

Criteria:

* after a step (capacity halved by losing workers; halved by a slower service, which also doubles
  the baseline latency; doubled), the capacity estimate is within 15 % of the truth within 5 s and
  stays there (within 15 % at least 80 % of the time from then on, :data:`STAYS`); after a ramp
  (50 → 200/s over 20 s), the same from the ramp's end. Each change is run at each of :data:`PHASES`
  (moved by that many seconds), and a settle time is the median over them;
* under 2× overload: goodput ≥ 90 % of capacity, p99 latency of admitted requests ≤ 2× the
  no-load p99, coefficient of variation of the admitted rate per second < 10 %;
* after the overload ends (demand falls to 80 % of capacity), the gate stops shedding within 10 s.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from admitgate.sim.engine import Simulation
from admitgate.sim.scenario import Scenario

CAPACITY = 200.0
ESTIMATORS = ("static", "bdp", "gradient", "aimd")
TOLERANCE = 0.15
#: "Stays there": the least share of the time after a change is first tracked that the estimate is within 15 %.
STAYS = 0.8
#: Seconds each change is moved by, so that it meets an estimator at several points of its own cycle (bdp's
#: probe, drain and cruise take 2-4 s): a change at one fixed instant meets every seed at the same point of that
#: cycle, and a settle time read there says as much about that point as about the estimator.
PHASES = (0.0, 1.0, 2.0)


def _capacity_table(name: str, capacity: float) -> dict[str, Any]:
    if name == "static":  # a static limit, tuned to the service's capacity before anything changes
        return {"estimator": "static", "static": {"capacity": capacity}}
    return {"estimator": name, "initial": 100.0}


def _scenario(estimator: str, seed: int, **fields: Any) -> Scenario:
    initial = fields.get("workers", 20) / fields.get("service_time", 0.1)
    base: dict[str, Any] = {"name": "trial", "clients": 0, "workers": 20, "service_time": 0.1,
                            "service_dist": "lognormal", "background_rate": 0.0, "duration": 60.0,
                            "demand": [(0.0, 2 * CAPACITY)], "estimator": _capacity_table(estimator, initial),
                            "seed": seed}  # fmt: skip
    base.update(fields)
    return Scenario(**base)


#: name -> (scenario fields, when the change starts, when it ends)
STEPS: dict[str, tuple[dict[str, Any], float, float]] = {
    "step down 50 % (workers)": ({"capacity": [(30.0, 10)]}, 30.0, 30.0),
    "step down 50 % (slower service)": ({"capacity": [(30.0, 20, 0.2)]}, 30.0, 30.0),
    "step up 100 %": ({"workers": 10, "capacity": [(30.0, 20)]}, 30.0, 30.0),
    "ramp 50 → 200/s over 20 s": ({"workers": 5, "capacity": [(20.0 + i / 2, 5 + i * 15 / 40) for i in range(41)]},
                                  20.0, 40.0),
}  # fmt: skip


@dataclass
class Result:
    estimator: str
    settle: dict[str, float | None] = field(default_factory=dict)  # seconds after the change ends; None: never
    tracking: dict[str, float] = field(default_factory=dict)  # share of the time within 15 % after that
    goodput: float = 0.0  # fraction of capacity
    p99: float = 0.0  # seconds
    p99_noload: float = 0.0
    cv: float = 0.0
    recovery: float | None = None  # seconds; None: never
    #: each change's settle time at each phase it ran at (seconds; None: never); ``settle`` is their median
    runs: dict[str, list[float | None]] = field(default_factory=dict)

    def within(self, name: str, limit: float = 5.0) -> float:
        """The share of ``name``'s runs (phases, and seeds once merged by :func:`median`) settled within ``limit`` s."""
        runs = self.runs.get(name) or [self.settle[name]]
        return sum(s is not None and s <= limit for s in runs) / len(runs)

    def passes(self) -> dict[str, bool]:
        out = {name: s is not None and s <= 5.0 and self.tracking[name] >= STAYS for name, s in self.settle.items()}
        out["goodput"] = self.goodput >= 0.9
        out["p99"] = self.p99 <= 2 * self.p99_noload
        out["cv"] = self.cv < 0.10
        out["recovery"] = self.recovery is not None and self.recovery <= 10.0
        return out


def settle_time(trace: list[tuple[float, float, float, float | None]], change_end: float) -> tuple[float | None, float]:
    """(seconds after ``change_end`` until the estimate is first within 15 % of the truth, or None;
    the share of the time from then on that it stays within 15 %)."""
    reached: float | None = None
    inside = total = 0
    for t, true, _rate, mu in trace:
        if t < change_end:
            continue
        ok = mu is not None and abs(mu / true - 1) <= TOLERANCE
        if reached is None and ok:
            reached = t
        if reached is not None:
            total += 1
            inside += ok
    if reached is None:
        return None, 0.0
    return round(max(0.0, reached - change_end), 1), round(inside / total, 3)


def noload_p99(seed: int = 1) -> float:
    sim = Simulation(_scenario("static", seed, demand=[(0.0, 0.3 * CAPACITY)], duration=40.0))
    sim.run()
    return _p99([lat for t, lat, status in sim.outcomes if lat is not None and t >= 5])


def _p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)] if values else 0.0


def _mid(values: list[Any]) -> Any:
    """The median of ``values``, the lower of the middle two; None ("never") ranks above every number."""
    ranked = sorted(values, key=lambda v: math.inf if v is None else v)
    return ranked[(len(ranked) - 1) // 2]


def _moved(fields_: dict[str, Any], by: float) -> dict[str, Any]:
    """A step's scenario fields with each capacity change ``by`` seconds later."""
    return {**fields_, "capacity": [(step[0] + by, *step[1:]) for step in fields_["capacity"]]}


def run(estimator: str, seed: int = 1, p99_noload: float | None = None, phases: tuple[float, ...] = PHASES) -> Result:
    """All trials for one estimator: each change at each of ``phases`` (seconds later), the overload once."""
    result = Result(estimator, p99_noload=p99_noload if p99_noload is not None else noload_p99(seed))
    for name, (fields_, _start, end) in STEPS.items():
        settles, shares = [], []
        for by in phases:
            sim = Simulation(_scenario(estimator, seed, **_moved(fields_, by)))
            sim.run()
            settle, share = settle_time(sim.trace, end + by)
            settles.append(settle)
            shares.append(share)
        result.runs[name] = settles
        result.settle[name], result.tracking[name] = _mid(settles), statistics.median(shares)
    # sustained 2x overload for 40 s, then 80 % of capacity for 20 s
    sim = Simulation(_scenario(estimator, seed, demand=[(0.0, 2 * CAPACITY), (40.0, 0.8 * CAPACITY)]))
    sim.run()
    window = [(t, lat, status) for t, lat, status in sim.outcomes if 10 <= t < 40]
    result.goodput = round(sum(1 for _, _, s in window if s == 200) / (30 * CAPACITY), 3)
    result.p99 = round(_p99([lat for _, lat, _ in window if lat is not None]), 3)
    admitted = [sim.series["admitted"].get(second, 0) for second in range(10, 40)]
    result.cv = round(statistics.pstdev(admitted) / statistics.fmean(admitted), 3)
    per_second: dict[int, list[int]] = {}
    for t, _lat, status in sim.outcomes:
        if t >= 40:
            counts = per_second.setdefault(int(t), [0, 0])
            counts[0] += 1
            counts[1] += status == 429
    last_bad = max((s for s, (n, rejected) in per_second.items() if rejected > 0.01 * n), default=None)
    end = max(per_second, default=40)
    result.recovery = 0.0 if last_bad is None else (None if last_bad >= end - 1 else float(last_bad + 1 - 40))
    return result


def median(results: list[Result]) -> Result:
    """The per-figure median of several seeds' results for one estimator; a settle time's over every run (each
    seed's phases)."""
    first = results[0]
    out = Result(first.estimator, p99_noload=first.p99_noload)
    for name in first.settle:
        out.runs[name] = [s for r in results for s in r.runs.get(name) or [r.settle[name]]]
        out.settle[name] = _mid(out.runs[name])
        out.tracking[name] = statistics.median(r.tracking[name] for r in results)
    out.goodput = statistics.median(r.goodput for r in results)
    out.p99 = statistics.median(r.p99 for r in results)
    out.cv = statistics.median(r.cv for r in results)
    out.recovery = _mid([r.recovery for r in results])
    return out


def table(results: list[Result]) -> str:
    """A markdown table: one row per estimator, ✓/✗ against each criterion.

    A step's cell is "seconds until within 15 % ✓/✗ (share of the time within 15 % afterwards)".
    """
    names = list(STEPS)
    head = ["estimator", *names, "goodput", "p99 s (no-load p99)", "CV", "recovery s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        ok = r.passes()

        def mark(key: str, text: str, ok: dict[str, bool] = ok) -> str:
            return f"{text} {'✓' if ok[key] else '✗'}"

        steps = [mark(n, "never" if r.settle[n] is None else f"{r.settle[n]:g}") + f" ({r.tracking[n]:.0%})"
                 for n in names]  # fmt: skip
        cells = [r.estimator, *steps,
                 mark("goodput", f"{r.goodput:.0%}"), mark("p99", f"{r.p99:.3f} ({r.p99_noload:.3f})"),
                 mark("cv", f"{r.cv:.1%}"),
                 mark("recovery", "never" if r.recovery is None else f"{r.recovery:g}")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
