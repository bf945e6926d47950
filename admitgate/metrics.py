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
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .core.clock import Clock
from .core.gate import PACING_BOUNDS, Gate
from .core.probes import LATENCY_BOUNDS
from .limit.capacity import LiveCapacity

PREFIX = "admitgate"
REQUESTS = f"{PREFIX}_requests"  # counter {route, class, verdict}: admitted | rejected | abandoned
PACED = f"{PREFIX}_paced_requests"  # counter {route, class}: admitted after a pacing hold (part of admitted)
RATE = f"{PREFIX}_rate_requests_per_second"  # gauge: the pacer's rate
CAPACITY = f"{PREFIX}_capacity_requests_per_second"  # gauge: μ
LAMBDA_NEW = f"{PREFIX}_protected_rate_requests_per_second"  # gauge: λ_new
HEADROOM = f"{PREFIX}_headroom_requests_per_second"  # gauge: H = μ − λ_new − √λ_new, returns are scheduled at
FLOOR = f"{PREFIX}_capacity_floor_requests_per_second"  # gauge: the configured floor of a live capacity
BASELINE = f"{PREFIX}_baseline_latency_seconds"  # gauge
LATENCY = f"{PREFIX}_latency_seconds"  # gauge: mean latency of the last estimator window
INFLIGHT = f"{PREFIX}_inflight_requests"  # gauge
INFLIGHT_LIMIT = f"{PREFIX}_inflight_limit_requests"  # gauge: what the gate lets be in flight (a live capacity's)
WAITERS = f"{PREFIX}_paced_waiting_requests"  # gauge: requests being held by pacing now
WINDOW = f"{PREFIX}_safe_window_seconds"  # gauge: how far ahead the retry schedule reaches
HOLDERS = f"{PREFIX}_schedule_clients"  # gauge: clients holding a place in the retry schedule
OVERFLOW = f"{PREFIX}_schedule_overflow"  # counter: places beyond max_retry_after (told a folded value)
QUOTA_REFUSED = f"{PREFIX}_quota_refused_requests"  # counter: requests over their key's quota (HTTP ones also rejected)
ESTIMATOR = f"{PREFIX}_estimator_state"  # gauge 1 {estimator, state}
REQUEST_LATENCY = f"{PREFIX}_request_latency_seconds"  # histogram: admission to last body byte
PACING = f"{PREFIX}_pacing_delay_seconds"  # histogram of pacing holds
RETRY_AFTER = f"{PREFIX}_retry_after_seconds"  # histogram of Retry-After values sent
OUTCOMES = f"{PREFIX}_responses"  # counter {outcome}: ok | dropped (5xx) | error (exception)
BACKEND_ERRORS = f"{PREFIX}_backend_errors"  # counter: shared-backend failures (0 with the in-memory backend)
FALLBACK = f"{PREFIX}_backend_fallback"  # gauge: 1 while running on a local fallback
TENANT_REJECTED = f"{PREFIX}_tenant_rejected_requests"  # counter {tenant}: the TOP_TENANTS most rejected tenants
TENANT_SHARE = f"{PREFIX}_tenant_share_requests_per_second"  # gauge {tenant}: their share of the capacity now
SPARE = f"{PREFIX}_spare_requests"  # counter: admitted in a tenant's pool on what the other pools left
UNTIED = f"{PREFIX}_untied_requests"  # counter: requests nothing tied to a client (no ticket, no key: a port of 0)
UNTIED_ISSUED = f"{PREFIX}_untied_tickets_issued"  # counter: retry tickets handed to such clients
UNTIED_RETURNED = f"{PREFIX}_untied_tickets_returned"  # counter: those tickets that came back
#: Tenants exported by name: the most rejected ones, so the series stay bounded however many keys there are.
TOP_TENANTS = 10

#: The middleware's tally per (route template, class): a list of counts indexed by these. A request
#: is counted once, when its fate is known: let through at once, let through after a pacing hold,
#: rejected, or abandoned (the client left while held, so the app never saw it).
TALLY = (AT_ONCE, AFTER_PACING, REJECTED, ABANDONED) = (0, 1, 2, 3)

#: Retry-After histogram bounds, seconds.
RETRY_AFTER_BOUNDS = (1, 2, 5, 10, 20, 30, 60, 120)


