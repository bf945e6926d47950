"""Herd simulator: thousands of clients against the real gate on a virtual clock.

The simulator drives the very objects the middleware uses — :class:`~admitgate.core.gate.Gate` (token
pacer, pacing queue, spreading policy, tarpit) and :func:`~admitgate.core.backoff.backoff_delay` — and
models only what is outside them: a capacity-limited upstream (``workers`` slots, a service-time
distribution, a worker-count schedule, a queue timeout answered with 503), a herd of ``clients``
released together, new arrivals (Poisson, ordinary clients on the herd's own route that make one
attempt each, as steady traffic does; ``background_class = "critical"`` makes them a critical class
instead), and client policies:

* ``obey``: sleep exactly Retry-After (as urllib3 does); without one, full-jitter backoff;
* ``obey-jitter``: Retry-After plus U(0, 1) s of its own;
* ``ignore``: retry every ``ignore_interval`` s whatever the server says;
* ``full`` / ``equal`` / ``decorrelated``: the client helper's backoff, never before Retry-After.

It records every attempt as :class:`~admitgate.sim.herd.Attempt`, so :func:`~admitgate.sim.herd.summarise`
computes the same figures for simulated and real herds. Same seed, same result.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.backoff import backoff_delay
from ..core.errors import ConfigError, non_negative
from ..core.gate import Decision, Gate, Verdict
from ..core.priority import DEFAULT_CLASSES
from ..core.settings import Settings
from ..limit.estimators import Static
from ..limit.headroom import LiveHeadroom
from .herd import Attempt, HerdResult, summarise

POLICIES = ("obey", "obey-jitter", "ignore", "full", "equal", "decorrelated")
_ARRIVE, _HOLD_END, _DONE, _TIMEOUT, _RESPOND = range(5)


@dataclass
class Scenario:
    """Everything a run needs; times in seconds, rates in requests/s."""

    name: str = "cache-expiry herd"
    clients: int = 2000
    release_at: float = 6.0  # new arrivals run alone before this (warm-up: λ_new is a median of 5 seconds)
    release_spread: float = 0.0  # clients released uniformly over this many seconds
    workers: int = 20
    service_time: float = 0.1  # mean
    service_dist: str = "fixed"  # fixed | exponential | lognormal
    queue_timeout: float = 1.0
    capacity: list[tuple[float, ...]] = field(default_factory=list)  # (time, workers[, service_time]) steps
    demand: list[tuple[float, float]] = field(default_factory=list)  # (time, rate) open-loop arrivals, no retries
    estimator: dict[str, Any] | None = None  # a [headroom] table: the gate's rate is estimated live
    capacity_known: bool = False  # a static gate is told the capacity as it changes (an external capacity probe)
    background_rate: float = 20.0  # new arrivals λ₀, requests/s, one attempt each
    background_class: str = "default"
    policy: str = "obey"
    ignore_fraction: float = 0.0
    ignore_interval: float = 0.1
    recognisable: bool = True
    gate: bool = True
    rate_fraction: float = 1.0  # the gate's static rate μ, as a fraction of the initial capacity
    burst: float | None = None  # default: workers
    spread: str = "schedule"
    max_pacing_delay: float = 1.5
    tarpit: float = 1.0
    network_delay: float = 0.0005  # one way, client <-> gate
    edge_cpu: float = 0.0  # CPU seconds per HTTP request on the server's one core (0: an ideal server)
    reject_cpu: float | None = None  # CPU seconds per 429 answered by the gate (None: edge_cpu)
    duration: float = 300.0  # hard bound on simulated time
    seed: int = 1

    def validate(self) -> Scenario:
        if self.clients < (0 if self.demand else 1):
            raise ConfigError("clients", "must be >= 1 (or >= 0 with a demand schedule)", self.clients)
        if self.workers < 1:
            raise ConfigError("workers", "must be >= 1", self.workers)
        if self.policy not in POLICIES:
            raise ConfigError("policy", f"unknown; known: {', '.join(POLICIES)}", self.policy)
        if self.service_dist not in ("fixed", "exponential", "lognormal"):
            raise ConfigError("service_dist", "must be fixed, exponential or lognormal", self.service_dist)
        if self.background_class not in DEFAULT_CLASSES:
            known = ", ".join(DEFAULT_CLASSES)
            raise ConfigError("background_class", f"unknown; known: {known}", self.background_class)
        if not 0 <= self.ignore_fraction <= 1:
            raise ConfigError("ignore_fraction", "must be in [0, 1]", self.ignore_fraction)
        non_negative("edge_cpu", self.edge_cpu)
        for name in ("service_time", "queue_timeout", "duration", "rate_fraction"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be > 0", getattr(self, name))
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"unknown scenario field; known: {', '.join(sorted(known))}")
        data = dict(data)
        for key in ("capacity", "demand"):
            if key in data:
                data[key] = [tuple(step) for step in data[key]]
        return cls(**data).validate()


class _Upstream:
    """K workers with a FIFO queue; a request waiting longer than the timeout gets 503."""

    def __init__(self, s: Scenario, rng: random.Random) -> None:
        self.workers, self.busy, self.peak = s.workers, 0, 0
        self.service_time = s.service_time
        self.queue: deque[list[Any]] = deque()  # [enqueued_at, request, alive]
        self.s, self.rng = s, rng

    def service(self) -> float:
        dist, mean = self.s.service_dist, self.service_time
        if dist == "exponential":
            return self.rng.expovariate(1 / mean)
        if dist == "lognormal":
            sigma = 0.5
            return self.rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
        return mean


class Simulation:
    """One run of a :class:`Scenario`. ``run()`` returns the summary dict (see :func:`summarise`)."""

    def __init__(self, scenario: Scenario, progress: Callable[[float], None] | None = None) -> None:
        self.s = scenario.validate()
        self.rng = random.Random(scenario.seed)
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.up = _Upstream(scenario, self.rng)
        s = scenario
        rate: Any = s.workers / s.service_time * s.rate_fraction
        if s.estimator is not None:
            from ..config import headroom_from_config

            table = dict(s.estimator)
            name = table.get("estimator", "bdp")
            if name != "static":  # the estimator's jitter follows the scenario's seed: same seed, same run
                table[name] = {"seed": s.seed, **table.get(name, {})}
            rate = headroom_from_config(table)
        elif s.capacity_known:  # the operator's capacity, as it changes: a replacing external probe
            rate = LiveHeadroom(Static(rate), capacity_probes=[self._true_capacity], probe_mode="replace",
                                max_step=1e6, min_samples=1)  # fmt: skip
        self.gate = (
            Gate(
                rate,
                Settings(
                    burst=s.burst if s.burst is not None else float(s.workers),
                    spread=s.spread,
                    max_pacing_delay=s.max_pacing_delay,
                    tarpit=s.tarpit,
                ),
                now=0.0,
            )
            if s.gate
            else None
        )
        self.background = DEFAULT_CLASSES[s.background_class]
        self.result = HerdResult(s.clients)
        self.ignorers = set(self.rng.sample(range(s.clients), round(s.clients * s.ignore_fraction)))
        self.attempt_no = [0] * s.clients
        self.previous = [0.0] * s.clients
        self.progress = progress
        self.series: dict[str, dict[int, float]] = {"edge": {}, "admitted": {}, "served": {}, "capacity": {},
                                                     "headroom": {}}  # fmt: skip
        self.herd_left = s.clients
        self.cpu_free = 0.0  # when the server's core is next idle (edge_cpu > 0 only)
        self.probes = self.gate.probes if self.gate is not None else None
        #: every 0.1 s: (t, true capacity, the gate's rate, the estimator's μ or None)
        self.trace: list[tuple[float, float, float, float | None]] = []
        #: open-loop requests: (time answered, latency from admission or None if rejected, status)
        self.outcomes: list[tuple[float, float | None, int]] = []
        self.demand_max = max((r for _, r in s.demand), default=0.0)

    # -- event plumbing ---------------------------------------------------------------------
    def at(self, t: float, kind: int, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def run(self) -> dict[str, Any]:
        s = self.s
        for i in range(s.clients):
            offset = self.rng.uniform(0, s.release_spread) if s.release_spread else 0.0
            self.at(s.release_at + offset, _ARRIVE, [i, s.release_at + offset])
        if s.background_rate > 0:
            self.at(self.rng.expovariate(s.background_rate), _ARRIVE, [-1, 0.0])
        for step in s.capacity:
            self.at(step[0], _TIMEOUT, ("capacity", *step[1:]))
        if self.demand_max > 0:
            self.at(self.rng.expovariate(self.demand_max), _ARRIVE, [-2, 0.0])
        handlers = (self._arrive, self._hold_end, self._done, self._timeout, self._respond)
        wall, last_report = time.monotonic(), 0
        events = self.events
        cpu = s.edge_cpu
        next_sample = 0.0
        open_loop = bool(s.demand)
        next_trace = 0.0
        while events and (self.herd_left or open_loop):
            t, _, kind, data = heapq.heappop(events)
            if t > s.duration:
                break
            if cpu:
                if t < self.cpu_free:  # the event loop is busy: everything due now runs late
                    self.at(self.cpu_free, kind, data)
                    continue
                if kind == _ARRIVE or (kind == _TIMEOUT and isinstance(data, list) and data[2]):
                    self.cpu_free = t + cpu  # a request parsed and answered; a queue timeout cancelled and answered
            handlers[kind](t, data)
            if open_loop and t >= next_trace:
                next_trace = round(t * 10) / 10 + 0.1
                mu = None if self.gate is None else getattr(getattr(self.gate.headroom, "estimator", None), "mu", None)
                rate = self.gate.pacer.rate if self.gate is not None else float("inf")
                self.trace.append((round(t, 1), self.up.workers / self.up.service_time, rate, mu))
            if t >= next_sample:  # one sample a second of what the gate believes and the upstream can do
                next_sample = math.floor(t) + 1.0
                second = int(t)
                self.series["capacity"][second] = self.up.workers / self.up.service_time
                if self.gate is not None:
                    self.series["headroom"][second] = self.gate.shed_rate(t)
            if self.progress and self.seq - last_report > 200_000:
                last_report = self.seq
                if time.monotonic() - wall > 2.0:
                    self.progress(t)
        if open_loop and not s.clients:
            return {"scenario": s.name, "simulated_s": round(t, 3)}
        summary = summarise(self._shifted(), self.headroom(), self.headroom_points() if s.capacity else ())
        upstream = [v for k, v in self.series["admitted"].items() if k >= s.release_at + 1] or [0]
        mean_up = sum(upstream) / len(upstream)
        summary["upstream_peak_to_avg"] = round(max(upstream) / mean_up, 3) if mean_up else None
        summary["scenario"] = s.name
        summary["gate"] = "admitgate" if s.gate else "none"
        summary["peak_concurrency"] = self.up.peak
        summary["simulated_s"] = round(t, 3) if events or not self.herd_left else None
        summary["series"] = {name: {str(k - int(s.release_at)): v for k, v in sorted(values.items())}
                             for name, values in self.series.items()}  # fmt: skip
        return summary

    def headroom(self) -> float:
        """The bound's H: initial capacity minus the background rate."""
        return self.s.workers / self.s.service_time - self.s.background_rate

    def headroom_points(self) -> list[tuple[float, float]]:
        """H(t) after the release as (t, H) points, capacity steps included (H floored at 0)."""
        s = self.s
        mu = [(0.0, s.workers / s.service_time)]
        service = s.service_time
        for t, workers, *rest in sorted(s.capacity):
            service = float(rest[0]) if rest else service
            t_rel = max(0.0, t - s.release_at)
            mu += [(t_rel, mu[-1][1]), (t_rel, workers / service)]
        return [(t, max(0.0, m - s.background_rate)) for t, m in mu]

    def _shifted(self) -> HerdResult:
        """Records relative to the release, as the loopback herd reports them."""
        r0 = self.s.release_at
        out = HerdResult(self.result.clients)
        out.attempts = [Attempt(a.client, a.sent - r0, a.done - r0, a.status, a.retry_after)
                        for a in self.result.attempts]  # fmt: skip
        out.finished = {c: t - r0 for c, t in self.result.finished.items()}
        return out

    # -- the edge: the gate ---------------------------------------------------------------------
    def _true_capacity(self, now: float) -> float:
        return self.up.workers / self.up.service_time * self.s.rate_fraction

    def _arrive(self, t: float, data: list[Any]) -> None:
        client, sent = data
        s, gate = self.s, self.gate
        bucket = int(t)
        if client == -2:
            self._open_loop(t)
            return
        if client >= 0:
            self.series["edge"][bucket] = self.series["edge"].get(bucket, 0) + 1
            klass, key = DEFAULT_CLASSES["default"], (client if s.recognisable else None)
        else:  # a new arrival: schedule the next one; it makes this one attempt
            self.at(t + self.rng.expovariate(s.background_rate), _ARRIVE, [-1, t])
            klass, key = self.background, None
        if gate is None:
            self._to_upstream(t, [client, sent])
            return
        self._follow(t, gate.admit(1.0, klass, t, lambda: key), [client, sent])

    def _follow(self, t: float, d: Decision, request: list[Any]) -> None:
        """Carry out the gate's decision for ``request`` at ``t``: hold, forward, or answer 429."""
        if d.delay:
            self.at(t + d.delay, _HOLD_END, (d, request))
        elif d.verdict is not Verdict.REJECT:
            self._to_upstream(t, request)
        elif request[0] == -2:
            self.outcomes.append((t, None, 429))
        else:
            s = self.s
            if s.edge_cpu and s.reject_cpu is not None:  # a 429 costs its own measured CPU, not the mean
                self.cpu_free += s.reject_cpu - s.edge_cpu
            self.at(t + s.network_delay, _RESPOND, (request[0], request[1], 429, d.retry_after))

    def _hold_end(self, t: float, data: tuple[Decision, list[Any]]) -> None:
        assert self.gate is not None
        decision, request = data
        after = self.gate.end_hold(decision, t)
        assert after is not None  # simulated clients never leave while held
        self._follow(t, after, request)

    def _demand(self, t: float) -> float:
        rate = 0.0
        for start, value in self.s.demand:
            if start <= t:
                rate = value
        return rate

    def _open_loop(self, t: float) -> None:
        """One open-loop arrival (Poisson at the demand schedule's rate, by thinning); no retries."""
        self.at(t + self.rng.expovariate(self.demand_max), _ARRIVE, [-2, 0.0])
        if self.rng.random() * self.demand_max >= self._demand(t):
            return
        request = [-2, t]
        if self.gate is None:
            self._to_upstream(t, request)
        else:
            self._follow(t, self.gate.admit(1.0, DEFAULT_CLASSES["default"], t, lambda: None), request)

    # -- the upstream ---------------------------------------------------------------------------
    def _to_upstream(self, t: float, request: list[Any]) -> None:
        up = self.up
        self.series["admitted"][int(t)] = self.series["admitted"].get(int(t), 0) + 1
        request.append(t)  # admitted at
        if self.probes is not None:
            self.probes.admit(t)
        if up.busy < up.workers:
            self._start(t, request)
        else:
            entry = [t, request, True]
            up.queue.append(entry)
            self.at(t + self.s.queue_timeout, _TIMEOUT, entry)

    def _start(self, t: float, request: list[Any]) -> None:
        up = self.up
        up.busy += 1
        up.peak = max(up.peak, up.busy)
        self.at(t + up.service(), _DONE, request)

    def _done(self, t: float, request: list[Any]) -> None:
        up = self.up
        up.busy -= 1
        self._drain_queue(t)
        client, sent, admitted = request
        if self.probes is not None:
            self.probes.complete(t - admitted, 200, t)
        if client == -2:
            self.outcomes.append((t, t - admitted, 200))
            return
        self.series["served"][int(t)] = self.series["served"].get(int(t), 0) + 1
        self._respond(t + self.s.network_delay, (client, sent, 200, None))

    def _drain_queue(self, t: float) -> None:
        up = self.up
        while up.queue and up.busy < up.workers:
            entry = up.queue.popleft()
            if entry[2]:
                entry[2] = False
                self._start(t, entry[1])

    def _timeout(self, t: float, entry: Any) -> None:
        if isinstance(entry, tuple):  # a capacity step
            self.up.workers = int(entry[1])
            if len(entry) > 2:
                self.up.service_time = float(entry[2])
            self._drain_queue(t)
            return
        if entry[2]:  # still queued: the service gives up on it
            entry[2] = False
            client, sent, admitted = entry[1]
            if self.probes is not None:
                self.probes.complete(t - admitted, 503, t)
            if client == -2:
                self.outcomes.append((t, t - admitted, 503))
                return
            self._respond(t + self.s.network_delay, (client, sent, 503, None))

    # -- clients --------------------------------------------------------------------------------
    def _respond(self, t: float, data: tuple[int, float, int, int | None]) -> None:
        client, sent, status, retry_after = data
        self.result.attempts.append(Attempt(client, sent, t, status, retry_after))
        if client < 0:
            return
        if status == 200:
            self.result.finished[client] = t
            self.herd_left -= 1
            return
        delay = self._client_delay(client, retry_after)
        self.at(t + delay + self.s.network_delay, _ARRIVE, [client, t + delay + self.s.network_delay])

    def _client_delay(self, client: int, retry_after: int | None) -> float:
        s, rng = self.s, self.rng
        attempt = self.attempt_no[client]
        self.attempt_no[client] = attempt + 1
        if client in self.ignorers or s.policy == "ignore":
            return s.ignore_interval
        if s.policy in ("obey", "obey-jitter"):
            if retry_after is None:  # retry k (from 1): U(0, min(5, 0.1 * 2^k)), as the loopback herd does
                return backoff_delay(attempt + 1, base=0.1, cap=5.0, uniform=rng.uniform)
            return retry_after + (rng.uniform(0, 1) if s.policy == "obey-jitter" else 0.0)
        delay = backoff_delay(attempt, base=0.1, cap=20.0, jitter=s.policy, previous=self.previous[client],
                              uniform=rng.uniform)  # fmt: skip
        self.previous[client] = delay
        return max(delay, float(retry_after or 0))


