"""The default estimator, ``"bdp"``: a rate-based BBR.

While latency sits near its baseline and the gate is shedding, the service could take more: the rate grows
(``probe_gain`` per second) after a jittered cruise. When more is in flight than the throughput explains (past
``tolerance``) or the service drops requests, a queue is forming; once it has stood long enough for what it
delivers to be measured, that *is* the capacity: μ is set to it and the rate dips below μ just long enough to
drain the queue (μ following what the standing queue delivers meanwhile). A queue that serves nothing at all
(502/503/504 are answered, not served) is an outage: the rate holds where it was cut until the service serves
again without drops, then resumes at half the capacity known before (start-up finds the rest). Before that
verdict, while a queue stands and nothing at all is served, the rate pauses at what is delivered (μ untouched: a
busy event loop can stall completions for a few tenths of a second) and the rate in force before comes back as
soon as something is served.

BDP tells a slower service from a queue while it drains. Once in flight stops falling, it cuts admissions by a
quarter. If Little's latency (in flight ÷ admissions, no completion lag) does not fall, the service is slower, and
that latency is the new baseline.
"""

from __future__ import annotations

import math
from collections import deque
from enum import Enum
from typing import NamedTuple

from ..core.errors import integer, non_negative, positive
from .estimator import Measured
from .window import Window

#: At saturation, a service delivering less than this share of the rate offered to it has collapsed.
HEALTHY = 0.25
#: Little's latency (in flight over admissions in 0.2 s) is trusted to reset a baseline only from this
#: many admissions per second (10 in its 0.2 s): below it, one request more or less moves it by half.
LITTLE_MIN_RATE = 50.0
#: Seconds the delivered rate (``Window.delivered``) spans. What a queue delivers is a capacity sample only
#: over a span it stood through, after the first completions had time to come (one baseline latency, at most
#: this span): before that the span holds time the service was idle, and a herd's first 0.2 s "delivers" a
#: few requests/s. The 0.5 s rate once the queue has stood this long; the 0.2 s one from CURRENT_SPAN.
DELIVERY_SPAN = 0.5
#: Seconds the current rate (``Window.current``) spans, and the least a queue must stand to be confirmed.
CURRENT_SPAN = 0.2
#: Seconds the recent latency (``Window.recent_latency``) looks back over at most.
RECENT_SPAN = 0.3
#: Seconds a queue must stand (beyond the first completions' allowance) with nothing at all served before the
#: rate pauses: longer than a real server's event loop, busy with a herd's connections, stalls completions.
PAUSE_AFTER = 0.3
#: Seconds over which the capacity known before an outage fades as the reference start-up must find again.
COLLAPSE_MEMORY = 30.0
#: Seconds of capacity samples a drain keeps the highest of.
MAX_FILTER = 1.0
#: After an outage, the share of the capacity known before it (faded) that the rate resumes at once the
#: service serves again at its baseline latency; start-up finds the rest, a queue finds less.
RESUME = 0.5
#: Until the service is first seen saturated, the rate is at least this many times what it delivers (BBR's start-up
#: paces at 2/ln 2 of its bandwidth estimate): delivery doubling each latency, not the rate doubling each second.
STARTUP_PACE = 2.0
#: A window whose completions took at most this many times the anchor (the baseline a re-measurement measured, or
#: lower since) has seen the baseline, and the next re-measurement is due ``reprobe`` s after it: after BBR, whose
#: PROBE_RTT is due only when no sample has refreshed its min-RTT filter for 10 s. A tenth over, not at: window
#: means sit a few per cent above their lowest. A queue of a tenth of what is in flight reads above it.
BASELINE_SEEN = 1.1


class Phase(str, Enum):
    """What :class:`BandwidthDelay` is doing (its ``state``, as metrics and logs show it)."""

    STARTING = "starting"  # growing at start-up speed: the capacity has not been found yet
    PROBING = "probing"  # growing at the probing pace: is there more capacity?
    CRUISING = "cruising"  # holding at μ for a moment after a drain
    DRAINING = "draining"  # admitting below μ until the queue a probe built is gone
    REMEASURING = "re-measuring"  # admitting at 3/4 of μ to measure the baseline without a queue
    APP_LIMITED = "app-limited"  # demand is below the rate: nothing to learn
    OUTAGE = "outage"  # the service has collapsed: holding until it serves again
    PAUSED = "paused"  # a queue stands and nothing is served: admitting what is, until it is or a verdict