@dataclass
class Snapshot:
    """The gate's exportable state at one moment: counters (monotonic), gauges, histograms."""

    requests: dict[tuple[str, str, str], int]  # (route, class, verdict) -> count
    paced: dict[tuple[str, str], int]  # (route, class) -> admitted after a pacing hold
    outcomes: dict[str, int]  # ok | dropped | error -> count (a live capacity only)
    counters: dict[str, int]  # metric name -> count (unlabelled counters)
    gauges: dict[str, float]  # metric name -> value
    estimator: tuple[str, str]  # (estimator, state)
    histograms: dict[str, tuple[tuple[float, ...], list[int], float]]  # name -> (bounds, per-bound counts, sum)
    tenants: list[tuple[str, int, float]] = field(default_factory=list)  # (tenant, rejections, share requests/s)


_GAUGES = (
    (RATE, "rate", "Rate the token pacer refills at (requests/s)."),
    (CAPACITY, "mu", "Estimated capacity mu (requests/s)."),
    (LAMBDA_NEW, "lambda_new", "Protected/background arrival rate lambda_new (requests/s)."),
    (
        HEADROOM,
        "headroom",
        "Headroom H = mu - lambda_new - sqrt(lambda_new): the rate rejected clients are "
        "scheduled to come back at (requests/s).",
    ),
    (BASELINE, "baseline_latency", "Baseline (no-load) latency the estimator uses (seconds)."),
    (LATENCY, "latency", "Mean latency over the estimator's last window (seconds)."),
)
_DOC = {name: doc for name, _, doc in _GAUGES} | {
    FLOOR: "Configured floor of the rate (requests/s).",
    WAITERS: "Requests held by pacing now.",
    WINDOW: "How far ahead the retry schedule reaches (seconds).",
    HOLDERS: "Clients holding a place in the retry schedule.",
    OVERFLOW: "Rejections whose place lay beyond max_retry_after (told a value folded into it).",
    QUOTA_REFUSED: "Requests refused because their key had used its quota (0 without a quota).",
    INFLIGHT: "Admitted requests in flight.",
    INFLIGHT_LIMIT: "Requests the gate lets be in flight: what the service has been seen to hold (live capacity).",
    FALLBACK: "1 while the gate runs on its local fallback.",
    REQUESTS: "Gated requests by route template, class and verdict: admitted (reached the app, paced or not), "
    "rejected, abandoned (the client left while held by pacing).",
    PACED: "Admitted requests that were held by pacing first (included in verdict=admitted).",
    OUTCOMES: "Responses of admitted requests by outcome.",
    BACKEND_ERRORS: "Errors talking to the shared backend.",
    ESTIMATOR: "Estimator in use and its state (value 1).",
    REQUEST_LATENCY: "Latency from admission to the last body byte (seconds).",
    PACING: "Pacing holds (seconds).",
    RETRY_AFTER: "Retry-After values sent with rejections (seconds).",
    TENANT_REJECTED: f"Rejections of the {TOP_TENANTS} tenants rejected most (tenants on).",
    TENANT_SHARE: f"Share of the capacity of the {TOP_TENANTS} tenants rejected most, now (requests/s).",
    SPARE: "Requests admitted in a tenant's pool beyond its share, on what the other pools left (0 without tenants).",
    UNTIED: "Requests the gate could tie to no client (no retry ticket, no key: a peer port of 0 behind a proxy "
    "that forwards no port); a returning one counts as a new arrival.",
    UNTIED_ISSUED: "Retry tickets handed to clients nothing else identifies.",
    UNTIED_RETURNED: "Retry tickets of clients nothing else identifies that came back (none: their clients keep no "
    "cookies).",
}
#: Multi-process mode: gauges that add up over a server's processes (each process has its own share
#: of the rate and its own requests); the others take the largest value over live processes.
_SUMMED = frozenset({RATE, CAPACITY, LAMBDA_NEW, HEADROOM, FLOOR, WAITERS, INFLIGHT, INFLIGHT_LIMIT, HOLDERS})


class Ranked(Protocol):
    """The tenants' table, as the collectors read it (:class:`~admitgate.core.tenants.Tenants` is one)."""

    def top(self, k: int, now: float) -> list[tuple[str, int, float]]:
        """The ``k`` tenants with the most rejections: (name, rejections, share in requests/s)."""
        ...

    def gates(self, now: float) -> list[Gate]:
        """Every live tenant's gate (they pace and hold places; the root gate only charges critical traffic)."""
        ...

    @property
    def spare(self) -> int:
        """Requests the pools admitted beyond their shares, on what the others left, so far."""
        ...


