"""Prometheus metrics, collected at scrape time from what the gate counts anyway.

:class:`GateCollector` is a prometheus-client collector: nothing is observed per request. At each
scrape it reads the gate's counters, the per-route tallies the middleware keeps (three integers per
route template), the probe aggregates (latency histogram, in-flight, outcomes) and the estimator's
state, and renders them as prometheus-client metric families. Labels are route templates and class
names only, never raw paths or client keys. The names below are the ones the dashboards and alert
rules use.

    app = AdmitGate(app, rate=..., metrics=prometheus_client.REGISTRY)
    app = Starlette(routes=[Route("/metrics", metrics_app())])   # or metrics_app(registry)

Multi-process serving (``uvicorn --workers``, gunicorn) with ``PROMETHEUS_MULTIPROC_DIR`` set:
:class:`MultiprocessSync` writes the same metrics as standard prometheus-client types into the
shared files once a second, and :func:`metrics_app` serves the merged view.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .gate import PACING_BOUNDS
from .probes import LATENCY_BOUNDS

if TYPE_CHECKING:
    from .middleware import AdmitGate

PREFIX = "admitgate"
DECISIONS = f"{PREFIX}_decisions"  # counter {route, class, verdict}: admitted | paced | rejected
RATE = f"{PREFIX}_rate_requests_per_second"  # gauge: the pacer's rate
CAPACITY = f"{PREFIX}_capacity_requests_per_second"  # gauge: μ
LAMBDA_NEW = f"{PREFIX}_protected_rate_requests_per_second"  # gauge: λ_new
HEADROOM = f"{PREFIX}_headroom_requests_per_second"  # gauge: H = rate − λ_critical
FLOOR = f"{PREFIX}_headroom_floor_requests_per_second"  # gauge: the configured floor (live headroom)
BASELINE = f"{PREFIX}_baseline_latency_seconds"  # gauge
LATENCY = f"{PREFIX}_latency_seconds"  # gauge: mean latency of the last estimator window
INFLIGHT = f"{PREFIX}_inflight_requests"  # gauge
WAITERS = f"{PREFIX}_paced_waiting_requests"  # gauge: requests being held by pacing now
WINDOW = f"{PREFIX}_safe_window_seconds"  # gauge: how far ahead the retry schedule reaches
ESTIMATOR = f"{PREFIX}_estimator_state"  # gauge 1 {estimator, state}
REQUEST_LATENCY = f"{PREFIX}_request_latency_seconds"  # histogram: admission to last body byte
PACING = f"{PREFIX}_pacing_delay_seconds"  # histogram of pacing holds
RETRY_AFTER = f"{PREFIX}_retry_after_seconds"  # histogram of Retry-After values sent
OUTCOMES = f"{PREFIX}_responses"  # counter {outcome}: ok | dropped (5xx) | error (exception)
BACKEND_ERRORS = f"{PREFIX}_backend_errors"  # counter: shared-backend failures (0 with the in-memory backend)
FALLBACK = f"{PREFIX}_backend_fallback"  # gauge: 1 while running on a local fallback

#: Retry-After histogram bounds, seconds.
RETRY_AFTER_BOUNDS = (1, 2, 5, 10, 20, 30, 60, 120)


@dataclass
class Snapshot:
    """The gate's exportable state at one moment: counters (monotonic), gauges, histograms."""

    decisions: dict[tuple[str, str, str], int]  # (route, class, verdict) -> count
    outcomes: dict[str, int]  # ok | dropped | error -> count (live headroom only)
    backend_errors: int
    gauges: dict[str, float]  # metric name -> value
    estimator: tuple[str, str]  # (estimator, state)
    histograms: dict[str, tuple[tuple[float, ...], list[int], float]]  # name -> (bounds, per-bound counts, sum)