class _Signals(NamedTuple):
    mu: float  # the capacity believed so far (the rate in force before any), requests/s
    base: float  # baseline latency, seconds
    delivered: float  # completions per second over the newest 0.5 s
    queued: float  # requests in flight beyond what the throughput explains
    queueing: bool  # a queue, confirmed
    over: bool  # more in flight than the throughput explains, in this window
    sample: float  # what a queue that stood long enough delivered: a capacity (0 also when nothing was delivered)
    stood: float  # seconds the queue has stood beyond the first completions' allowance (< 0: no queue)
    offered: float  # the rate offered to the service: the rate in force, or the one a pause holds back


class BandwidthDelay(Measured):
    """Rate-based BBR: probe up while latency is at baseline; on saturation, μ = the delivered rate.

    ``tolerance``: more in flight than ``(1 + tolerance) · delivered rate · baseline latency`` (+1) means a
    queue, once seen in ``confirm`` consecutive windows (0.5 and 2: the baseline is the lowest window mean,
    a few per cent under the typical one, and in-flight counts are Poisson-noisy; lower values shed on noise);
    ``probe_gain``: growth of the rate per second while probing (0.25: 2× in about 3 s);
    ``startup_gain``: growth per second until the service has first been seen saturated (1.0: 2× a
    second: a capacity far above the first guess is found in seconds, not tens); in that start-up the rate is
    also at least twice what is delivered (``STARTUP_PACE``, BBR's start-up), so a herd landing on an idle
    service fills it within a few latencies, the in-flight limit bounding what goes in;
    ``cruise``: seconds held at μ after a drain before probing again, jittered ±50%;
    ``drain_time``: seconds to empty the estimated queue (the drain rate is floored at half of μ);
    ``baseline_window``: seconds of unsaturated time the baseline minimum spans;
    ``reprobe``: seconds (±15 %) between re-measurements of the baseline at 3/4 of μ, for a few
    latencies (about 1 % of the throughput at the defaults; a queue the estimate grew used as its
    own baseline would otherwise never drain); once one has measured the baseline, the next is not
    due while windows read it (``BASELINE_SEEN``), after BBR's min-RTT filter.
    """

    name = "bdp"

    def __init__(
        self,
        tolerance: float = 0.5,
        confirm: int = 2,
        probe_gain: float = 0.25,
        startup_gain: float = 1.0,
        cruise: float = 2.0,
        drain_time: float = 1.0,
        baseline_window: float = 30.0,
        reprobe: float = 10.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(baseline_window, reprobe, seed)
        self.tolerance = positive("capacity.bdp.tolerance", tolerance)
        integer("capacity.bdp.confirm", confirm, 1)
        self.confirm = confirm
        self.probe_gain = positive("capacity.bdp.probe_gain", probe_gain)
        self.startup_gain = positive("capacity.bdp.startup_gain", startup_gain)
        self._started = False  # the service has been seen saturated (start-up is over)
        self._before, self._before_at = 0.0, 0.0  # μ before the last collapse (an outage), and when it was seen
        self._down = False  # collapsed, and not served anything since
        self._held: float | None = None  # the rate in force when the current pause began
        #: True while a pause holds the rate and in the update that ends it: not noise, to be applied at once
        self.pausing = False
        self.cruise = non_negative("capacity.bdp.cruise", cruise)
        self.drain_time = positive("capacity.bdp.drain_time", drain_time)
        self._until = 0.0  # cruise ends
        self._drain_at = self._drain_busy = self._drain_target = 0.0
        self._plateau: float | None = None  # Little's latency at the first plateau of this drain
        self._plateau_rate = 0.0  # and the delivered rate there
        self._over = 0  # consecutive windows over tolerance
        self._over_since = 0.0  # when the current run of windows over tolerance began
        self._stalled_at = -math.inf  # the last window of that run in which nothing at all was delivered
        self._samples: deque[tuple[float, float]] = deque()  # (time, delivered) while a queue stands in a drain
        self._reprobe_at: float | None = None  # next baseline re-measurement
        self._quiet_until = 0.0  # end of the current re-measurement
        self._quiet_busy = 0.0  # fewest in flight seen during it
        self._quiet = 0.0  # the rate admitted during it
        #: the baseline the last re-measurement measured, or lower since (it never rises between them: a drain's
        #: verdict that the service got slower, maybe a queue in balance, is checked by the next one); inf until
        #: one has (a first baseline, or one a re-measurement could not reset, may hold a queue)
        self._anchor = math.inf

    @property
    def state(self) -> str:
        return self.phase.value

    @state.setter
    def state(self, value: str) -> None:
        self.phase = Phase(value)

    def estimate(self, w: Window) -> float:
        s = self._signals(w)
        if self._reprobe_at is None:
            self._reprobe_at = self._reprobe_after(w.now)
        if self._down:
            return self._outage(w, s)
        if self.phase is Phase.REMEASURING:
            return self._remeasuring(w, s)
        if w.limiting and w.now >= self._reprobe_at and self.phase not in (Phase.DRAINING, Phase.PAUSED):
            return self._remeasure(w, s)
        if self.phase is Phase.DRAINING:
            return self._draining(w, s)
        held, self._held = self._held, None
        self.pausing = held is not None
        if s.queueing:
            return self._saturated(w, s)
        current = s.delivered if w.current is None else w.current
        if s.over and s.stood >= PAUSE_AFTER and current <= 0:
            return self._pause(w, s, w.rate if held is None else held)
        rate = self._open(w, s)
        return rate if held is None else max(rate, held)

    def _pause(self, w: Window, s: _Signals, held: float) -> float:
        """A queue stands and nothing at all has been served for PAUSE_AFTER s: admit what is delivered until
        the service serves again (then the rate in force before resumes at once) or the queue is confirmed
        (a verdict: an outage, or a capacity). μ is untouched: a real server's event loop, busy with a herd's
        connections, can stall completions for a few tenths of a second, and that is no outage."""
        self._held, self.pausing, self.phase = held, True, Phase.PAUSED
        return max(s.delivered, 1e-3)

    def _signals(self, w: Window) -> _Signals:
        """What this window says: μ so far, the baseline, the delivered rate, and whether work is queueing."""
        mu = w.rate if self.mu is None else self.mu
        base = self._base(w)
        delivered = w.completion_rate if w.delivered is None else w.delivered
        # Little: without a queue, in flight = throughput × baseline latency. Above that, work waits. The
        # throughput is what was delivered in the newest 0.2 s or 0.5 s, whichever is higher: the shorter
        # catches up within a latency when demand rises (a burst is not a queue), the longer damps noise.
        current = delivered if w.current is None else w.current
        expected = max(current, delivered) * base
        queued = w.busy - expected
        over = queued > self.tolerance * expected + 1 or w.drops > 0
        if over and not self._over:
            self._over_since, self._stalled_at = w.now, -math.inf
        self._over = self._over + 1 if over else 0
        if over and current <= 0:
            self._stalled_at = w.now  # nothing at all delivered in the newest 0.2 s: a stall, or an outage
        # While demand is below the rate, a short queue is a burst of arrivals, and what is delivered is
        # the demand, not the capacity: act only on a queue that lasts three times as long. And what is
        # delivered measures the capacity only over a span the queue stood through, plus a latency for the
        # first completions to come (after an idle spell, a herd's first instants deliver nothing for a
        # latency while in flight jumps): the 0.5 s rate once the queue is that old, the 0.2 s one before.
        # (The allowance for the first completions is at most the delivered rate's span: a service whose
        # baseline is seconds long would otherwise be confirmed seconds late.) Drops are no shortcut: a
        # 503 at a herd's onset says nothing of a capacity measured over the idle time before it.
        stood = w.now - self._over_since - min(base, DELIVERY_SPAN) if self._over else -1.0
        # Once the service delivers again after a stall (a real server's event loop, busy with a herd's
        # connections, delivers nothing for a few tenths of a second, then catches up), what it delivers is
        # a capacity only over a span after the stall: a span across it averages the stall in, and the catch-
        # up delivers what was admitted, which ended start-up at the rate offered (a real herd's onset: μ
        # taken for 100/s, the initial rate, where the service could do 200). While nothing is delivered, the
        # queue's whole age counts (it tells an outage, and a service that stalls again and again has its queue
        # confirmed in a stall by what it delivered over the longer span).
        # And after a stall the catch-up lasts longer than the shorter span: the event loop that stalled is still
        # busy with the herd's first requests, and delivers at most what was admitted. Taken from the 0.2 s rate
        # 0.2 s past the stall, a real herd's onset ended start-up at 105/s (the initial rate 100/s) in one round
        # of five, and probing up from there at +25 %/s took 2 s to find 200/s. Past a stall, only the 0.5 s rate
        # (in a stall, the 0.5 s rate is what there is, as before).
        if current > 0:
            stood = min(stood, w.now - self._stalled_at)
        short = DELIVERY_SPAN if current > 0 and self._stalled_at > -math.inf else CURRENT_SPAN
        sample = delivered if stood >= DELIVERY_SPAN else max(current, delivered) if stood >= short else 0.0
        if w.drops:  # a 502/503/504 is answered, not served: no part of a capacity
            dropped = w.drops / DELIVERY_SPAN if w.drop_rate is None else w.drop_rate
            sample = min(sample, max(0.0, delivered - dropped))
        # A sample that says the service has all but stopped is believed only from the longer span: on a real
        # server a herd's first instants can stall completions for a few tenths of a second (the event loop is
        # busy with the herd's connections), and that is not an outage.
        offered = w.rate if self._held is None else max(w.rate, self._held)
        enough = DELIVERY_SPAN if sample < HEALTHY * offered else CURRENT_SPAN
        queueing = self._over >= (self.confirm if w.limiting else 3 * self.confirm) and stood >= enough
        if self.phase is Phase.DRAINING:
            # Hysteresis on the way out, on what is in flight now (BBR's drain: until in flight is down to
            # the bandwidth-delay product): an average over the newest 0.2 s lags the queue's end.
            queueing = w.inflight - expected > self.tolerance / 2 * expected + 1 or w.drops > 0
        return _Signals(mu, base, delivered, queued, queueing, over, sample, stood, offered)

    def _remeasure(self, w: Window, s: _Signals) -> float:
        """Periodically admit at 3/4 of μ for a few latencies, so the baseline is measured without a queue
        (BBR's PROBE_RTT; Envoy's minRTT window without pinning concurrency to 3)."""
        self.phase = Phase.REMEASURING
        self._quiet = 0.75 * max(s.mu, w.completion_rate)  # (μ may lag a rate that grew while starved)
        self._quiet_until = w.now + max(0.3, 3 * s.base, 4 * max(0.0, s.queued) / self._quiet)
        self._quiet_busy = w.busy
        return self._quiet

    def _remeasuring(self, w: Window, s: _Signals) -> float:
        falling = w.busy < 0.95 * self._quiet_busy
        self._quiet_busy = min(self._quiet_busy, w.busy)
        if w.now < self._quiet_until or (falling and w.now < self._quiet_until + self.reprobe / 2):
            return self._quiet  # until the queue is gone: in flight has stopped falling
        # No queue left: in flight over admissions is the service's own latency (Little), with none of
        # the lag of latencies measured at completion. (While the service drops requests, there is.)
        if not w.drops and w.admit_rate >= LITTLE_MIN_RATE:
            self._baseline.reset(self._little(w))
            self._anchor = self._baseline.value or math.inf  # (only a baseline this measured anchors)
        self._reprobe_at = self._reprobe_after(w.now)
        self.phase = Phase.PROBING  # carry on where it was: a re-measurement is not evidence of a queue
        return s.mu

    def _saturated(self, w: Window, s: _Signals) -> float:
        """A queue is confirmed: what the service delivers now is what it can do; drain what was queued."""
        # Start-up is over when the service delivers a good part of what is offered (its capacity is
        # found). A service that delivers almost nothing of it has collapsed (an outage): when it comes
        # back, its capacity is found again at start-up speed, not at the probing pace.
        # Healthy is judged against the rate offered, and after an outage against the capacity known before
        # it (fading over COLLAPSE_MEMORY s): at a rate an outage cut to a few per second, a trickle delivered
        # is a quarter of the rate, not a capacity found; start-up speed must find the old one again.
        known = self._known(w.now)
        self._started = s.sample >= max(s.offered, known) * HEALTHY
        if not self._started and self.mu is not None and self.mu > known:
            self._before, self._before_at = self.mu, w.now
        self.mu = mu = max(s.sample, 1e-3)
        if s.sample == 0:  # nothing served at all: an outage, held until the service serves again
            self._down, self.phase = True, Phase.OUTAGE
            return mu
        self.phase, self._drain_at, self._drain_busy, self._plateau = Phase.DRAINING, w.now, w.busy, None
        self._samples.clear()
        return self._drain_rate(mu, s.queued)

    def _outage(self, w: Window, s: _Signals) -> float:
        """The service served nothing: hold the rate (no growth into a service that only times out) until
        it serves again without drops; then resume at a share of the capacity known before the outage."""
        current = s.delivered if w.current is None else w.current
        if w.drops or current <= 0:
            return w.rate
        self._down = False
        mu = max(s.mu, w.rate)
        if w.recent_latency <= (1 + self.tolerance) * s.base:  # served at its baseline: the old capacity is back
            mu = max(mu, RESUME * self._known(w.now))
        self.mu = mu
        self._reprobe_at = self._reprobe_after(w.now)  # (the baseline was just seen: no re-measurement now)
        self._start_cruise(w.now)
        return mu

    def _known(self, now: float) -> float:
        """The capacity known before the last outage, faded over COLLAPSE_MEMORY s (0 if none), requests/s."""
        return self._before * math.exp((self._before_at - now) / COLLAPSE_MEMORY)

    def _draining(self, w: Window, s: _Signals) -> float:
        if not s.queueing:
            self._start_cruise(w.now)
            return s.mu
        if not w.drops and s.stood >= DELIVERY_SPAN:
            # The queue stands: what is delivered is the capacity, the highest of the last second (BBR's max
            # filter: noise does not pull it down, a capacity that fell does within a second). Not while
            # the service drops requests: its quick errors count as completions.
            samples = self._samples
            samples.append((w.now, s.delivered))
            while samples[0][0] < w.now - MAX_FILTER:
                samples.popleft()
            best = max(v for _, v in samples)
            spanned = w.now - samples[0][0] >= 0.9 * MAX_FILTER  # (the samples span the max filter's second)
            if best > s.mu:
                self.mu = best
                self._drain_target = max(self._drain_target, self._drain_rate(best, s.queued))
            elif HEALTHY * s.mu <= best < s.mu and (
                w.admit_rate > 1.1 * s.delivered
                or (self._plateau is None and spanned and best < 0.9 * s.mu and w.admit_rate < 0.9 * s.delivered)
            ):
                # More goes in than comes out: the capacity fell while it drained (where as much comes out as
                # goes in, the drain rate is what is delivered, not the capacity). Or less goes in than comes
                # out (the newest 0.2 s against the 0.5 s delivered rate) while 0.9 s of this drain's samples
                # all read a tenth under μ and more: the queue is emptied at all the service can do (a real
                # herd's capacity halving in a drain held μ at 140/s for 3 s while 100/s came out, and the
                # queue of 120 it built timed out). Not while the plateau's quarter cut is being judged: less
                # goes in than comes out then by design, and a service that only got slower must reach the
                # second plateau (this rule, firing there, cut μ from 400/s to 22/s in 20 s). A new drain
                # begins at the new capacity: what was seen at the old one says nothing now. (Under a quarter
                # of μ is not taken for a capacity: a service that hangs mid-drain keeps the μ it had, and is
                # cut by the drain's plateau logic; start-up from the floor would take seconds to find μ again.)
                self.mu = best
                self._drain_target = min(self._drain_target, self._drain_rate(self.mu, s.queued))
                self._drain_at, self._drain_busy, self._plateau = w.now, w.busy, None
        if w.busy < 0.95 * self._drain_busy:
            self._drain_busy, self._drain_at = w.busy, w.now  # in flight still coming down
        elif w.admit_rate > 1.1 * self._drain_target:
            self._drain_at = w.now  # admissions promised by the pacing queue at the old rate still go in
        if w.now - self._drain_at < max(self.drain_time, 2 * s.base):
            return self._drain_target
        # In flight has stopped falling at this admission rate. Either a queue is in balance (the drain
        # rate is not below the capacity, which may have just dropped), or there is no queue and the
        # service itself is slower. Little's latency (in flight over admissions) tells them apart: admit
        # a quarter less, and it falls with a queue but stays put with a slower service.
        little = self._little(w)
        if self._plateau is None:  # first plateau: cut by a quarter and look again
            self._plateau, self._plateau_rate = little, max(s.delivered, 1e-3)
            self._drain_target *= 0.75
        elif little > 0.9 * self._plateau and not w.drops and w.admit_rate >= LITTLE_MIN_RATE:  # (drops: a queue)
            self._baseline.reset(little)  # no queue: the service is this slow now
            self.mu = self._plateau_rate
            self._start_cruise(w.now)
            return self.mu
        else:  # a queue in balance at the first plateau: what it delivered there is the capacity
            self.mu = min(s.mu, self._plateau_rate)
            self._plateau = None
        self._drain_busy, self._drain_at = w.busy, w.now
        return self._drain_target

    def _open(self, w: Window, s: _Signals) -> float:
        """No queue: hold when demand is below the rate, cruise after a drain, else grow the rate."""
        self._baseline.observe(w.latency, w.dt)
        self._seen(w)
        mu = s.mu
        if not w.limiting:
            self.phase = Phase.APP_LIMITED  # demand is below the rate: nothing to learn, hold
            return max(mu, w.rate)
        if w.completion_rate > mu:
            mu = w.completion_rate  # delivered without a queue: capacity is at least this
        self.mu = mu
        if w.now < self._until:
            self.phase = Phase.CRUISING
            return mu
        self.phase = Phase.PROBING if self._started else Phase.STARTING
        if s.over and not self._started:
            return w.rate  # a queue is forming: hold while it stands long enough to measure what is delivered
        gain = self.growth
        # Grow from the rate in force, but never more than two seconds of growth ahead of what is
        # delivered: admissions lag the rate, and a probe must not outrun its own evidence.
        rate = w.rate
        if rate < (1 + 2 * gain) * max(w.completion_rate, s.delivered):
            rate = max(mu, rate) * (1 + gain) ** w.dt
        # Start-up: paced at twice what is delivered, as BBR's (doubling each latency). Not in the update that ends
        # a pause: it is applied undamped, and the 0.2 s rate past a stall is the catch-up burst, no capacity.
        if not self._started and not self.pausing:
            rate = max(rate, STARTUP_PACE * max(s.delivered, w.current or 0.0))
        return rate

    def _seen(self, w: Window) -> None:
        """Push the next re-measurement back if this window read the baseline (BASELINE_SEEN)."""
        if self._anchor == math.inf:
            return  # no re-measurement has measured the baseline: nothing says it holds no queue
        self._anchor = min(self._anchor, self._baseline.value or math.inf)
        if not w.drops and w.latency <= BASELINE_SEEN * self._anchor and self._reprobe_at is not None:
            self._reprobe_at = max(self._reprobe_at, w.now + self.reprobe)

    @property
    def growth(self) -> float:
        """How fast the rate grows while probing now, per second (start-up's until first saturation)."""
        return self.probe_gain if self._started else self.startup_gain

    @staticmethod
    def _little(w: Window) -> float:
        """Latency by Little's law from the newest 0.2 s; the measured mean if nothing was admitted."""
        return w.busy / w.admit_rate if w.admit_rate > 0 and w.busy > 0 else w.recent_latency

    def _start_cruise(self, now: float) -> None:
        self.phase = Phase.CRUISING
        self._until = now + self.cruise * self._rng.uniform(0.5, 1.5) if self._started else now  # start-up: on

    def _drain_rate(self, mu: float, queued: float) -> float:
        self._drain_target = max(mu - max(0.0, queued) / self.drain_time, mu / 2)
        return self._drain_target
