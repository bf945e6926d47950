"""A live capacity: the rate learnt from the gate's own probes by a capacity estimator.

:class:`LiveCapacity` is a :class:`~admitgate.core.source.RateSource`: at each of the gate's refreshes it summarises
the :class:`~admitgate.core.probes.Probes` the middleware records into a :class:`~admitgate.limit.window.Window`,
asks its estimator (:mod:`admitgate.limit.estimators`) for the rate, optionally caps or replaces it by external
capacity probes (a pool's free connections, a dependency's own headroom) and reduces it by an external background
rate, then clamps it to [floor, ceiling] and to ``max_step`` per update.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable

from ..core.errors import ConfigError, integer, non_negative, number, positive
from ..core.probes import Probes
from ..core.settings import MAX_RATE, MIN_RATE
from ..core.source import CapacityState, RateReading
from .bdp import CURRENT_SPAN, DELIVERY_SPAN, HEALTHY, RECENT_SPAN
from .estimator import Estimator
from .window import Window

log = logging.getLogger("admitgate")

#: How fast H may rise per second in the retry schedule's forecast when the estimator names no pace.
DEFAULT_GROWTH = 0.25
#: The rate before any evidence, requests/s, for an estimator that does not open the gate.
FIRST_GUESS = 100.0
#: The largest relative change of the rate per update, for an estimator that does not open the gate.
MAX_STEP = 0.25
#: Where the in-flight limit starts, requests, for an estimator that does not open the gate.
INFLIGHT_FLOOR = 4.0
#: Where the in-flight limit starts, requests, for one that does: a gate that does not limit must not hold a
#: worker pool or a benchmark's few dozen connections at start-up (Netflix's limiters start at 20; services raised
#: that to 100 after shedding at every deploy, cashapp/misk#2250).
OPEN_INFLIGHT = 100.0
#: An external probe: called with the gate's time (seconds), returns requests/s or None (no opinion).
ExternalProbe = Callable[[float], "float | None"]


class LiveCapacity:
    """H(t) from live probes.

    ``estimator``: an :class:`~admitgate.limit.estimator.Estimator`. ``initial``: the rate before any
    evidence (requests/s; cold start is permissive: the rate also follows twice the admitted rate
    until ``min_samples`` completions have been seen). ``floor``/``ceiling``: bounds of the rate.
    ``max_step``: largest relative change per update (0.25: × or ÷ 1.25), except where the estimator's μ
    is under a quarter of the rate (a collapse) or over four times it (a capacity back after one), or the
    estimator says it is ``pausing`` (a pause, or its end).
    ``window``: seconds of probes an update reads, widened up to the whole probe ring until it holds
    ``min_samples`` completions; with fewer the rate holds (low traffic: no decision on a handful of samples).
    ``capacity_probes``: callables ``now -> requests/s | None`` that cap μ (``probe_mode="cap"``) or
    replace it (``"replace"``). ``background``: a rate or a callable for traffic the gate does not
    see that uses the same capacity; it is subtracted from μ unless μ is measured from this gate's
    own traffic (which already excludes it). ``growth``: how fast the rate may rise, per second, in the
    forecast that times the retry schedule (default: the estimator's probing pace, ``probe_gain``, or
    0.25 where μ may move without one; 0 for a static estimator without capacity probes).
    ``inflight_floor``: where the in-flight limit starts and the least it is held to, requests (see
    :mod:`admitgate.core.probes`): the gate admits no more than the service has been seen to hold, so a
    service that stops answering is sent a few requests more, not a rate's worth each latency until an
    estimator can tell. 0: no in-flight limit.

    An estimator that *opens* the gate (``opens``: it does not limit, and knows no capacity, until a queue has
    stood; the default, :class:`~admitgate.limit.delay.QueueDelay`) changes three defaults: ``initial`` is the
    ceiling, ``max_step`` is none (its rate moves on evidence, not noise), and ``inflight_floor`` is
    :data:`OPEN_INFLIGHT`. Its reading reports μ as the capacity once it has one, and until then that none is known.
    """

    def __init__(
        self,
        estimator: Estimator,
        *,
        initial: float | None = None,
        floor: float = 1.0,
        ceiling: float = 100_000.0,
        max_step: float | None = None,
        window: float = 1.0,
        min_samples: int = 20,
        capacity_probes: Iterable[ExternalProbe] = (),
        probe_mode: str = "cap",
        background: float | ExternalProbe = 0.0,
        probes: Probes | None = None,
        growth: float | None = None,
        inflight_floor: float | None = None,
        now: float = 0.0,
    ) -> None:
        if not isinstance(estimator, Estimator):
            raise ConfigError("capacity.estimator", "expected an Estimator", estimator)
        self.estimator = estimator
        opens = self.opens = bool(getattr(estimator, "opens", False))
        if initial is None:
            initial = ceiling if opens else FIRST_GUESS
        if max_step is None:
            max_step = math.inf if opens else MAX_STEP
        if inflight_floor is None:
            inflight_floor = OPEN_INFLIGHT if opens else INFLIGHT_FLOOR
        self.floor = number("capacity.floor", floor, MIN_RATE, MAX_RATE, unit="requests/s")
        self.ceiling = number("capacity.ceiling", ceiling, MIN_RATE, MAX_RATE, unit="requests/s")
        if self.ceiling < self.floor:
            raise ConfigError("capacity.ceiling", f"must be >= floor ({self.floor:g})", ceiling)
        self.initial = min(max(positive("capacity.initial", initial), self.floor), self.ceiling)
        self.max_step = max_step if max_step == math.inf else positive("capacity.max_step", max_step)
        self.window = positive("capacity.window", window)
        integer("capacity.min_samples", min_samples, 1)
        self.min_samples = min_samples
        if probe_mode not in ("cap", "replace"):
            raise ConfigError("capacity.probe_mode", "must be 'cap' or 'replace'", probe_mode)
        self.probe_mode = probe_mode
        self.capacity_probes = _probes(capacity_probes)
        if not callable(background):
            non_negative("capacity.background", background)
        self.background = background
        moves = estimator.measured or bool(self.capacity_probes)
        self._growth = DEFAULT_GROWTH if moves else 0.0
        if growth is not None:
            self._growth = non_negative("capacity.growth", growth)
        self._own_growth = growth is None and hasattr(estimator, "growth")
        self.probes = probes or Probes(now=now)
        self.probes.bound(inflight_floor)
        self._rate = self.initial
        self._warm = False
        self._last = now
        self._seen = len(self.probes.ring)
        self._window: Window | None = None
        self._state = "warming"
        self._background = 0.0
        self._capacity = self._rate
        self._failed: set[int] = set()

    def read(self, now: float) -> RateReading:
        """The gate's reading at ``now``: :meth:`rate`, and the capacity and growth beside it (for an estimator that
        opens the gate: whether a capacity is known, its outage verdict, and the service's baseline latency)."""
        rate = self.rate(now)
        if not self.opens:
            return RateReading(rate, self.capacity, self.growth)
        e = self.estimator
        return RateReading(rate, self.capacity, self.growth, getattr(e, "collapsed", None), known=e.mu is not None,
                           latency=e.baseline)  # fmt: skip

    def rate(self, now: float) -> float:
        """The rate for the pacer (requests/s); updates at most once per probe bucket."""
        probes = self.probes
        probes.roll(now)
        ring = probes.ring
        closed = ring[-1].end if ring else None
        if closed is None or closed <= self._last:
            return self._rate
        dt, self._last = min(closed - self._last, 1.0), closed  # a long idle gap counts as one second
        window = self._summarise(now, dt)
        self._window = window
        estimator = self.estimator
        if not estimator.measured:  # a configured capacity needs no evidence
            self._state = estimator.state
            target = estimator.estimate(window) if window is not None else (estimator.mu or self._rate)
        elif window is None:
            target = self._rate
            if not self._warm:  # cold start: stay permissive, follow the demand
                self._state = "warming"
                target = max(target, 2 * sum(b.admitted for b in ring) / (len(ring) * probes.width))
            elif any(b.shed for b in ring):  # requests wait, but too few get in to judge by: probe upwards
                self._state = "starved"
                target = self._rate * (1 + self.growth) ** dt
            else:
                self._state = "low-traffic"
        else:
            self._warm = True
            target = estimator.estimate(window)
            self._state = estimator.state
        adjust = self._external(now)
        belief = estimator.mu if estimator.measured and estimator.mu is not None else target
        self._capacity = min(max(adjust(belief), self.floor), self.ceiling)
        return self._push(adjust(target))

    def _summarise(self, now: float, dt: float) -> Window | None:
        ring = self.probes.ring
        completed = shed = 0
        latency = 0.0
        span = 0.0
        width = self.probes.width
        for bucket in reversed(ring):
            completed += bucket.completed
            latency += bucket.latency
            shed += bucket.shed
            span += width
            if span >= self.window - 1e-9 and completed >= self.min_samples:
                break
        if completed < self.min_samples:
            return None
        # The spans below are seconds, whatever the bucket width: as many of the newest buckets as cover them.
        spans = {s: max(1, round(s / width)) for s in (DELIVERY_SPAN, CURRENT_SPAN, RECENT_SPAN)}
        newest = list(itertools.islice(reversed(ring), max(spans.values())))  # newest first
        delivery, current = newest[: spans[DELIVERY_SPAN]], newest[: spans[CURRENT_SPAN]]
        busy = sum(b.busy for b in current) / len(current)
        admit_rate = sum(b.admitted for b in current) / (len(current) * width)
        n = lat = 0.0
        for bucket in newest[: spans[RECENT_SPAN]]:
            n += bucket.completed
            lat += bucket.latency
            if n >= 10:
                break
        recent = lat / n if n else latency / completed
        seconds = len(delivery) * width  # (the span, in whole buckets; less while the ring is short)
        delivered = sum(b.completed for b in delivery) / seconds
        # Drops are a signal of now: a window widened over a few slow seconds must not keep an old outage's.
        drops = sum(b.drops for b in delivery)
        return Window(now, dt, completed, completed / span, latency / completed, drops, self.probes.inflight, busy,
                      recent, admit_rate, shed > 0, self._rate, delivered,
                      sum(b.completed for b in current) / (len(current) * width), drops / seconds,
                      max(b.lag for b in current), self.probes.silent(now))  # fmt: skip

    def _external(self, now: float) -> Callable[[float], float]:
        """Ask the external probes once; return what they do to a capacity (cap or replace it, less background)."""
        caps = [c for c in (self._call(p, now) for p in self.capacity_probes) if c is not None]
        background = self.background
        self._background = (self._call(background, now) or 0.0) if callable(background) else background
        measured = self.estimator.measured and not (caps and self.probe_mode == "replace")
        less = 0.0 if measured else self._background  # a capacity measured from own traffic already excludes it
        cap = min(caps) if caps else math.inf

        def adjust(mu: float) -> float:
            if caps:
                mu = cap if self.probe_mode == "replace" else min(mu, cap)
            return mu - less

        return adjust

    def _call(self, probe: ExternalProbe, now: float) -> float | None:
        """Run a user probe; a failing or nonsensical one is ignored (logged once), never raised."""
        try:
            value = probe(now)
            if value is None:
                return None
            value = float(value)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"returned {value!r}")
            return value
        except Exception as exc:
            if id(probe) not in self._failed:
                self._failed.add(id(probe))
                log.warning("admitgate: external probe %r failed (%s); ignoring it", probe, exc)
            return None

    def _push(self, target: float) -> float:
        if not math.isfinite(target):
            target = self._rate
        old, step = self._rate, 1 + self.max_step  # a step is symmetric on a log scale: ×1.25 or ÷1.25
        mu = self.estimator.mu if self.estimator.measured else None
        if getattr(self.estimator, "pausing", False):  # a pause (nothing served for a moment), or its end: at once
            step = math.inf
        if mu is not None and mu < HEALTHY * old:  # a collapse (an outage) is not noise: no damping on the way down
            target = min(target, old * step)
        elif mu is not None and HEALTHY * mu > old:  # nor is a capacity back after one: none on the way up
            target = max(target, old / step)
        else:
            target = min(max(target, old / step), old * step)
        self._rate = min(max(target, self.floor), self.ceiling)
        return self._rate

    @property
    def capacity(self) -> float:
        """What the gate can admit for as long as a schedule runs, requests/s: the larger of the rate
        and the capacity the estimator believes in (within floor and ceiling).

        The rate dips below μ while the estimator drains a queue or re-measures its baseline, and a
        schedule timed by that dip would tell clients to come back too late. While it probes, the rate
        is above μ, and the schedule follows the probe. An estimator that opens the gate: μ, once it is known
        (its rate while open is no capacity); the rate until then.
        """
        if self.opens:
            mu = self.estimator.mu
            return self._rate if mu is None else min(max(mu, self.floor), self.ceiling)
        return max(self._capacity, self._rate)

    @property
    def reads_lag(self) -> bool:
        """Whether the estimator reads the event loop's lag (the shell then measures it: :mod:`admitgate.asgi.lag`)."""
        return bool(getattr(self.estimator, "reads_lag", False))

    @property
    def growth(self) -> float:
        """How fast the rate may rise, per second: the estimator's pace now, unless one was configured."""
        return self.estimator.growth if self._own_growth else self._growth  # type: ignore[attr-defined]

    def state(self) -> CapacityState:
        w, e = self._window, self.estimator
        return CapacityState(e.name, self._state, e.mu, self._rate, self._background, e.baseline,
                             w.latency if w else None, w.completion_rate if w else 0.0,
                             self.probes.inflight)  # fmt: skip

    def __repr__(self) -> str:
        return f"LiveCapacity({self.estimator.name}, rate={self._rate:.4g}/s, {self._state})"


def _probes(probes: Iterable[ExternalProbe]) -> list[ExternalProbe]:
    """``capacity_probes`` checked: a list of callables."""
    if isinstance(probes, (str, bytes)) or not isinstance(probes, Iterable):
        raise ConfigError("capacity.capacity_probes", "must be a list of functions now -> rate", probes)
    checked = list(probes)
    for probe in checked:
        if not callable(probe):
            raise ConfigError("capacity.capacity_probes", "each must be callable", probe)
    return checked