_GAUGES = (
    (RATE, "rate", "Rate the token pacer refills at (requests/s)."),
    (CAPACITY, "mu", "Estimated capacity mu (requests/s)."),
    (LAMBDA_NEW, "lambda_new", "Protected/background arrival rate lambda_new (requests/s)."),
    (HEADROOM, "headroom", "Headroom H = rate - lambda_critical for sheddable traffic (requests/s)."),
    (BASELINE, "baseline_latency", "Baseline (no-load) latency the estimator uses (seconds)."),
    (LATENCY, "latency", "Mean latency over the estimator's last window (seconds)."),
)
_DOC = {name: doc for name, _, doc in _GAUGES} | {
    FLOOR: "Configured floor of the rate (requests/s).",
    WAITERS: "Requests held by pacing now.",
    WINDOW: "How far ahead the retry schedule reaches (seconds).",
    INFLIGHT: "Admitted requests in flight.",
    FALLBACK: "1 while the gate runs on its local fallback.",
    DECISIONS: "Admission decisions by route template, class and verdict.",
    OUTCOMES: "Responses of admitted requests by outcome.",
    BACKEND_ERRORS: "Errors talking to the shared backend.",
    ESTIMATOR: "Estimator in use and its state (value 1).",
    REQUEST_LATENCY: "Latency from admission to the last body byte (seconds).",
    PACING: "Pacing holds (seconds).",
    RETRY_AFTER: "Retry-After values sent with rejections (seconds).",
}


def snapshot(middleware: AdmitGate) -> Snapshot:
    """Read everything exported from one middleware (cheap: a few dozen attribute reads)."""
    gate = middleware.gate
    now = middleware.clock()
    decisions = {}
    for (template, klass), counts in middleware.tally.items():
        for verdict, count in zip(("admitted", "paced", "rejected"), counts, strict=True):
            decisions[template, klass, verdict] = count
    state: dict[str, Any] = gate.state(now)
    gauges = {name: float(state[key]) for name, key, _ in _GAUGES if state.get(key) is not None}
    floor = getattr(gate.headroom, "floor", None)
    if floor is not None:
        gauges[FLOOR] = float(floor)
    gauges[WAITERS] = float(gate.waiters)
    gauges[WINDOW] = gate.schedule.horizon(now)
    backend = getattr(gate, "backend", None)
    gauges[FALLBACK] = float(getattr(backend, "degraded", False))
    histograms: dict[str, tuple[tuple[float, ...], list[int], float]] = {
        PACING: (PACING_BOUNDS, list(gate.pacing_histogram), gate.pacing_seconds),
        RETRY_AFTER: (RETRY_AFTER_BOUNDS, list(middleware.retry_after_counts), float(middleware.retry_after_sum)),
    }
    outcomes: dict[str, int] = {}
    probes = gate.probes
    if probes is not None:
        gauges[INFLIGHT] = float(probes.inflight)
        histograms[REQUEST_LATENCY] = (LATENCY_BOUNDS, list(probes.histogram), probes.total_latency)
        outcomes = {"ok": probes.total - probes.total_drops, "dropped": probes.total_drops,
                    "error": probes.total_errors}  # fmt: skip
    estimator = (str(state.get("estimator", "static")), str(state.get("estimator_state", "static")))
    return Snapshot(decisions, outcomes, int(getattr(backend, "errors", 0)), gauges, estimator, histograms)


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
    return out


class GateCollector(Collector):
    """Renders one :class:`~admitgate.middleware.AdmitGate`'s state as metric families at scrape time."""

    def __init__(self, middleware: AdmitGate) -> None:
        self.middleware = middleware

    def describe(self) -> Iterator[Metric]:  # no collect() at registration time
        return iter(())

    def collect(self) -> Iterator[Metric]:
        snap = snapshot(self.middleware)
        decisions = CounterMetricFamily(DECISIONS, _DOC[DECISIONS], labels=["route", "class", "verdict"])
        for labels, count in snap.decisions.items():
            decisions.add_metric(list(labels), count)
        yield decisions
        for name, value in snap.gauges.items():
            yield GaugeMetricFamily(name, _DOC[name], value=value)
        estimator = GaugeMetricFamily(ESTIMATOR, _DOC[ESTIMATOR], labels=["estimator", "state"])
        estimator.add_metric(list(snap.estimator), 1)
        yield estimator
        if snap.outcomes:
            outcomes = CounterMetricFamily(OUTCOMES, _DOC[OUTCOMES], labels=["outcome"])
            for outcome, count in snap.outcomes.items():
                outcomes.add_metric([outcome], count)
            yield outcomes
        yield CounterMetricFamily(BACKEND_ERRORS, _DOC[BACKEND_ERRORS], value=snap.backend_errors)
        for name, (bounds, counts, total) in snap.histograms.items():
            yield HistogramMetricFamily(name, _DOC[name], buckets=_buckets(bounds, counts), sum_value=total)


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess directory, if this process runs in multiprocess mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