#: Embedded scenarios. Each is a dict of Scenario fields; a TOML file may name one as ``base``.
SCENARIOS: dict[str, dict[str, Any]] = {
    "cache-expiry": {"name": "cache-expiry herd"},
    # bench/herd.py's setup with the demo server's measured CPU on its one core: ~200 µs per request
    # or queue timeout, 108 µs per 429 (wrk against an all-rejecting gate)
    "loopback-demo": {"name": "cache-expiry herd on the loopback demo server", "edge_cpu": 0.0002,
                      "reject_cpu": 0.000108},
    "outage-recovery": {"name": "outage, then recovery with a backlog", "release_spread": 10.0,
                        "capacity": [(6.0, 0), (16.0, 20)]},
    "window-reopening": {"name": "rate-limit window reopening (synchronised reset)", "clients": 4000},
    "step-down": {"name": "capacity halves 5 s into the herd", "capacity": [(11.0, 10)]},
    "step-up": {"name": "capacity doubles 2 s into the herd", "capacity": [(8.0, 40)]},
    "ramp": {"name": "capacity ramps from 5 to 20 workers over 10 s (warming)", "workers": 5,
             "capacity": [(6.0 + i, 5 + i * 1.5) for i in range(11)]},
}  # fmt: skip


def scenario_from(name_or_data: str | dict[str, Any] | None = None, **overrides: Any) -> Scenario:
    """An embedded scenario by name, or a dict of fields (``base`` naming one to start from)."""
    data: dict[str, Any] = {}
    if isinstance(name_or_data, str):
        if name_or_data not in SCENARIOS:
            raise ConfigError("scenario", f"unknown; known: {', '.join(SCENARIOS)}", name_or_data)
        data.update(SCENARIOS[name_or_data])
    elif isinstance(name_or_data, dict):
        base = name_or_data.get("base")
        if base is not None:
            data.update(scenario_from(base).__dict__)
        data.update({k: v for k, v in name_or_data.items() if k != "base"})
    data.update({k: v for k, v in overrides.items() if v is not None})
    return Scenario.from_dict(data)


