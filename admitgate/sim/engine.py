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

It records every attempt as :class:`~admitgate.sim.summary.Attempt`, so :func:`~admitgate.sim.summary.summarise`
computes the same figures for simulated and real herds. Same seed, same result. What a run is made of is
a :class:`~admitgate.sim.scenario.Scenario`; :mod:`admitgate.sim.plot` draws runs.
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ..core.backoff import backoff_delay
from ..core.decision import Decider, Decision, Verdict
from ..core.gate import Gate
from ..core.priority import DEFAULT_CLASSES, Priority
from ..core.settings import Settings
from ..core.tenants import Tenants
from ..limit.capacity import LiveCapacity
from ..limit.estimators import DEFAULT_ESTIMATOR, ESTIMATORS, capacity_from_config
from ..limit.static import Static
from .scenario import Scenario
from .summary import Attempt, HerdResult, summarise

_ARRIVE, _HOLD_END, _DONE, _TIMEOUT, _RESPOND, _CAPACITY = range(6)
#: A request's client: a herd client's index (0 to clients - 1), or one of these.
NEW_ARRIVAL = -1  # steady new traffic: one attempt, then gone
OPEN_LOOP = -2  # a demand schedule's request: one attempt, answered into ``outcomes``


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
            table = dict(s.estimator)
            name = table.get("estimator", DEFAULT_ESTIMATOR)
            if "seed" in inspect.signature(ESTIMATORS.get(name, Static)).parameters:  # (its jitter: the run's seed)
                table[name] = {"seed": s.seed, **table.get(name, {})}
            rate = capacity_from_config(table)
        elif s.capacity_known:  # the operator's capacity, as it changes: a replacing external probe
            rate = LiveCapacity(Static(rate), capacity_probes=[self._true_capacity], probe_mode="replace",
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
        #: the live capacity the gate reads, if any (the trace records its estimator's μ)
        self.live = rate if isinstance(rate, LiveCapacity) else None
        self.background = DEFAULT_CLASSES[s.background_class]
        tenancy = s.tenancy()
        #: fair shares among tenants (None: one pool), deciding every request as the middleware's Tenants does
        self.tenants = None if tenancy is None or self.gate is None else Tenants(tenancy, self.gate, now=0.0)
        #: what decides each request, as the middleware's decider does: the tenants' table, else the gate
        self.decider: Decider | None = self.tenants if self.tenants is not None else self.gate
        groups = s.herd_tenants or [("herd", s.clients)]
        #: each herd client's tenant name (None without tenants). (``is not None``: a table is falsy while it has no
        #: pools, as it has at first, and the tenant herd's clients were all taken for newcomers.)
        keyed = self.tenants is not None
        self.tenant_of: list[str | None] = [name if keyed else None for name, n in groups for _ in range(n)]
        self.result = HerdResult(s.clients)
        self.ignorers = set(self.rng.sample(range(s.clients), round(s.clients * s.ignore_fraction)))
        self.attempt_no = [0] * s.clients
        self.previous = [0.0] * s.clients
        self.progress = progress
        self.now = 0.0  # the time of the event being handled (seconds)
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
            self.at(self.rng.expovariate(s.background_rate), _ARRIVE, [NEW_ARRIVAL, 0.0])
        for step in s.capacity:
            self.at(step[0], _CAPACITY, step[1:])
        if self.demand_max > 0:
            self.at(self.rng.expovariate(self.demand_max), _ARRIVE, [OPEN_LOOP, 0.0])
        handlers = (self._arrive, self._hold_end, self._done, self._timeout, self._respond, self._capacity)
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
            self.now = t
            if cpu:
                if t < self.cpu_free:  # the event loop is busy: everything due now runs late
                    self.at(self.cpu_free, kind, data)
                    continue
                if kind == _ARRIVE or (kind == _TIMEOUT and data[2]):
                    self.cpu_free = t + cpu  # a request parsed and answered; a queue timeout cancelled and answered
            handlers[kind](t, data)
            if open_loop and t >= next_trace:
                next_trace = round(t * 10) / 10 + 0.1
                mu = None if self.gate is None or self.live is None else self.live.estimator.mu
                rate = self.gate.pacer.rate if self.gate is not None else float("inf")
                self.trace.append((round(t, 1), self.up.workers / self.up.service_time, rate, mu))
            if t >= next_sample:  # one sample a second of what the gate believes and the upstream can do
                next_sample = math.floor(t) + 1.0
                second = int(t)
                self.series["capacity"][second] = self.up.workers / self.up.service_time
                if self.gate is not None:
                    self.series["headroom"][second] = self.gate.headroom(t)
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
        if client == OPEN_LOOP:
            self._open_loop(t)
            return
        if client >= 0:
            self.series["edge"][bucket] = self.series["edge"].get(bucket, 0) + 1
            klass, key, tenant = (
                DEFAULT_CLASSES["default"],
                (client if s.recognisable else None),
                self.tenant_of[client],
            )
        else:  # a new arrival: schedule the next one; it makes this one attempt
            self.at(t + self.rng.expovariate(s.background_rate), _ARRIVE, [NEW_ARRIVAL, t])
            klass, key, tenant = self.background, None, s.background_tenant
        if gate is None:
            self._to_upstream(t, [client, sent])
            return
        self._follow(t, self._admit(klass, t, key, tenant), [client, sent])

    def _admit(self, klass: Priority, t: float, key: int | None, tenant: str | None) -> Decision:
        """The gate's decision (in the request's tenant's pool, with tenants) for one request of cost 1."""
        assert self.decider is not None
        return self.decider.admit(1.0, klass, t, lambda: key, tenant)

    def _follow(self, t: float, d: Decision, request: list[Any]) -> None:
        """Carry out the gate's decision for ``request`` at ``t``: hold, forward, or answer 429. A hold waiting for
        room in flight ends sooner when its decider has room, as the middleware's does."""
        if d.delay:
            hold = [d, request, False]  # (the decision, the request, whether the hold is over)
            if d.room:
                assert self.decider is not None
                self.decider.wait_room(partial(self._wake, hold))
            self.at(t + d.delay, _HOLD_END, hold)
        elif d.verdict is not Verdict.REJECT:
            self._to_upstream(t, request)
        elif request[0] == OPEN_LOOP:
            self.outcomes.append((t, None, 429))
        else:
            s = self.s
            if s.edge_cpu and s.reject_cpu is not None:  # a 429 costs its own measured CPU, not the mean
                self.cpu_free += s.reject_cpu - s.edge_cpu
            self.at(t + s.network_delay, _RESPOND, (request[0], request[1], 429, d.retry_after))

    def _wake(self, hold: list[Any]) -> bool:
        """A hold waiting for room is woken now (False: it is over already)."""
        if hold[2]:
            return False
        self.at(self.now, _HOLD_END, hold)
        return True

    def _hold_end(self, t: float, hold: list[Any]) -> None:
        assert self.decider is not None
        decision, request, over = hold
        if over:  # (woken for room before its timer: the timer finds it over)
            return
        hold[2] = True
        after = self.decider.end_hold(decision, t)
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
        self.at(t + self.rng.expovariate(self.demand_max), _ARRIVE, [OPEN_LOOP, 0.0])
        if self.rng.random() * self.demand_max >= self._demand(t):
            return
        request = [OPEN_LOOP, t]
        if self.gate is None:
            self._to_upstream(t, request)
        else:
            self._follow(t, self._admit(DEFAULT_CLASSES["default"], t, None, None), request)

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
            self._freed()
        if client == OPEN_LOOP:
            self.outcomes.append((t, t - admitted, 200))
            return
        self.series["served"][int(t)] = self.series["served"].get(int(t), 0) + 1
        self._respond(t + self.s.network_delay, (client, sent, 200, None))

    def _freed(self) -> None:
        """A request left flight: room may have come for holds waiting for it."""
        if self.decider is not None:
            self.decider.room_freed()

    def _drain_queue(self, t: float) -> None:
        up = self.up
        while up.queue and up.busy < up.workers:
            entry = up.queue.popleft()
            if entry[2]:
                entry[2] = False
                self._start(t, entry[1])

    def _capacity(self, t: float, step: tuple[float, ...]) -> None:
        """A capacity step: ``(workers[, service_time])`` from ``t`` on."""
        self.up.workers = int(step[0])
        if len(step) > 1:
            self.up.service_time = float(step[1])
        self._drain_queue(t)

    def _timeout(self, t: float, entry: list[Any]) -> None:
        if entry[2]:  # still queued: the service gives up on it
            entry[2] = False
            client, sent, admitted = entry[1]
            if self.probes is not None:
                self.probes.complete(t - admitted, 503, t)
                self._freed()
            if client == OPEN_LOOP:
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


def simulate(scenario: Scenario, progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run ``scenario``; return the summary (drain time vs M/H, peak-to-average, 503s, latencies...)."""
    return Simulation(scenario, progress).run()


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
