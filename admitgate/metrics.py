"""Prometheus metrics, collected at scrape time from what the gate counts anyway.

:class:`GateCollector` is a prometheus-client collector: nothing is observed per request. At each
scrape it reads the gate's counters, the per-route tallies the middleware keeps (three integers per
route template), the probe aggregates (latency histogram, in-flight, outcomes) and the estimator's
state, and renders them as prometheus-client metric families. Labels are route templates and class
names only, never raw paths or client keys. The names below are the ones the dashboards and alert
rules use.

    app = AdmitGate(app, rate=..., metrics=prometheus_client.REGISTRY)
    app = Starlette(routes=[Mount("/metrics", metrics_app())])   # or metrics_app(registry)

Multi-process serving (``uvicorn --workers``, gunicorn): each process exports its own gate; scrape
every process, or run one process per pod, and aggregate in PromQL (``sum by (route)``). The
collector does not use prometheus-client's multiprocess mode, whose files only hold the standard
metric types; see the README.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

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
PACING = f"{PREFIX}_pacing_delay_seconds"  # summary-like: sum and count of pacing holds
RETRY_AFTER = f"{PREFIX}_retry_after_seconds"  # histogram of Retry-After values sent
OUTCOMES = f"{PREFIX}_responses"  # counter {outcome}: ok | dropped (5xx) | error (exception)
BACKEND_ERRORS = f"{PREFIX}_backend_errors"  # counter: shared-backend failures (0 with the in-memory backend)
FALLBACK = f"{PREFIX}_backend_fallback"  # gauge: 1 while running on a local fallback

#: Retry-After histogram bounds, seconds.
RETRY_AFTER_BOUNDS = (1, 2, 5, 10, 20, 30, 60, 120)


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
        mw = self.middleware
        gate = mw.gate
        now = mw.clock()
        decisions = CounterMetricFamily(DECISIONS, "Admission decisions by route template, class and verdict.",
                                        labels=["route", "class", "verdict"])  # fmt: skip
        for (template, klass), (admitted, paced, rejected) in mw.tally.items():
            decisions.add_metric([template, klass, "admitted"], admitted)
            decisions.add_metric([template, klass, "paced"], paced)
            decisions.add_metric([template, klass, "rejected"], rejected)
        yield decisions
        state: dict[str, Any] = gate.state(now)
        for name, key, doc in (
            (RATE, "rate", "Rate the token pacer refills at (requests/s)."),
            (CAPACITY, "mu", "Estimated capacity mu (requests/s)."),
            (LAMBDA_NEW, "lambda_new", "Protected/background arrival rate lambda_new (requests/s)."),
            (HEADROOM, "headroom", "Headroom H = rate - lambda_critical for sheddable traffic (requests/s)."),
            (BASELINE, "baseline_latency", "Baseline (no-load) latency the estimator uses (seconds)."),
            (LATENCY, "latency", "Mean latency over the estimator's last window (seconds)."),
        ):
            value = state.get(key)
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=float(value))
        floor = getattr(gate.headroom, "floor", None)
        if floor is not None:
            yield GaugeMetricFamily(FLOOR, "Configured floor of the rate (requests/s).", value=floor)
        yield GaugeMetricFamily(WAITERS, "Requests held by pacing now.", value=gate.waiters)
        yield GaugeMetricFamily(WINDOW, "How far ahead the retry schedule reaches (seconds).",
                                value=max(0.0, gate.spread.horizon(now)))  # fmt: skip
        estimator = GaugeMetricFamily(ESTIMATOR, "Estimator in use and its state (value 1).",
                                      labels=["estimator", "state"])  # fmt: skip
        estimator.add_metric([str(state.get("estimator", "static")), str(state.get("estimator_state", "static"))], 1)
        yield estimator
        probes = gate.probes
        if probes is not None:
            yield GaugeMetricFamily(INFLIGHT, "Admitted requests in flight.", value=probes.inflight)
            yield HistogramMetricFamily(REQUEST_LATENCY, "Latency from admission to the last body byte (seconds).",
                                        buckets=_buckets(LATENCY_BOUNDS, probes.histogram),
                                        sum_value=probes.total_latency)  # fmt: skip
            outcomes = CounterMetricFamily(OUTCOMES, "Responses of admitted requests by outcome.", labels=["outcome"])
            outcomes.add_metric(["ok"], probes.total - probes.total_drops)
            outcomes.add_metric(["dropped"], probes.total_drops)
            outcomes.add_metric(["error"], probes.total_errors)
            yield outcomes
        held = probes.pacing_delay if probes is not None else mw.paced_seconds
        yield HistogramMetricFamily(PACING, "Pacing holds (seconds): sum and count.",
                                    buckets=[("+Inf", float(gate.stats.paced))], sum_value=held)  # fmt: skip
        yield HistogramMetricFamily(RETRY_AFTER, "Retry-After values sent with rejections (seconds).",
                                    buckets=_buckets(RETRY_AFTER_BOUNDS, mw.retry_after_counts),
                                    sum_value=float(mw.retry_after_sum))  # fmt: skip
        backend = getattr(gate, "backend", None)
        yield CounterMetricFamily(BACKEND_ERRORS, "Errors talking to the shared backend.",
                                  value=getattr(backend, "errors", 0))  # fmt: skip
        yield GaugeMetricFamily(FALLBACK, "1 while the gate runs on its local fallback.",
                                value=float(getattr(backend, "degraded", False)))  # fmt: skip


def metrics_app(registry: CollectorRegistry | None = None) -> Any:
    """An ASGI app serving ``registry`` (default: prometheus-client's global one) in the text format."""
    from prometheus_client import REGISTRY

    return make_asgi_app(registry or REGISTRY)