def simulate(scenario: Scenario, progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run ``scenario``; return the summary (drain time vs M/H, peak-to-average, 503s, latencies...)."""
    return Simulation(scenario, progress).run()


_LINES = (
    ("edge", "herd arrivals at the edge", "-"),
    ("admitted", "forwarded to the upstream", "-"),
    ("served", "served (2xx)", "-."),
    ("capacity", "capacity μ", "--"),
    ("headroom", "gate's H = rate − λ_new", ":"),
)


def plot(runs: list[dict[str, Any]], path: str) -> None:
    """Save a PNG: per run, herd arrivals at the edge, admissions, capacity μ and the gate's H per second.

    Needs matplotlib (``pip install 'admitgate[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plot", "needs matplotlib: pip install 'admitgate[plot]'") from None
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.2), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        series = run["series"]
        for name, label, style in _LINES:
            points = sorted((int(k), v) for k, v in series.get(name, {}).items() if int(k) >= -1)
            if points:
                ax.step([p[0] for p in points], [p[1] for p in points], style, where="post", label=label)
        bound = f"∫H dt = M at {run['bound_integral_s']} s" if "bound_integral_s" in run else f"M/H {run['bound_s']} s"
        figures = f"drain {run['drain_s']} s ({bound}), 5xx {run['server_5xx']}"
        ax.set_title(f"{run['scenario']}: gate = {run['gate']}\n{figures}", fontsize=9)
        ax.set_xlabel("seconds since the release")
        ax.set_yscale("symlog", linthresh=100)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("requests per second")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@contextlib.contextmanager
def stderr_progress(total: float) -> Iterator[Callable[[float], None]]:
    """A progress line on stderr for a run of at most ``total`` simulated seconds: yields the callback
    for :func:`simulate` and, once a line was shown, ends it with a newline when the run is over."""
    shown = False

    def report(t: float) -> None:
        nonlocal shown
        shown = True
        print(f"\r  simulated {t:8.1f} of at most {total:g} s", end="", file=sys.stderr, flush=True)

    try:
        yield report
    finally:
        if shown:
            print(file=sys.stderr, flush=True)
