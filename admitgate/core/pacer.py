"""Token pacer: a token bucket whose refill rate (the capacity μ the gate is told) can change at any time.

The bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second.
Tokens may go *negative*: a paced request reserves a token that will only exist a
little later, and a critical request is charged even when the bucket is empty
(it is served against capacity first). Every method takes ``now`` (seconds, from
an injected clock) and does O(1) work; nothing reads time or does I/O here.

Rate changes are exact: tokens accrued at the old rate up to ``now`` are kept,
and the new rate applies from ``now`` on. A reservation is a place on the *refill axis*
(the tokens the bucket has been refilled with since it started): its token exists once
the refill reaches that place, so when the rate rises, outstanding reservations come due
sooner, in order; when it falls, later. A *deep* cut (to below half the highest rate since
the last one: an outage, a capacity halved) starts a new :attr:`epoch`: the debt of the
reservations made before it is forgiven, and each of them, when its hold ends, reserves
again at the new rate. They end in the order they were made, so they keep their order;
those that would now wait too long are turned away instead of being let in on a timetable
the service can no longer keep. The debt floor keeps its length in seconds.

A reservation given up before its place comes (its client left, or its hold was turned away after
a small cut) is *released*: the newest one's tokens go back to the bucket, and any other's place is
taken by the next reservation of the same cost that it would not keep waiting too long, instead of
a place behind the newest. Its tokens were charged once and are used once.
"""

from __future__ import annotations

import heapq
import math

from .errors import ConfigError, non_negative, positive

#: A rate below this share of the highest rate since the last epoch starts a new one.
EPOCH_CUT = 0.5
#: The refill rate of a paused pacer (tokens/s): so small that nothing is admitted, yet > 0 to divide by.
PAUSED = 1e-9
#: Most places released and not yet taken again that a pacer keeps (beyond, a released place's tokens go unused).
RELEASED = 256


