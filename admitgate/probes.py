"""Probes: what the requests the gate lets through tell about the service behind it.

:class:`Probes` aggregates, in O(1) per request and in bounded memory, the four signals the
capacity estimators read: in-flight concurrency at admission, latency from admission to the end of
the response body (streaming bodies included), the outcome (success; an app error; a 5xx, the drop
signal) and pacing delay. Requests the client abandoned, or that were cancelled, release their
in-flight place but give no latency sample: how long an abandoned request ran says nothing about
the service.

Samples go into the current time bucket (``width`` seconds, 0.1 by default); a finished bucket is
pushed onto a ring of the last ``buckets`` (50: five seconds). Nothing else happens per request, so
the estimators' arithmetic runs on the gate's refresh cadence, never on the admit path. Lifetime
totals (count, latency sum, a fixed-bound latency histogram) are kept beside the ring for metrics.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from .errors import ConfigError, positive

#: Latency histogram bounds, seconds (prometheus-client's defaults, extended to 30 s).
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One finished time bucket. Counts are requests; times are seconds."""

    end: float  # when the bucket closed
    completed: int = 0  # responses finished (success, 4xx and 5xx alike)
    latency: float = 0.0  # sum of their latencies
    drops: int = 0  # of which 5xx (the service shed or timed out)
    errors: int = 0  # app exceptions (no response; no latency sample)
    admitted: int = 0  # requests let through in the bucket
    inflight: int = 0  # most in flight at an admission in the bucket
    busy: float = 0.0  # time-average of requests in flight over the bucket
    shed: int = 0  # requests the gate paced or rejected in the bucket (demand above the rate)


class Probes:
    """Bucketed probe aggregates. Times are seconds on the gate's clock.

    The middleware calls :meth:`admit` when a request goes on to the app, then exactly one of
    :meth:`complete` (response finished), :meth:`fail` (the app raised) or :meth:`cancel` (the
    client went away, or the task was cancelled). The gate calls :meth:`limited` for each request
    it paced or rejected. Readers call :meth:`roll` with the current time, then read :attr:`ring`.
    """

    __slots__ = (
        "_admitted", "_area", "_completed", "_drops", "_errors", "_index", "_inv", "_latency", "_peak", "_shed", "_t",
        "histogram", "inflight", "paced", "pacing_delay", "ring", "total", "total_drops", "total_errors",
        "total_latency", "width",
    )  # fmt: skip

    def __init__(self, width: float = 0.1, buckets: int = 50, now: float = 0.0) -> None:
        self.width = positive("probe_bucket", width)
        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 2:
            raise ConfigError("probe_buckets", "must be an integer >= 2", buckets)
        self._inv = 1.0 / self.width
        self._index = int(now * self._inv)
        self.ring: deque[Bucket] = deque(maxlen=buckets)
        self.inflight = 0
        self._completed = self._drops = self._errors = self._admitted = self._peak = self._shed = 0
        self._latency = 0.0
        self._area, self._t = 0.0, now  # in-flight × seconds so far in the bucket, and when it was last moved
        # lifetime totals (monotonic counters, for metrics)
        self.total = self.total_drops = self.total_errors = self.paced = 0
        self.total_latency = self.pacing_delay = 0.0
        self.histogram = [0] * (len(LATENCY_BOUNDS) + 1)  # per bound, then +Inf; not cumulative

    # -- the request path (O(1)) -------------------------------------------------------------
    def admit(self, now: float) -> None:
        """A request goes on to the app at ``now``."""
        if int(now * self._inv) != self._index:
            self.roll(now)
        self._area += self.inflight * (now - self._t)
        self._t = now
        self._admitted += 1
        inflight = self.inflight = self.inflight + 1
        if inflight > self._peak:
            self._peak = inflight

    def complete(self, latency: float, status: int, now: float) -> None:
        """Its response finished at ``now`` after ``latency`` seconds with ``status``."""
        if int(now * self._inv) != self._index:
            self.roll(now)
        self._area += self.inflight * (now - self._t)
        self._t = now
        self.inflight -= 1
        self._completed += 1
        self._latency += latency
        self.total += 1
        self.total_latency += latency
        self.histogram[bisect_left(LATENCY_BOUNDS, latency)] += 1
        if status >= 500:
            self._drops += 1
            self.total_drops += 1

    def fail(self, now: float) -> None:
        """The app raised before finishing the response."""
        if int(now * self._inv) != self._index:
            self.roll(now)
        self._area += self.inflight * (now - self._t)
        self._t = now
        self.inflight -= 1
        self._errors += 1
        self.total_errors += 1

    def cancel(self, now: float) -> None:
        """The request was abandoned at ``now``: it frees its place and gives no sample."""
        if int(now * self._inv) != self._index:
            self.roll(now)
        self._area += self.inflight * (now - self._t)
        self._t = now
        self.inflight -= 1

    def limited(self, delay: float = 0.0) -> None:
        """The gate paced (``delay`` > 0, seconds) or rejected a request: demand exceeds the rate."""
        self._shed += 1
        if delay:
            self.paced += 1
            self.pacing_delay += delay

    # -- readers -----------------------------------------------------------------------------
    def roll(self, now: float) -> None:
        """Close every bucket that ended by ``now`` (empty ones included, at most a ring's worth)."""
        index = int(now * self._inv)
        if index <= self._index:
            return
        width = self.width
        end = (self._index + 1) * width
        busy = (self._area + self.inflight * max(0.0, end - self._t)) / width
        self.ring.append(Bucket(end, self._completed, self._latency, self._drops, self._errors, self._admitted,
                                self._peak, busy, self._shed))  # fmt: skip
        gap = min(index - self._index - 1, self.ring.maxlen or 0)
        for i in range(index - gap, index):
            self.ring.append(Bucket((i + 1) * width, inflight=self.inflight, busy=float(self.inflight)))
        self._index = index
        self._area, self._t = 0.0, index * width
        self._completed = self._drops = self._errors = self._admitted = self._shed = 0
        self._latency = 0.0
        self._peak = self.inflight

    def __repr__(self) -> str:
        return f"Probes(inflight={self.inflight}, completed={self.total}, buckets={len(self.ring)})"
