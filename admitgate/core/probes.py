"""Probes: what the requests the gate lets through tell about the service behind it.

:class:`Probes` aggregates, in O(1) per request and in bounded memory, the four signals the
capacity estimators read: in-flight concurrency at admission, latency from admission to the end of
the response body (streaming bodies included), the outcome (success; an app error; a 5xx, the drop
signal) and pacing delay; beside them, how late the event loop ran a timer (:meth:`Probes.lag`, reported by the
middleware's lag monitor: for a CPU-bound app the loop is the queue, before any request reaches the gate).
Requests the client abandoned, or that were cancelled, release their in-flight place but give no latency sample:
how long an abandoned request ran says nothing about the service.

The probes also keep the *in-flight limit* when a live capacity asks for one (:meth:`Probes.bound`): how
many requests the service has been seen to hold, which the gate does not admit beyond. It starts at its
floor, grows by one for each response served (doubling each latency while they are served: TCP's slow
start) and halves for each 5xx (once per latency while answers are served between them: a 5xx whose request
went in before the last halving is of the same event, as TCP halves once per window); as each bucket closes
it is held within ``GAIN`` times the mean in flight over the buckets of the last ``LIMIT_SPAN`` seconds that
served something, and never below the floor. If none served, it is put back at the floor when nothing is in
flight (an idle spell) or once the service has been silent for ``GAIN`` times the latency of its slowest
answer (stalled); until then it stands (a slow service, whose answers are further apart than
``LIMIT_SPAN``). A service that stops serving (an outage beginning) so receives at most the limit in force,
not a rate's worth per latency until an estimator can tell; a herd landing on an idle service goes in at the
pace its answers come back, within a few latencies of the full rate.

Samples go into the current time bucket (``width`` seconds, 0.1 by default); a finished bucket is
pushed onto a ring of the last ``buckets`` (50: five seconds). Nothing else happens per request, so
the estimators' arithmetic runs on the gate's refresh cadence, never on the admit path. Lifetime
totals (count, latency sum) are kept beside the ring for metrics, and a fixed-bound latency histogram once metrics
ask for one (:meth:`Probes.keep_histogram`: no reader, no cost per request).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import islice

from ..core.errors import ConfigError, integer, positive

#: Latency histogram bounds, seconds (prometheus-client's defaults, extended to 30 s).
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0)
#: The in-flight limit is held within this many times the mean in flight while the service served.
GAIN = 2.0
#: Seconds of closed buckets that ceiling looks back over.
LIMIT_SPAN = 1.0


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
    lag: float = 0.0  # the longest event-loop lag seen in the bucket, seconds (see Probes.lag)


class Probes:
    """Bucketed probe aggregates. Times are seconds on the gate's clock.

    The middleware calls :meth:`admit` when a request goes on to the app, then exactly one of
    :meth:`complete` (response finished), :meth:`fail` (the app raised) or :meth:`cancel` (the
    client went away, or the task was cancelled). The gate calls :meth:`limited` for each request
    it paced or rejected. Readers call :meth:`roll` with the current time, then read :attr:`ring`.

    A request whose response has begun is *answered* (the middleware adds it to :attr:`answered` as the
    response starts, and says so as it ends): its body may stream on for minutes (an event stream, a
    download), and it is in flight until it ends, but the in-flight limit leaves it out (:attr:`unanswered`).
    """

    __slots__ = (
        "_admitted",
        "_answers_due",
        "_area",
        "_completed",
        "_drops",
        "_errors",
        "_halved",
        "_index",
        "_lag",
        "_latency",
        "_next",
        "_served",
        "_shed",
        "_span",
        "_t",
        "_total",
        "_total_drops",
        "_total_errors",
        "_total_latency",
        "answered",
        "floor",
        "histogram",
        "inflight",
        "lag_due",
        "limit",
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
        self.answered = 0  #: requests in flight whose response has begun (see the class docstring)
        self._completed = self._drops = self._errors = self._admitted = self._shed = 0
        self._latency = self._lag = 0.0  # (the lag: the longest the event loop was late in the bucket, seconds)
        #: when the event-loop lag monitor's next run is due (seconds; inf without one): a bucket that closes past it
        #: with no report has a lag of at least the time since
        self.lag_due = math.inf
        self._area, self._t = 0.0, now  # in-flight × seconds so far in the bucket, and when it was last moved
        # lifetime totals of closed buckets (the properties below add the open one)
        self._total = self._total_drops = self._total_errors = 0
        self._total_latency = 0.0
        #: latencies per bound, then +Inf; not cumulative (None until :meth:`keep_histogram`)
        self.histogram: list[int] | None = None
        self.floor: float | None = None  #: the in-flight limit's floor, requests (None: no limit, see bound)
        self.limit = math.inf  #: requests the gate may have in flight now (see :meth:`bound`)
        self._span = max(1, round(LIMIT_SPAN / self.width))  # buckets the limit's ceiling looks back over
        #: until when a service with requests in flight may stay silent before the ceiling takes it for idle or
        #: stalled: twice the latency of its slowest answer, from that answer (seconds)
        self._answers_due = now
        self._halved, self._served = -math.inf, -1  # the limit's last halving: when, and responses served by then

    def bound(self, floor: float) -> None:
        """Keep an in-flight limit that starts at ``floor`` requests and is never held below it (at least 1), or,
        with ``floor`` 0, none."""
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (floor == 0 or 1 <= floor < math.inf):
            raise ConfigError("capacity.inflight_floor", "must be 0 (no in-flight limit) or a number of requests >= 1",
                              floor)  # fmt: skip
        self.floor = float(floor) if floor else None
        self.limit = self.floor or math.inf

    def keep_histogram(self) -> list[int]:
        """The latency histogram (see :attr:`histogram`), kept from now on for metrics to read."""
        if self.histogram is None:
            self.histogram = [0] * (len(LATENCY_BOUNDS) + 1)
        return self.histogram

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

    def complete(self, latency: float, status: int, now: float, answered: bool = False) -> None:
        """Its response finished at ``now`` after ``latency`` seconds with ``status``. ``answered``: it was counted
        answered as its response began."""
        if now >= self._next:
            self.roll(now)
        if answered:
            self.answered -= 1
        inflight = self.inflight
        self._area += inflight * (now - self._t)
        self._t = now
        self.inflight = inflight - 1
        self._completed += 1
        self._latency += latency
        histogram = self.histogram
        if histogram is not None:
            histogram[bisect_left(LATENCY_BOUNDS, latency)] += 1
        if status >= 500:
            self._drops += 1
            if self.floor is not None:
                # Once per event: again only for a request that went in after the last halving, or with nothing
                # served since (a service answering only errors goes down to one request a 5xx at a time).
                served = self._total + self._completed - self._total_drops - self._drops
                if now - latency >= self._halved or served == self._served:
                    limit = self.limit / 2
                    self.limit = limit if limit > 1.0 else 1.0
                    self._halved, self._served = now, served
        else:
            self.limit += 1.0  # (inf without a limit)
            due = now + GAIN * latency
            if due > self._answers_due:
                self._answers_due = due

    def fail(self, now: float, answered: bool = False) -> None:
        """The app raised before finishing the response (``answered``: after it began)."""
        self.cancel(now, answered)
        self._errors += 1

    def cancel(self, now: float, answered: bool = False) -> None:
        """The request was abandoned at ``now`` (``answered``: after its response began): it frees its place and
        gives no sample."""
        if now >= self._next:
            self.roll(now)
        if answered:
            self.answered -= 1
        inflight = self.inflight
        self._area += inflight * (now - self._t)
        self._t = now
        self.inflight = inflight - 1

    def lag(self, seconds: float, now: float) -> None:
        """The event loop ran a timer ``seconds`` late at ``now``: ready work waited that long for the loop."""
        if now >= self._next:
            self.roll(now)
        if seconds > self._lag:
            self._lag = seconds

    def silent(self, now: float) -> bool:
        """Requests are in flight and none has been answered for twice the latency of the slowest recent answer:
        the service has stalled (or stopped: an outage beginning)."""
        return self.inflight > 0 and now >= self._answers_due

    def limited(self) -> None:
        """The gate paced or rejected a request: demand exceeds the rate (the gate counts which, and how long)."""
        self._shed += 1

    # -- readers -----------------------------------------------------------------------------
    @property
    def unanswered(self) -> int:
        """Requests in flight whose response has not begun: what the in-flight limit bounds."""
        return self.inflight - self.answered

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
        lag = self._lag if end <= self.lag_due else max(self._lag, end - self.lag_due)
        self.ring.append(Bucket(end, self._completed, self._latency, self._drops, self._errors, self._admitted,
                                self.inflight, busy, self._shed, lag))  # fmt: skip
        self._total += self._completed
        self._total_latency += self._latency
        self._total_drops += self._drops
        self._total_errors += self._errors
        gap = min(index - self._index - 1, self.ring.maxlen or 0)
        for i in range(index - gap, index):
            end = (i + 1) * width
            self.ring.append(Bucket(end, inflight=self.inflight, busy=float(self.inflight),
                                    lag=max(0.0, end - self.lag_due)))  # fmt: skip
        self._index = index
        self._next = (index + 1) * width
        self._area, self._t = 0.0, index * width
        self._completed = self._drops = self._errors = self._admitted = self._shed = 0
        self._latency = self._lag = 0.0
        floor = self.floor
        if floor is not None:  # the limit's ceiling: GAIN times the mean in flight while the service served
            held = [b.busy for b in islice(reversed(self.ring), self._span) if b.completed > b.drops]
            if held:
                self.limit = min(self.limit, max(floor, GAIN * sum(held) / len(held)))
            elif not self.inflight or now >= self._answers_due:  # idle, or silent for longer than it answers in
                self.limit = min(self.limit, floor)
            # (else a slow service, its answers further apart than LIMIT_SPAN: the limit stands until they are due)

    def __repr__(self) -> str:
        return f"Probes(inflight={self.inflight}, completed={self.total}, buckets={len(self.ring)})"
