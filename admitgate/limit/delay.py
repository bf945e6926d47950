"""The ``delay`` estimator (the default): the admission rate that holds the queueing delay at a target.

It reads one overload signal, the *queueing delay*, and acts only once a queue stands:

1. The queueing delay is the larger of the event loop's lag (a CPU-bound app: the loop is its queue) and an
   upstream's queue, which two readings must both show: the latency beyond the baseline (a latency late) and
   the work in flight beyond what the delivered rate keeps busy for a baseline latency (Little; noisy). Requests in
   flight with none answered for twice the slowest recent latency read as an endless delay (a stall). The
   baseline is the lowest window mean over ``baseline_window`` seconds, learnt only while the delay is low.
2. A queue *stands* once the delay has stayed above ``target`` for ``interval`` seconds, or for two baseline
   latencies if longer (CoDel's test: a burst drains within the interval, a standing queue does not; and a slow
   service's rate shows only once its answers come back). Until one stands the gate is open: it does not limit,
   and it knows no capacity.
3. From then on μ, the capacity, follows what the service delivers (averaged over ``interval``) while a queue
   stands, and rises with what it delivers otherwise.
4. The rate is μ scaled by the delay: cut by ``gain`` per second of delay beyond the target (by half at most),
   raised by as much below it while the gate limits, and twice μ once the gate has limited for a whole interval
   with no queue (BBR's start-up gain: a service with room shows it within a span). Held at the target, it is what
   the service sustains, the cost of turning the rest away included.
5. A service that serves nothing (a stall, or only errors under a standing queue) is sent nothing new, and μ
   stands: what it did before is the best guess for when it serves again.
6. The gate opens again once it has not limited for ``release`` seconds and no queue stands.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..core.errors import positive
from .estimator import Baseline
from .window import Window


@dataclass(frozen=True, slots=True)
class DelayTuning:
    """The ``delay`` estimator's constants (its knobs are the constructor's arguments).

    ``open_rate``: the rate while the gate is open, requests/s (as good as none: LiveCapacity's ceiling bounds it).
    ``gain``: the share of μ the rate moves by per second of delay off the target. ``max_cut``: the largest cut, a
    share of μ (the delay of a burst is no reason to stop). ``max_gain``: the rate after a whole interval of unmet
    demand and no queue, a multiple of μ. ``least``: the rate sent to a service that serves nothing, requests/s.
    """

    open_rate: float = 1e9
    gain: float = 2.0
    max_cut: float = 0.5
    max_gain: float = 2.0
    least: float = 1e-3
    round_trips: float = 2.0


#: The tuning as chosen.
DELAY = DelayTuning()


class QueueDelay:
    """The admission rate from the queueing delay (see the module docstring).

    ``target``: seconds of queueing delay the rate holds; ``interval``: seconds a queue must stand before the gate
    limits (and the span μ averages over); ``release``: seconds without limiting before the gate opens again;
    ``baseline_window``: seconds the baseline latency spans.
    """

    name = "delay"
    measured = True
    #: its rate while open is no capacity: until a queue has stood, none is known
    opens = True
    #: the middleware measures the event loop's lag for it
    reads_lag = True

    def __init__(self, target: float = 0.05, interval: float = 0.5, release: float = 2.0,
                 baseline_window: float = 30.0, tuning: DelayTuning = DELAY) -> None:  # fmt: skip
        self.target = positive("capacity.delay.target", target)
        self.interval = positive("capacity.delay.interval", interval)
        self.release = positive("capacity.delay.release", release)
        self._baseline = Baseline(positive("capacity.delay.baseline_window", baseline_window))
        self.tuning = tuning
        self.mu: float | None = None
        self.state = "open"
        #: nothing is served (see rule 5): an outage, as the gate's reading reports it
        self.collapsed = False
        #: (time, queueing delay, whether the gate limited) of the windows over the last interval
        self._windows: deque[tuple[float, float, bool]] = deque()
        self._limited_at = -math.inf  # the last window in which the gate limited

    @property
    def baseline(self) -> float | None:
        return self._baseline.value

    @property
    def growth(self) -> float:
        """How fast the retry schedule's forecast expects μ to rise, per second: as the rate probes above it with no
        queue (``gain`` × ``target``). Optimistic on purpose: a client told too early costs a cheap 429, one told too
        late leaves capacity unused."""
        return self.tuning.gain * self.target

    def estimate(self, w: Window) -> float:
        t = self.tuning
        base = self._baseline.value
        if base is None:
            self._baseline.observe(w.latency, w.dt)
            base = w.latency
        delay = self._delay(w, base)
        interval = max(self.interval, t.round_trips * base)
        windows = self._windows
        windows.append((w.now, delay, w.limiting))
        while len(windows) > 1 and windows[1][0] <= w.now - interval:  # (the oldest spans the interval's start)
            windows.popleft()
        spanned = w.now - windows[0][0] >= interval - 1e-9
        if w.limiting:
            self._limited_at = w.now
        if delay <= self.target:
            self._baseline.observe(w.latency, w.dt)
        good = max(0.0, _delivered(w))
        if self.state == "open":
            if not (spanned and min(d for _, d, _ in windows) > self.target):
                return t.open_rate
            self.state = "limiting"
            self.mu = max(good, self.mu or 0.0)
        elif w.now - self._limited_at >= self.release and delay <= self.target:
            self.state = "open"
            return t.open_rate
        self.collapsed = w.stalled or (delay > self.target and good <= 0)
        if self.collapsed:
            return t.least
        mu = self.mu if self.mu is not None else good
        if delay > self.target or good > mu:
            mu += (good - mu) * min(1.0, w.dt / interval)
        self.mu = mu = max(mu, t.least)
        return max(mu * self._scale(w, delay, spanned), t.least)

    def _delay(self, w: Window, base: float) -> float:
        """The queueing delay this window reads, seconds (rule 1)."""
        if w.stalled:
            return math.inf
        good = _delivered(w)
        waiting = w.busy - max(good, 0.0) * base  # in flight beyond what the delivered rate keeps busy
        queued = 0.0 if waiting <= 0 else waiting / good if good > 0 else math.inf
        return max(w.lag, min(w.recent_latency - base, queued))

    def _scale(self, w: Window, delay: float, spanned: bool) -> float:
        """The rate's multiple of μ at this delay (rule 4)."""
        t = self.tuning
        if delay > self.target:
            return max(1 - t.gain * (delay - self.target), 1 - t.max_cut)
        if not w.limiting:  # demand below μ: nothing to learn, and a burst must not find a rate above it
            return 1.0
        if spanned and all(limited and d < self.target / 2 for _, d, limited in self._windows):
            return t.max_gain  # demand beyond the rate and no queue for a whole interval: room to find
        return 1 + t.gain * (self.target - delay)


def _delivered(w: Window) -> float:
    """Requests/s served, the drops (5xx: answered, not served) taken out."""
    return (w.delivered if w.delivered is not None else w.completion_rate) - (w.drop_rate or 0.0)