class Tallied(Protocol):
    """What the collectors read: the gate, its clock and the per-route tallies (the middleware is one).

    A protocol rather than the middleware's class, so this module never imports the ASGI shell."""

    @property
    def gate(self) -> Gate: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def tally(self) -> dict[tuple[str, str], list[int]]:
        """(route template, class) -> counts indexed by :data:`TALLY`."""

    @property
    def retry_after_counts(self) -> list[int]:
        """Responses per :data:`RETRY_AFTER_BOUNDS` bucket, the last one unbounded."""

    @property
    def retry_after_sum(self) -> float:
        """Seconds of Retry-After given out."""

    @property
    def quota_refused(self) -> int:
        """Requests refused over their key's quota (0 without a quota)."""

    @property
    def untied_counts(self) -> tuple[int, int, int]:
        """Requests nothing tied to a client, tickets handed to such clients, and those that came back."""


def snapshot(middleware: Tallied) -> Snapshot:
    """Read everything exported from one middleware (cheap: a few dozen attribute reads)."""
    gate = middleware.gate
    now = middleware.clock()
    requests, paced = {}, {}
    for (template, klass), counts in middleware.tally.items():
        requests[template, klass, "admitted"] = counts[AT_ONCE] + counts[AFTER_PACING]
        requests[template, klass, "rejected"] = counts[REJECTED]
        requests[template, klass, "abandoned"] = counts[ABANDONED]
        paced[template, klass] = counts[AFTER_PACING]
    state: dict[str, Any] = gate.state(now)
    gauges = {name: float(state[key]) for name, key, _ in _GAUGES if state.get(key) is not None}
    source = gate.capacity_source
    if isinstance(source, LiveCapacity):
        gauges[FLOOR] = float(source.floor)
    gauges[WAITERS] = float(gate.waiters)
    gauges[WINDOW] = gate.schedule.horizon(now)
    gauges[HOLDERS] = float(gate.schedule.holders)
    backend = getattr(gate, "backend", None)
    gauges[FALLBACK] = float(getattr(backend, "degraded", False))
    histograms: dict[str, tuple[tuple[float, ...], list[int], float]] = {
        PACING: (PACING_BOUNDS, list(gate.stats.pacing.counts), gate.stats.pacing.seconds),
        RETRY_AFTER: (RETRY_AFTER_BOUNDS, list(middleware.retry_after_counts), float(middleware.retry_after_sum)),
    }
    outcomes: dict[str, int] = {}
    probes = gate.probes
    if probes is not None:
        gauges[INFLIGHT] = float(probes.inflight)
        histograms[REQUEST_LATENCY] = (LATENCY_BOUNDS, list(probes.keep_histogram()), probes.total_latency)
        outcomes = {"ok": probes.total - probes.total_drops, "dropped": probes.total_drops,
                    "error": probes.total_errors}  # fmt: skip
    if gate.bound is not None:
        gauges[INFLIGHT_LIMIT] = gate.bound.limit
    estimator = (str(state.get("estimator", "static")), str(state.get("estimator_state", "static")))
    counters = {BACKEND_ERRORS: int(getattr(backend, "errors", 0)), OVERFLOW: gate.stats.overflow,
                QUOTA_REFUSED: middleware.quota_refused}  # fmt: skip
    counters[UNTIED], counters[UNTIED_ISSUED], counters[UNTIED_RETURNED] = middleware.untied_counts
    tenants: Ranked | None = getattr(middleware, "tenants", None)
    counters[SPARE] = 0 if tenants is None else tenants.spare
    top: list[tuple[str, int, float]] = []
    if tenants is not None:  # the gauges of the gates that pace and hold places: the tenants'
        top = tenants.top(TOP_TENANTS, now)
        pools = tenants.gates(now)
        gauges[WAITERS] += sum(g.waiters for g in pools)
        gauges[HOLDERS] += sum(g.schedule.holders for g in pools)
        gauges[WINDOW] = max([gauges[WINDOW], *(g.schedule.horizon(now) for g in pools)])
    return Snapshot(requests, paced, outcomes, counters, gauges, estimator, histograms, top)


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
    return out


