"""The admission decision, free of ASGI: admit, pace, or reject with a slot.

:class:`Gate` owns the token pacer, the spreading policy and the counters. It reads
no clock and does no I/O: every call takes ``now`` (seconds), so the middleware and
the herd simulator drive the very same object on real and virtual time.

The fast path is :meth:`Gate.try_admit` (one bucket update). When it fails,
:meth:`Gate.decide` either *paces* the request (reserves a token that will exist
within ``max_pacing_delay`` seconds, if fewer than ``max_waiters`` are already held)
or *rejects* it with a slot from the spreading policy. The Retry-After of a slot at
``s`` is ``ceil(s - now - lead)``, at least 1, where ``lead = min(1 s, max_pacing_delay)``:
a client is told to come back up to a second *before* its slot, because the gate will
hold it until its token exists. Whole-second Retry-After values would otherwise leave
tokens unused between returns; with the lead, returns always precede their tokens and
the cohort drains at the full rate. Pacing longer than the lead (default 1.5 s vs 1 s)
leaves slack for clients that come back a little late or bunched.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .errors import ConfigError, integer, non_negative, positive
from .headroom import Headroom, StaticHeadroom
from .pacer import TokenPacer
from .probes import Probes
from .routing import Priority
from .spread import SpreadPolicy, spread_from_name

#: Pacing-hold histogram bounds, seconds.
PACING_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0)
#: The sheddable share never drops below this fraction of the rate, so slots stay finite.
MIN_SHARE = 0.05


class Verdict(Enum):
    ADMIT = "admitted"
    PACE = "paced"
    REJECT = "rejected"


@dataclass(frozen=True, slots=True)
class Decision:
    """Outcome of :meth:`Gate.decide`. Times in seconds; rates in requests/s."""

    verdict: Verdict
    delay: float = 0.0  # PACE: how long to hold the request
    retry_after: int = 0  # REJECT: whole seconds, >= 1
    slot: float = 0.0  # REJECT: absolute time the client is expected back
    rate: float = 0.0  # the rate in force
    early: bool = False  # REJECT: a recognised client came back before its slot (it ignores Retry-After)


@dataclass(slots=True)
class GateStats:
    """Plain counters (requests). Admissions at once are counted by the pacer (``pacer.taken``)."""

    paced: int = 0
    rejected: int = 0
    critical: int = 0
    abandoned: int = 0  # paced requests whose client went away (token refunded)
    early: int = 0  # rejections of recognised clients that came back before their slot


class _RateMeter:
    """Exponentially decaying rate (units/s) with time constant ``tau`` seconds.

    Bias-corrected for its warm-up: until it has seen ``tau`` seconds of traffic it divides by
    the weight accumulated so far rather than by ``tau``, so a steady 20/s reads 20/s from the
    start instead of climbing towards it (an under-read here makes the schedule hand out slots
    faster than the bucket can honour them).
    """

    __slots__ = ("_at", "_level", "_since", "tau")

    def __init__(self, tau: float = 2.0) -> None:
        self.tau, self._level, self._at = tau, 0.0, 0.0
        self._since: float | None = None

    def add(self, amount: float, now: float) -> None:
        if self._since is None:
            self._since = self._at = now
        elif now > self._at:
            self._level *= math.exp((self._at - now) / self.tau)
            self._at = now
        self._level += amount

    def rate(self, now: float) -> float:
        if self._since is None:
            return 0.0
        level = self._level * math.exp(min(0.0, self._at - now) / self.tau)
        span = max(now - self._since, self.tau / 2)  # at least half a time constant of evidence
        return level / (self.tau * -math.expm1(-span / self.tau))


class Gate:
    """Token pacer + pacing queue + spreading policy.

    ``rate``: requests/s (or a :class:`Headroom`); ``burst``: tokens admitted at once
    from idle; ``max_pacing_delay``: longest hold, seconds (0 disables pacing);
    ``max_waiters``: most requests held at once (default: two pacing windows at the initial rate,
    at least 1000, since a schedule returns up to rate × lead clients at once); ``spread``: ``"schedule"``,
    ``"jitter"`` or a :class:`SpreadPolicy`; ``max_retry_after``: cap, seconds;
    ``tarpit``: how long to hold the 429 of a recognised client that came back early, seconds.
    ``standing_queue``/``fresh_pacing_delay`` (seconds): once the pacing queue has not emptied for
    ``standing_queue``, a request that holds no slot is paced at most ``fresh_pacing_delay`` and
    otherwise gets a slot (Facebook's adaptive queue timeout, CoDel's standing queue). Pacing is for
    bursts and for clients returning to their slot; under sustained overload a long hold for fresh
    arrivals is only added latency, and a delay line the estimators would have to see through.
    """

    def __init__(
        self,
        rate: float | Headroom,
        burst: float | None = None,
        *,
        max_pacing_delay: float = 1.5,
        max_waiters: int | None = None,
        spread: str | SpreadPolicy = "schedule",
        max_retry_after: float = 120.0,
        max_keys: int = 100_000,
        refresh_interval: float = 0.1,
        tarpit: float = 1.0,
        standing_queue: float = 2.0,
        fresh_pacing_delay: float = 0.1,
        now: float = 0.0,
    ) -> None:
        self.headroom: Headroom = StaticHeadroom(rate) if isinstance(rate, (int, float)) else rate
        initial = positive("rate", self.headroom.rate(now))
        burst = max(1.0, initial / 10) if burst is None else positive("burst", burst)
        self.max_pacing_delay = non_negative("max_pacing_delay", max_pacing_delay)
        self.lead = min(1.0, self.max_pacing_delay)  # how early before its slot a client is told to return
        if max_waiters is None:  # room for two pacing windows of returns at the initial rate
            max_waiters = max(1000, math.ceil(2 * initial * self.max_pacing_delay))
        integer("max_waiters", max_waiters, 0)
        self.max_waiters = max_waiters
        self.max_retry_after = positive("max_retry_after", max_retry_after)
        if self.max_retry_after < 1:
            raise ConfigError("max_retry_after", "must be >= 1 second", max_retry_after)
        self.refresh_interval = positive("refresh_interval", refresh_interval)
        self.tarpit = non_negative("tarpit", tarpit)
        self.standing_queue = non_negative("standing_queue", standing_queue)
        self.fresh_pacing_delay = non_negative("fresh_pacing_delay", fresh_pacing_delay)
        self._queue_since = now  # when the pacing queue last started from empty
        # Paced reservations may run the bucket into debt by up to one pacing delay of tokens.
        self.pacer = TokenPacer(initial, burst, now=now, max_debt=max(burst, initial * self.max_pacing_delay))
        if isinstance(spread, str):
            spread = spread_from_name(spread, self.max_retry_after, max_keys)
        elif not isinstance(spread, SpreadPolicy):
            raise ConfigError("spread", "expected 'schedule', 'jitter' or a SpreadPolicy", spread)
        self.spread: SpreadPolicy = spread
        self.stats = GateStats()
        self.pacing_histogram = [0] * (len(PACING_BOUNDS) + 1)  #: pacing holds per bound (then +Inf), not cumulative
        self.pacing_seconds = 0.0  #: total pacing hold, seconds
        #: probe aggregates the middleware records into, if the headroom source reads them (else None)
        self.probes: Probes | None = getattr(self.headroom, "probes", None)
        #: a shared budget (admitgate.shared.RedisBudget) that leases this replica's tokens, or None
        self.backend: Any = None
        self.waiters = 0
        self._critical = _RateMeter()
        self.next_refresh = now + self.refresh_interval

    # -- rate -----------------------------------------------------------------------------
    def refresh(self, now: float) -> None:
        """Pull the current rate from the headroom source (cheap to call every request)."""
        if now >= self.next_refresh:
            self.next_refresh = now + self.refresh_interval
            rate = self.headroom.rate(now)
            if self.backend is not None:  # a shared budget sets the pacer; this replica's H is published
                self.backend.local_rate = rate
            elif rate != self.pacer.rate and rate > 0 and rate != float("inf"):
                self.pacer.set_rate(rate, now)

    def critical_rate(self, now: float) -> float:
        """λ_new: measured rate of critical (never shed) traffic, requests/s."""
        return self._critical.rate(now)

    def state(self, now: float) -> dict[str, float | str | None]:
        """What the gate believes now: rate, λ_new and H (requests/s), plus the estimator's state."""
        critical = self._critical.rate(now)
        out: dict[str, float | str | None] = {"rate": self.pacer.rate, "critical_rate": critical}
        out.update(headroom=self.shed_rate(now), waiters=float(self.waiters))
        reader = getattr(self.headroom, "state", None)
        if reader is not None:
            live = reader()
            out.update(estimator=live.estimator, estimator_state=live.state, mu=live.mu, background=live.background,
                       lambda_new=critical + live.background, baseline_latency=live.baseline, latency=live.latency,
                       completion_rate=live.completion_rate, inflight=float(live.inflight))  # fmt: skip
        else:
            out.update(lambda_new=critical, mu=self.pacer.rate)
        return out

    def shed_rate(self, now: float) -> float:
        """The rate the sheddable cohort may come back at: H = μ − λ_new (floored)."""
        rate = self.pacer.rate
        return max(rate - self._critical.rate(now), rate * MIN_SHARE)

    # -- decisions ------------------------------------------------------------------------
    def try_admit(self, cost: float, priority: Priority, now: float) -> bool:
        """Fast path: True if admitted at once (tokens taken). Critical traffic always is."""
        if priority.plain and now < self.next_refresh:  # the common case, kept short
            return self.pacer.try_take(cost, now)
        self.refresh(now)
        if priority.critical:
            self.pacer.charge(cost, now)
            self._critical.add(cost, now)
            self.stats.critical += 1
            return True
        pacer = self.pacer
        return pacer.try_take(cost, now, priority.reserve * pacer.burst)

    def admitted_key(self, key: Hashable | None, now: float) -> None:
        """Tell the spreading policy that ``key`` got in (frees its slot, if any)."""
        if key is not None:
            self.spread.release(key, now)

    def decide(self, cost: float, priority: Priority, key: Hashable | None, now: float) -> Decision:
        """Slow path after :meth:`try_admit` failed: pace or reject."""
        pacer = self.pacer
        keep = priority.reserve * pacer.burst
        held = None
        if key is not None:
            held = self.spread.slot_of(key, now)
            if held is not None and held - now > self.max_pacing_delay:
                return self._reject(held, now, early=True)  # same slot, schedule untouched
        if self.waiters < self.max_waiters:
            longest = self.max_pacing_delay
            if not self.waiters:
                self._queue_since = now
            elif held is None and now - self._queue_since > self.standing_queue:
                longest = min(longest, self.fresh_pacing_delay)  # a standing queue: fresh arrivals get a slot
            wait = pacer.reserve(cost, now, longest, keep)
            if wait is not None:
                self.admitted_key(key, now)
                self.waiters += 1
                self.stats.paced += 1
                self.pacing_histogram[bisect_left(PACING_BOUNDS, wait)] += 1
                self.pacing_seconds += wait
                if self.probes is not None:
                    self.probes.limited(wait)
                return Decision(Verdict.PACE, delay=wait, rate=pacer.rate)
        earliest = now + pacer.wait_time(cost, now, keep)
        slot = self.spread.assign(key, now, self.shed_rate(now), earliest, cost)
        return self._reject(slot, now)

    def _reject(self, slot: float, now: float, early: bool = False) -> Decision:
        retry_after = min(max(1, math.ceil(slot - now - self.lead - 1e-9)), int(self.max_retry_after))
        stats = self.stats
        stats.rejected += 1
        if self.probes is not None:
            self.probes.limited()
        if early:
            stats.early += 1
        return Decision(Verdict.REJECT, retry_after=retry_after, slot=slot, rate=self.pacer.rate, early=early)

    def hold(self, decision: Decision) -> tuple[float, int]:
        """(seconds to hold the rejection, Retry-After to send after holding).

        Only a recognised early returner is held (the tarpit), and never so long that its Retry-After
        would drop below 1: what is held comes off the wait it is told, so it still returns on time.
        """
        if not decision.early or not self.tarpit or decision.retry_after <= 1:
            return 0.0, decision.retry_after
        held = min(self.tarpit, decision.retry_after - 1)
        return held, math.ceil(decision.retry_after - held)

    def release_waiter(self) -> None:
        """A paced request's hold is over: it goes on to the app."""
        self.waiters -= 1

    def abandon(self, cost: float, now: float) -> None:
        """A paced request was given up (client gone): free its place and refund its token."""
        self.waiters -= 1
        self.pacer.refund(cost, now)
        self.stats.abandoned += 1

    def __repr__(self) -> str:
        return f"Gate({self.pacer!r}, waiters={self.waiters}, horizon={self.spread.horizon(self.pacer._updated):.2f}s)"