class TokenPacer:
    """Token bucket with a changeable rate, reservations and a debt floor.

    ``rate``: tokens/s (requests/s for cost 1). ``burst``: bucket size in tokens.
    ``max_debt``: how far below zero reservations and forced charges may drive
    the bucket, in tokens. The bucket starts full.

    Guarantee: if every admission takes its tokens through :meth:`try_take` or
    :meth:`reserve` (and a reservation is only used after its delay), the cost
    admitted in any interval of length t is at most ``rate*t + burst``.
    """

    __slots__ = ("_axis", "_axis_at", "_burst", "_epoch_rate", "_floor", "_newest", "_rate", "_released", "_tokens",
                 "_until", "_updated", "asked", "epoch", "taken")  # fmt: skip

    def __init__(self, rate: float, burst: float, *, now: float = 0.0, max_debt: float | None = None) -> None:
        self._rate = positive("rate", rate)
        self._burst = positive("burst", burst)
        debt = self._burst if max_debt is None else non_negative("max_debt", max_debt)
        self._floor = -debt
        self._tokens = self._burst
        self._updated = now
        self._axis, self._axis_at = 0.0, now  # the refill axis: tokens refilled by _axis_at
        self._until = math.inf  # the refill stops here (a shared budget's grant runs out)
        # (Tenants.take reads and writes _tokens, _updated, _rate, _burst and _until as try_take does, inlined:
        # a change to how the bucket is kept changes it too; test_tenants' side-by-side tests compare them.)
        self._newest: float | None = None  # the place of the reservation made last, while nobody stands behind it
        self._released: list[tuple[float, float]] = []  # (place, cost) of reservations given up: a heap, this epoch's
        self.epoch = 0  #: deep rate cuts so far: reservations of an earlier epoch must reserve again
        self._epoch_rate = self._rate  # the highest rate since the epoch began
        self.taken = 0  #: successful try_take calls (admissions at once)
        self.asked = 0  #: reservations asked for, granted or not (demand for tokens beyond what was free)

    @property
    def rate(self) -> float:
        """Refill rate in tokens per second."""
        return self._rate

    @property
    def epoch_rate(self) -> float:
        """The highest rate since the current epoch began, tokens/s: a rate below :data:`EPOCH_CUT` of it starts
        a new epoch."""
        return self._epoch_rate

    @property
    def burst(self) -> float:
        """Bucket capacity in tokens."""
        return self._burst

    def _refill(self, now: float) -> float:
        if now > self._updated:
            end = now if now < self._until else self._until
            if end > self._updated:
                self._tokens = min(self._burst, self._tokens + (end - self._updated) * self._rate)
            self._updated = now
        return self._tokens

    def set_rate(self, rate: float, now: float) -> None:
        """Change the refill rate at ``now``; tokens accrued so far keep the old rate."""
        if not rate > 0 or rate == float("inf"):
            raise ConfigError("rate", "must be a finite number > 0", rate)
        tokens = self._refill(now)
        self._axis, self._axis_at = self.refilled(now), now
        self._until = math.inf
        if rate < self._epoch_rate * EPOCH_CUT:
            self.epoch += 1
            self._newest = None
            self._released.clear()
            self._tokens = max(tokens, 0.0)
            self._epoch_rate = rate
        elif rate > self._epoch_rate:
            self._epoch_rate = rate
        self._floor *= float(rate) / self._rate
        self._rate = float(rate)

    def set_grant(self, rate: float, now: float, until: float = math.inf) -> None:
        """Refill at ``rate`` from ``now`` until ``until`` (seconds), as a shared budget granted it.

        A grant is a quantity, ``rate × (until − now)`` tokens: if the next grant comes late (a busy event
        loop), the refill stops at ``until`` instead of going on at a rate nobody granted. A grant moves with
        demand from one lease to the next; it is not a capacity that collapsed, so it starts no epoch:
        reservations already made stand (their tokens were granted). A rate of 0 pauses the refill (a
        budget that grants nothing, or a fail-closed fallback).
        """
        tokens = self._refill(now)
        self._axis, self._axis_at = self.refilled(now), now
        self._tokens = tokens
        self._until = until
        rate = max(float(rate), PAUSED)
        self._floor *= rate / self._rate
        self._rate = rate

    def set_burst(self, burst: float, now: float) -> None:
        """Change the bucket size at ``now`` (tokens above the new size are dropped)."""
        self._burst = positive("burst", burst)
        self._refill(now)
        self._tokens = min(self._tokens, self._burst)

    def cap(self, tokens: float, now: float) -> None:
        """Leave at most ``tokens`` in the bucket at ``now`` (its debt, if any, stands)."""
        self._tokens = min(self._refill(now), tokens)

    def give(self, tokens: float, now: float) -> None:
        """Add ``tokens`` to the bucket at ``now``, up to its size (tokens passed from another bucket)."""
        self._tokens = min(self._burst, self._refill(now) + tokens)

    def tokens(self, now: float) -> float:
        """Tokens in the bucket at ``now`` (negative while reservations are outstanding)."""
        return self._refill(now)

    def try_take(self, cost: float, now: float, keep: float = 0.0) -> bool:
        """Take ``cost`` tokens if that leaves at least ``keep`` in the bucket."""
        tokens = self._tokens
        # The refill, inlined (this is the hot path) and with one comparison in the common case. A ``now``
        # earlier than the last refills negatively: the refill is linear, so the next call makes it good.
        if now < self._until:
            tokens += (now - self._updated) * self._rate
            if tokens > self._burst:
                tokens = self._burst
            self._updated = now
        elif now > self._updated:  # beyond a shared budget's grant: the refill stopped at its end
            if self._until > self._updated:
                tokens += (self._until - self._updated) * self._rate
                if tokens > self._burst:
                    tokens = self._burst
            self._updated = now
        left = tokens - cost
        if left >= keep:
            self._tokens = left
            self.taken += 1
            return True
        self._tokens = tokens
        return False

    def wait_time(self, cost: float, now: float, keep: float = 0.0) -> float:
        """Seconds from ``now`` until ``cost`` tokens can be taken leaving ``keep``; 0.0 if now."""
        missing = cost + keep - self._refill(now)
        return missing / self._rate if missing > 0 else 0.0

    def reserve(self, cost: float, now: float, max_wait: float, keep: float = 0.0) -> float | None:
        """Reserve ``cost`` tokens that will exist within ``max_wait`` seconds at the current rate.

        Charges the bucket at once, so later callers queue behind this one, and returns the
        reservation's place on the refill axis: :meth:`due_in` tells how long until its tokens
        exist (0.0 or less: now). Returns None and charges nothing if the wait would exceed
        ``max_wait``, the debt floor, or the end of a shared budget's grant.
        """
        self.asked += 1
        released = self._released
        while released:  # a place given up that is still to come: taken instead of one behind the newest
            place, size = released[0]
            due = (place - self.refilled(now)) / self._rate
            if due <= 0:  # (its tokens came and went unused, as a bucket's beyond its size: never taken late)
                heapq.heappop(released)
                continue
            # (a class that must leave part of the burst takes none: it reserves behind the newest, as it would have)
            if not keep and size == cost and due <= max_wait and now + due <= self._until:
                heapq.heappop(released)
                return place
            break
        tokens = self._refill(now)
        missing = cost + keep - tokens
        wait = missing / self._rate if missing > 0 else 0.0
        if wait > max_wait or tokens - cost < self._floor or now + wait > self._until:  # (beyond a grant: no)
            return None
        self._tokens = tokens - cost
        self._newest = place = self.refilled(now) + max(0.0, missing)
        return place

    def refilled(self, now: float) -> float:
        """Tokens the bucket has been refilled with by ``now`` (uncapped): the axis reservations stand on."""
        return self._axis + self._rate * ((now if now < self._until else self._until) - self._axis_at)

    def due_in(self, place: float, now: float) -> float:
        """Seconds until the tokens of the reservation at ``place`` exist, at the current rate (<= 0: now)."""
        return (place - self.refilled(now)) / self._rate

    def charge(self, cost: float, now: float) -> None:
        """Take ``cost`` unconditionally (critical traffic), never below the debt floor."""
        self._tokens = max(self._floor, self._refill(now) - cost)

    def refund(self, cost: float, now: float, place: float) -> bool:
        """Give back the ``cost`` tokens of the reservation at ``place`` (this epoch's), not used; True if given.

        Only the newest reservation's tokens come back. Behind an older one, later reservations hold their
        places on the refill axis: tokens given back would be reserved again at one of those places, and two
        requests would go in on one token. Its tokens go unused instead (once), as a real bucket's would.
        """
        if place != self._newest:
            return False
        self._newest = None  # (the one before it is not known: nothing more comes back until the next)
        self._tokens = min(self._burst, self._refill(now) + cost)
        return True

    def release(self, cost: float, now: float, place: float) -> None:
        """Give up the reservation of ``cost`` tokens at ``place`` (this epoch's), not used: the newest one's tokens
        go back to the bucket (:meth:`refund`); any other's place is taken by the next :meth:`reserve` of the same
        cost that it keeps waiting no longer than it may, while the place is still to come.

        Left unused, each hold a small rate cut turned away (its token now due a moment beyond the pacing window)
        was a token lost: in a tenant's pool whose clients stood 1.5 s deep, 20 of its 70/s, second after second.
        """
        if not self.refund(cost, now, place) and len(self._released) < RELEASED:
            heapq.heappush(self._released, (place, cost))

    def __repr__(self) -> str:
        state = f"tokens={self._tokens:.3f}@{self._updated:.3f}"
        return f"TokenPacer(rate={self._rate:g}/s, burst={self._burst:g}, {state})"