def _keep_latencies(middleware: Tallied) -> None:
    """Have the gate's probes keep the latency histogram (from the registration on: they keep none unread)."""
    if middleware.gate.probes is not None:
        middleware.gate.probes.keep_histogram()


class GateCollector(Collector):
    """Renders one :class:`~admitgate.asgi.middleware.AdmitGate`'s state as metric families at scrape time."""

    def __init__(self, middleware: Tallied) -> None:
        self.middleware = middleware
        _keep_latencies(middleware)

    def describe(self) -> Iterator[Metric]:  # no collect() at registration time
        return iter(())

    def collect(self) -> Iterator[Metric]:
        snap = snapshot(self.middleware)
        requests = CounterMetricFamily(REQUESTS, _DOC[REQUESTS], labels=["route", "class", "verdict"])
        for labels, count in snap.requests.items():
            requests.add_metric(list(labels), count)
        yield requests
        paced = CounterMetricFamily(PACED, _DOC[PACED], labels=["route", "class"])
        for route_class, count in snap.paced.items():
            paced.add_metric(list(route_class), count)
        yield paced
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
        for name, count in snap.counters.items():
            yield CounterMetricFamily(name, _DOC[name], value=count)
        for name, (bounds, counts, total) in snap.histograms.items():
            yield HistogramMetricFamily(name, _DOC[name], buckets=_buckets(bounds, counts), sum_value=total)
        if snap.tenants:
            rejected = CounterMetricFamily(TENANT_REJECTED, _DOC[TENANT_REJECTED], labels=["tenant"])
            share = GaugeMetricFamily(TENANT_SHARE, _DOC[TENANT_SHARE], labels=["tenant"])
            merged: dict[str, tuple[int, float]] = {}  # (a user's label may name two tenants alike: one series)
            for tenant, count, rate in snap.tenants:
                before = merged.get(tenant, (0, 0.0))
                merged[tenant] = (before[0] + count, before[1] + rate)
            for tenant, (count, rate) in merged.items():
                rejected.add_metric([tenant], count)
                share.add_metric([tenant], rate)
            yield rejected
            yield share


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess directory, if this process runs in multiprocess mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


class MultiprocessSync:
    """prometheus-client multiprocess mode (``uvicorn --workers``, gunicorn): the same metrics, written
    to the shared files through prometheus-client's public metric types every ``interval`` seconds.

    Counters get the increase since the last sync (``inc``); histograms get it as observations
    (:func:`observe_counts`); gauges are set, and created only once the gate has a value for them
    (an unset multiprocess gauge would read 0). Gauge modes: rates, the floor, in-flight and
    waiters add up over live processes (``livesum``); latencies, the window, the fallback flag and
    the estimator state take the largest (``livemax``: a state reads 1 while any live process is in
    it). Serve them with :func:`metrics_app`; :meth:`stop` removes this process's gauges.
    """

    def __init__(self, middleware: Tallied, interval: float = 1.0) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.middleware, self.interval = middleware, interval
        _keep_latencies(middleware)
        self._last: Snapshot | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.gauges: dict[str, Gauge] = {}
        self._sums: dict[str, float] = {}  # each histogram's sum as written to this process's file
        self.requests = Counter(REQUESTS, _DOC[REQUESTS], ["route", "class", "verdict"], registry=None)
        self.paced = Counter(PACED, _DOC[PACED], ["route", "class"], registry=None)
        self.outcomes = Counter(OUTCOMES, _DOC[OUTCOMES], ["outcome"], registry=None)
        self.counters = {name: Counter(name, _DOC[name], registry=None)
                         for name in (BACKEND_ERRORS, OVERFLOW, QUOTA_REFUSED, SPARE, UNTIED, UNTIED_ISSUED,
                                      UNTIED_RETURNED)}  # fmt: skip
        self.estimator = Gauge(ESTIMATOR, _DOC[ESTIMATOR], ["estimator", "state"], registry=None,
                               multiprocess_mode="livemax")  # fmt: skip
        self.histograms = {
            name: Histogram(name, _DOC[name], buckets=bounds, registry=None)
            for name, bounds in ((PACING, PACING_BOUNDS), (RETRY_AFTER, RETRY_AFTER_BOUNDS),
                                 (REQUEST_LATENCY, LATENCY_BOUNDS))
        }  # fmt: skip

    def start(self) -> None:
        """Schedule :meth:`sync` every ``interval`` s on the running event loop (idempotent)."""
        if self._handle is None:
            self._tick()

    def stop(self) -> None:
        """Sync a last time, stop, and drop this process's live gauges (``mark_process_dead``)."""
        from prometheus_client import multiprocess

        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self.sync()
        multiprocess.mark_process_dead(os.getpid())

    def _tick(self) -> None:
        self.sync()
        self._handle = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def sync(self) -> None:
        from prometheus_client import Gauge

        snap, last = snapshot(self.middleware), self._last
        self._last = snap
        for labels, count in snap.requests.items():
            _inc(self.requests.labels(*labels), count - (last.requests.get(labels, 0) if last else 0))
        for route_class, count in snap.paced.items():
            _inc(self.paced.labels(*route_class), count - (last.paced.get(route_class, 0) if last else 0))
        for outcome, count in snap.outcomes.items():
            _inc(self.outcomes.labels(outcome), count - (last.outcomes.get(outcome, 0) if last else 0))
        for name, count in snap.counters.items():
            _inc(self.counters[name], count - (last.counters[name] if last else 0))
        for name, value in snap.gauges.items():
            gauge = self.gauges.get(name)
            if gauge is None:
                summed = name in _SUMMED
                gauge = Gauge(name, _DOC[name], registry=None, multiprocess_mode="livesum" if summed else "livemax")
                self.gauges[name] = gauge
            gauge.set(value)
        if last is None or last.estimator != snap.estimator:
            if last is not None:
                self.estimator.labels(*last.estimator).set(0)
            self.estimator.labels(*snap.estimator).set(1)
        for name, (bounds, counts, total) in snap.histograms.items():
            before = last.histograms.get(name) if last else None
            if before is not None:
                counts = [now - then for now, then in zip(counts, before[1], strict=True)]
            held = self._sums.get(name, 0.0)
            self._sums[name] = observe_counts(self.histograms[name], bounds, counts, held, total)