class MultiprocessSync:
    """prometheus-client multiprocess mode (``uvicorn --workers``, gunicorn): the same metrics, written
    to the shared files as standard metric types every ``interval`` seconds.

    Counters and histograms get the increase since the last sync; gauges are set. Gauge modes: rates,
    in-flight and waiters are summed over live processes; latencies, windows and the floor take the
    largest; the estimator state counts processes per state. Serve them with :func:`metrics_app`.
    """

    def __init__(self, middleware: AdmitGate, interval: float = 1.0) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.middleware, self.interval = middleware, interval
        self._last: Snapshot | None = None
        self._handle: Any = None
        summed = {RATE, CAPACITY, LAMBDA_NEW, HEADROOM, WAITERS, INFLIGHT}
        names = {n for n, _, _ in _GAUGES} | {FLOOR, WAITERS, WINDOW, INFLIGHT, FALLBACK}
        self.gauges = {
            name: Gauge(name, _DOC[name], registry=None, multiprocess_mode="livesum" if name in summed else "livemax")
            for name in names
        }
        self.decisions = Counter(DECISIONS, _DOC[DECISIONS], ["route", "class", "verdict"], registry=None)
        self.outcomes = Counter(OUTCOMES, _DOC[OUTCOMES], ["outcome"], registry=None)
        self.backend_errors = Counter(BACKEND_ERRORS, _DOC[BACKEND_ERRORS], registry=None)
        self.estimator = Gauge(ESTIMATOR, _DOC[ESTIMATOR], ["estimator", "state"], registry=None,
                               multiprocess_mode="livesum")  # fmt: skip
        self.histograms = {
            name: Histogram(name, _DOC[name], buckets=bounds, registry=None)
            for name, bounds in ((PACING, PACING_BOUNDS), (RETRY_AFTER, RETRY_AFTER_BOUNDS),
                                 (REQUEST_LATENCY, LATENCY_BOUNDS))
        }  # fmt: skip

    def start(self) -> None:
        """Schedule :meth:`sync` every ``interval`` s on the running event loop (idempotent)."""
        if self._handle is None:
            self._tick()

    def _tick(self) -> None:
        self.sync()
        self._handle = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def sync(self) -> None:
        snap, last = snapshot(self.middleware), self._last
        self._last = snap
        for labels, count in snap.decisions.items():
            delta = count - (last.decisions.get(labels, 0) if last else 0)
            if delta:
                self.decisions.labels(*labels).inc(delta)
        for outcome, count in snap.outcomes.items():
            delta = count - (last.outcomes.get(outcome, 0) if last else 0)
            if delta:
                self.outcomes.labels(outcome).inc(delta)
        if snap.backend_errors - (last.backend_errors if last else 0):
            self.backend_errors.inc(snap.backend_errors - (last.backend_errors if last else 0))
        for name, value in snap.gauges.items():
            self.gauges[name].set(value)
        if last is None or last.estimator != snap.estimator:
            if last is not None:
                self.estimator.labels(*last.estimator).set(0)
            self.estimator.labels(*snap.estimator).set(1)
        for name, (_bounds, counts, total) in snap.histograms.items():
            before = last.histograms.get(name) if last else None
            histogram = self.histograms[name]
            for i, count in enumerate(counts):  # prometheus-client keeps per-bound (non-cumulative) counts
                delta = count - (before[1][i] if before else 0)
                if delta:
                    histogram._buckets[i].inc(delta)
            if total - (before[2] if before else 0.0):
                histogram._sum.inc(total - (before[2] if before else 0.0))


def metrics_app(registry: CollectorRegistry | None = None) -> Any:
    """An ASGI app serving ``registry`` (default: prometheus-client's global one) in the text format.

    In multiprocess mode it serves every process's files instead (a fresh registry with
    prometheus-client's ``MultiProcessCollector``).
    """
    from prometheus_client import REGISTRY

    if multiprocess_dir():
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    return _ASGIApp(make_asgi_app(registry or REGISTRY))


class _ASGIApp:
    """An ASGI app as an instance, so Starlette's ``Route("/metrics", ...)`` serves it without a redirect."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
