"""The scenario matrix's simulator counterparts: the I/O herd cells (obeying clients) and their events on
virtual time (:mod:`admitgate.sim.engine`, the loopback demo's measured CPU costs), seeds 1-3, the same ways."""

from __future__ import annotations

from typing import Any

from admitgate.core.gate import Gate
from admitgate.limit.estimators import DEFAULT_ESTIMATOR, capacity_from_config
from admitgate.sim.engine import simulate
from admitgate.sim.scenario import scenario_from
from lab.matrix_cells import Cell, Shape, median, settle

SEEDS = (1, 2, 3)
KEYS = ("drain_vs_bound", "new_served", "server_5xx", "edge_peak_to_avg", "settle_s")


def modelled(cell: Cell, shape: Shape) -> bool:
    """The simulator models herds on an I/O upstream of clients that obey Retry-After (not urllib3's policy,
    nor ignorers on fresh connections, nor open-loop client timeouts)."""
    return cell.load == "herd" and shape.kind == "io" and cell.policy == "obey"


def _way(way: str, mu: float) -> dict[str, Any]:
    """The scenario fields of a way: ``default`` the package's default estimator and burst, ``typed`` a static rate
    at μ with ``AdmitGate(rate=μ)``'s burst, ``bdp`` the ``bdp`` estimator, ``bare`` no gate."""
    if way == "bare":
        return {"gate": False}
    if way == "typed":
        return {"burst": max(1.0, mu / 10)}
    name = "bdp" if way == "bdp" else DEFAULT_ESTIMATOR
    return {"estimator": {"estimator": name}, "burst": Gate(capacity_from_config({})).pacer.burst}


def _figures(summary: dict[str, Any], cell: Cell, shape: Shape, mu: float) -> dict[str, Any]:
    figures = {k: summary.get(k) for k in KEYS}
    figures["drain_vs_bound"] = summary.get("drain_ratio_integral", summary.get("drain_ratio"))
    if cell.steps:
        at, workers = cell.steps[-1]
        served = {int(k): v for k, v in summary["series"]["served"].items()}
        drain = summary["drain_s"]
        end = int(drain) if drain != float("inf") else max(served, default=0)
        figures.update(settle(served, mu * workers / shape.workers, at, end))
    return figures


def simulated(cell: Cell, shape: Shape, ways: tuple[str, ...] = ("default", "bdp", "typed", "bare")) -> dict | None:
    """Per way, the medians over :data:`SEEDS` of the cell's herd figures on virtual time; None if not modelled."""
    if not modelled(cell, shape):
        return None
    mu = shape.workers / shape.service
    fields = {"workers": shape.workers, "service_time": shape.service, "queue_timeout": shape.queue,
              "background_rate": cell.new_fraction * mu, "capacity": [(6.0 + at, w) for at, w in cell.steps],
              "clients": 2000}  # fmt: skip
    out = {}
    for way in ways:
        runs = [_figures(simulate(scenario_from("loopback-demo", seed=seed, **fields, **_way(way, mu))), cell, shape,
                         mu) for seed in SEEDS]  # fmt: skip
        out[way] = {k: median([r.get(k) for r in runs]) for k in KEYS}
    return out
