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

from ..core.errors import integer, positive

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
    inflight: int = 0  # in flight when the bucket closed
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
        "_admitted",
        "_area",
        "_completed",
        "_drops",
        "_errors",
        "_index",
        "_latency",
        "_next",
        "_shed",
        "_t",
        "_total",
        "_total_drops",
        "_total_errors",
        "_total_latency",
        "histogram",
        "inflight",
        "ring",
        "width",
    )  # fmt: skip

    def __init__(self, width: float = 0.1, buckets: int = 50, now: float = 0.0) -> None:
        self.width = positive("probe_bucket", width)
        integer("probe_buckets", buckets, 2)
        self._index = int(now / self.width)
        self._next = (self._index + 1) * self.width  # when the current bucket ends
        self.ring: deque[Bucket] = deque(maxlen=buckets)
        self.inflight = 0
        self._completed = self._drops = self._errors = self._admitted = self._shed = 0
        self._latency = 0.0
        self._area, self._t = 0.0, now  # in-flight × seconds so far in the bucket, and when it was last moved
        # lifetime totals of closed buckets (the properties below add the open one)
        self._total = self._total_drops = self._total_errors = 0
        self._total_latency = 0.0
        self.histogram = [0] * (len(LATENCY_BOUNDS) + 1)  # per bound, then +Inf; not cumulative

    # -- the request path (O(1), a handful of attribute updates) ------------------------------
    def admit(self, now: float) -> None:
        """A request goes on to the app at ``now``."""
        if now >= self._next:
            self.roll(now)
        inflight = self.inflight
        self._area += inflight * (now - self._t)
        self._t = now
        self.inflight = inflight + 1
        self._admitted += 1

    def complete(self, latency: float, status: int, now: float) -> None:
        """Its response finished at ``now`` after ``latency`` seconds with ``status``."""
        if now >= self._next:
            self.roll(now)
        inflight = self.inflight
        self._area += inflight * (now - self._t)
        self._t = now
        self.inflight = inflight - 1
        self._completed += 1
        self._latency += latency
        self.histogram[bisect_left(LATENCY_BOUNDS, latency)] += 1
        if status >= 500:
            self._drops += 1

    def fail(self, now: float) -> None:
        """The app raised before finishing the response."""
        self.cancel(now)
        self._errors += 1

    def cancel(self, now: float) -> None:
        """The request was abandoned at ``now``: it frees its place and gives no sample."""
        if now >= self._next:
            self.roll(now)
        inflight = self.inflight
        self._area += inflight * (now - self._t)
        self._t = now
        self.inflight = inflight - 1

    def limited(self) -> None:
        """The gate paced or rejected a request: demand exceeds the rate (the gate counts which, and how long)."""
        self._shed += 1

    # -- readers -----------------------------------------------------------------------------
    @property
    def total(self) -> int:
        """Responses completed so far (lifetime)."""
        return self._total + self._completed

    @property
    def total_drops(self) -> int:
        return self._total_drops + self._drops

    @property
    def total_errors(self) -> int:
        return self._total_errors + self._errors

    @property
    def total_latency(self) -> float:
        return self._total_latency + self._latency

    def roll(self, now: float) -> None:
        """Close every bucket that ended by ``now`` (empty ones included, at most a ring's worth)."""
        if now < self._next:
            return
        width = self.width
        index = int(now / width)
        if index <= self._index:  # float rounding at a bucket edge
            index = self._index + 1
        end = self._next
        busy = (self._area + self.inflight * max(0.0, end - self._t)) / width
        self.ring.append(Bucket(end, self._completed, self._latency, self._drops, self._errors, self._admitted,
                                self.inflight, busy, self._shed))  # fmt: skip
        self._total += self._completed
        self._total_latency += self._latency
        self._total_drops += self._drops
        self._total_errors += self._errors
        gap = min(index - self._index - 1, self.ring.maxlen or 0)
        for i in range(index - gap, index):
            self.ring.append(Bucket((i + 1) * width, inflight=self.inflight, busy=float(self.inflight)))
        self._index = index
        self._next = (index + 1) * width
        self._area, self._t = 0.0, index * width
        self._completed = self._drops = self._errors = self._admitted = self._shed = 0
        self._latency = 0.0

    def __repr__(self) -> str:
        return f"Probes(inflight={self.inflight}, completed={self.total}, buckets={len(self.ring)})"