def _inc(counter: Any, delta: float) -> None:
    if delta > 0:
        counter.inc(delta)


def observe_counts(histogram: Any, bounds: Sequence[float], counts: Sequence[int], held: float, total: float) -> float:
    """Add pre-aggregated counts to a prometheus-client ``histogram`` through its public ``observe``.

    ``counts[i]`` new events fell in bucket i (``bounds`` ascending, then +Inf; values >= 0); the
    histogram's sum is ``held`` now and must be ``total`` after. prometheus-client has no public way
    to add counts, so each event is observed once, at a value inside its own bucket: every event
    starts at its bucket's lowest value, and the rest of the sum is spread evenly over the finite
    buckets' widths, the +Inf bucket taking what exceeds them. The event observed last takes the
    remainder, from the bucket where it is farthest from an edge, so the sum comes out as ``total``
    itself, unless every event sits on a bucket edge (an ulp can go). Returns the sum now held.
    Cost: one ``observe`` per event (about 3 µs in multiprocess mode).
    """
    lows = [0.0, *(math.nextafter(bound, math.inf) for bound in bounds)]  # each bucket's lowest value
    highs = [*bounds, math.inf]
    start = sum(n * low for n, low in zip(counts, lows, strict=True))
    room = sum(n * (high - low) for n, low, high in zip(counts, lows, bounds, strict=False))  # finite buckets
    rest = max(0.0, total - held - start)
    share = min(1.0, rest / room) if room > 0 else 0.0
    values: dict[int, float] = {}  # bucket -> the value its events are observed at
    for i, n in enumerate(counts):
        if n > 0:
            spread = max(0.0, rest - share * room) / n if i == len(bounds) else share * (highs[i] - lows[i])
            values[i] = min(lows[i] + spread, highs[i])  # rounding must not move an event to another bucket
    if not values:
        return held
    last = max(values, key=lambda i: min(values[i] - lows[i], highs[i] - values[i]))
    for i, value in values.items():
        for _ in range(counts[i] - (i == last)):
            histogram.observe(value)
            held += value  # what prometheus-client adds up, in the same order
    remainder = min(max(total - held, lows[last]), highs[last])
    histogram.observe(remainder)
    return held + remainder


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
    return MetricsApp(make_asgi_app(registry or REGISTRY))


class MetricsApp:
    """An ASGI app as an instance, so Starlette's ``Route("/metrics", ...)`` serves it without a redirect."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
