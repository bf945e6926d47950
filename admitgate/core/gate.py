"""The admission decision, free of ASGI: admit, pace, or reject with a place in the retry schedule.

:class:`Gate` owns the token pacer (refilling at the capacity μ), the retry schedule (whose head
moves at the shed rate H = μ − λ_new) and the counters. It reads no clock and does no I/O: every
call takes ``now`` (seconds), so the middleware and the herd simulator drive the very same object
on real and virtual time, through the same two calls:

* :meth:`Gate.admit` decides a request: admitted, paced (held for ``delay`` seconds), or rejected
  with a Retry-After (its 429 possibly held first, the tarpit);
* :meth:`Gate.end_hold` ends a hold and says what happens next.

Two kinds of request meet here. A *new* request (a first attempt: its client holds no place) takes
a token from the bucket at once, or is paced until its reserved token exists, or is given a place
at the tail of the schedule. A *returning* client holding a place goes in when its place is due:
it is held until then if that is within ``max_pacing_delay``, and is then charged ahead of later
arrivals (never past the bucket's debt floor). Otherwise it is told again when its place will be due
and keeps it. The schedule moves at H = μ − λ_new, so the bucket keeps λ_new for new requests.

λ_new is measured, not configured: the rate of requests from clients holding no place, as the median
of the last few whole seconds, so that a herd's own first wave (it arrives within a second) does not
count as new traffic; less the returns told to clients nothing tied (a :class:`~admitgate.core.decision.Stranger`)
that nobody claimed, which come back looking new (see :class:`~admitgate.core.newrate.NewRate`).

The Retry-After of a place is ``ceil(τ − lead)``, at least 1, where τ is the forecast time until the
place is due (see :func:`admitgate.core.schedule.forecast`) and ``lead = min(1 s, max_pacing_delay)``: a
client is told to come back up to a second before its place is due and is held until it is.
Whole-second Retry-After values would otherwise leave tokens unused between returns. When the capacity μ
has collapsed below a quarter of its recent peak (an outage, until a λ_new window after it is back),
the forecast expects the peak of H back at any moment: clients are told when their place would be due at
that peak, and ask again if it is not. H falling while μ stands (new arrivals take it: a spike, or sustained
overload) is no outage: clients are told when their place would be due at the peak, but not sooner than a
λ_new window, when λ_new will have been measured anew; unless μ was cut as it fell (a tenants' pool's share, cut
as other tenants wake, comes back as they drain), when it is waited out at the peak, as an outage is.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left
from collections.abc import Hashable

from .decision import ADMITTED, PACING_BOUNDS, Decision, Identify, Stranger, Verdict
from .pacer import TokenPacer
from .priority import Priority
from .rates import GateRates
from .schedule import Place, forecast

#: A place counts as due when the head is within this many seconds of it (float rounding).
DUE_SLACK = 1e-6
#: Seconds of float rounding below a whole second that Retry-After is not rounded up for.
CEIL_SLACK = 1e-9


class Gate(GateRates):
    """Token pacer + retry schedule + pacing and tarpit bounds.

    ``rate``: the capacity μ in requests/s, a :class:`~admitgate.core.source.RateSource` that reads it (live), or a
    :class:`~admitgate.core.source.Capacity` that reports it.
    ``settings``: the gate's knobs (:class:`~admitgate.core.settings.Settings`; its defaults if None).
    ``now``: the time it starts at, seconds. ``tuning``: the algorithm's constants
    (:class:`~admitgate.core.tuning.GateTuning`).

    It is a :class:`~admitgate.core.decision.Decider` on its own (it has no tenants: ``tenant`` is ignored), and
    each pool of a tenants' table is one (its :attr:`parent` set).
    """

    # -- decisions ------------------------------------------------------------------------
    def try_take(self, cost: float, now: float, tenant: str | None = None) -> bool:
        """:meth:`admit`'s first branch for a request of a plain class, without the Decision: a token taken at once
        (nobody holds a place, no refresh is due, there is room in flight). False, having only refilled the
        bucket, for anything else: :meth:`admit` decides it then."""
        bound = self.bound
        return (not self._book and now < self.next_refresh
                and (bound is None or bound.inflight - bound.answered < bound.limit)
                and self.pacer.try_take(cost, now))  # fmt: skip

    def admit(self, cost: float, priority: Priority, now: float, identify: Identify,
              tenant: str | None = None) -> Decision:  # fmt: skip
        """Decide one request of ``cost`` tokens in class ``priority`` at ``now``.

        ``identify()`` returns the client's key (or None); it is called only when the answer matters:
        when someone holds a place, or when this request is not admitted at once.
        """
        if now >= self.next_refresh:
            self.refresh(now)
        pacer, schedule, stats = self.pacer, self.schedule, self.stats
        if priority.critical:
            pacer.charge(cost, now)
            stats.critical += 1
            return ADMITTED
        reserve = priority.reserve
        bound, parent = self.bound, self.parent
        guard = None if parent is None else parent.bucket
        room = bound is None or bound.inflight - bound.answered < bound.limit
        if room and (guard is None or guard.tokens(now) + guard.rate * DUE_SLACK >= cost + reserve * guard.burst) \
                and pacer.try_take(cost, now, reserve * pacer.burst):  # fmt: skip
            if guard is not None:
                guard.charge(cost, now)
        elif room and parent is not None and guard is not None and not reserve and \
                guard.tokens(now) - self.tuning.spare_costs * cost >= parent.keep * guard.burst:  # fmt: skip
            # (its own bucket untouched: the replica's refill the pools left, see GateTuning.spare. Two requests'
            # cost are kept beyond a sheddable request's reserve: with one, a greedy tenant took the tokens a
            # sheddable one beside it needed as they came)
            guard.charge(cost, now)
            stats.spare += 1
        else:
            stats.contended += 1
            key = identify()
            place = schedule.place_of(key, now) if key is not None and schedule.book else None
            if place is None and getattr(key, "lapses", False):  # (a place of its kind its client did not claim)
                place = self._strays.claim(key, now, schedule.place_of)
            if place is None:
                return self._new_request(key, cost, reserve, now)
            self._came_back(key, place)
            return self._returning(key, place, cost, reserve, now, now)
        if schedule.book:  # someone holds a place: if it is this client, it got in early
            key = identify()
            place = schedule.forget(key, now) if key is not None else None
            if place is None and getattr(key, "lapses", False):
                place = self._strays.claim(key, now, schedule.place_of)
            if place is not None:
                self._came_back(key, place)
                schedule.release(place[0], place[1], now)
        return ADMITTED

    def _new_request(self, key: Hashable | None, cost: float, reserve: float, now: float) -> Decision:
        """A first attempt that found no free token: a reserved token within the pacing window, or a place."""
        if self.probes is not None:  # (demand beyond the rate or the room: what an estimator calls limiting)
            self.probes.limited()
        pacer = self.pacer
        keep = reserve * pacer.burst
        if now >= self._clear_at:  # the bucket's debt has been repaid since the last one: a new queue
            self._queue_since = now
        if self.waiters < self.max_waiters:
            longest = self.max_pacing_delay
            if now - self._queue_since > self.standing_queue and self._flooded():
                longest = min(longest, self.fresh_pacing_delay)  # a standing queue: new requests get a place
            token = pacer.reserve(cost, now, longest, keep)
            if token is not None:
                self._clear_at = now + max(0.0, -pacer.tokens(now)) / pacer.rate
                wait = pacer.due_in(token, now)
                if wait <= DUE_SLACK and not self._shut(cost, now, reserve):  # (due now: in. As a hold of no
                    return self._let_in(cost, now)  # delay, it was served at once and never ended: its waiter stayed)
                return self._pace(wait, now, key, cost, reserve, None, token, now)
        # The first place is due once the bucket's debt is repaid, and new requests keep arriving while
        # it is: the debt falls at μ − λ_new, the very rate the schedule moves at.
        start = pacer.wait_time(cost, now, keep) * pacer.rate / self.schedule.rate
        place = (self._new_place(key, cost, now, start), cost, now)
        return self._unheard(key, place, cost, reserve, now, now) or self._reject(key, place, now, early=False)

    def _new_place(self, key: Hashable | None, cost: float, now: float, start: float) -> float:
        """A new place for ``key`` (see :meth:`Schedule.take`): its source's share is ``source_share`` seconds of
        the promised H (at least ``source_places`` tokens), so that one source flooding the schedule with identities
        keeps others waiting that long at most."""
        t = self.tuning
        share = max(t.source_places, self._promise * t.source_share)
        return self.schedule.take(cost, now, start, getattr(key, "source", None), share)

    def _unheard(self, key: Hashable | None, place: Place, cost: float, reserve: float, now: float,
                 since: float) -> Decision | None:  # fmt: skip
        """A new place taken while a herd still lands on the fleet (:meth:`Budget.unsettled`): held and booked, so the
        next lease publishes it, until the fleet's backlog has landed (:meth:`landed`), its place is due, or
        ``tuning.landing_hold`` from its arrival; None: told now. Apart from the pacing holds (counted among them, a
        herd of 3,500 on one replica took every slot, and requests whose tokens were near were told to come back)."""
        backend, tuning, schedule = self.backend, self.tuning, self.schedule
        left = tuning.landing_hold - (now - since)
        if backend is None or key is None or left <= DUE_SLACK or \
                self.landing >= self.max_waiters * tuning.landing_waiters or \
                not backend.unsettled(self.backlog()[0] + (schedule.place_of(key, now) is None)):  # fmt: skip
            return None
        schedule.hold(key, place, now)
        self.landing += 1
        wait = min(left, max(schedule.due_in(place[0], now), self.refresh_interval))
        return Decision(Verdict.PACE, wait, 0, schedule.rate, key, cost, reserve, place, None, self.pacer.epoch, since,
                        now, landing=True)  # fmt: skip

    def _held(self, held: Decision, now: float) -> Decision:
        """A client held for its place, at the end of its hold. A new place held while a herd lands (see
        :meth:`_unheard`) is held on while the herd lands and its place is not due, else decided as a client back for
        its place at ``now``, a pacing window from now (from its arrival, every place due within two seconds was told
        1 s at once: twice H clients to come back in the same second)."""
        key, place = held.key, held.place
        assert key is not None and place is not None
        if not held.landing:
            return self._returning(key, place, held.cost, held.reserve, now, held.since)
        if self.schedule.due_in(place[0], now) > DUE_SLACK:  # (a due place goes in: held on, its token went unused)
            again = self._unheard(key, place, held.cost, held.reserve, now, held.since)
            if again is not None:
                return again
        return self._returning(key, place, held.cost, held.reserve, now, now)

    def _returning(self, key: Hashable, place: Place, cost: float, reserve: float, now: float,
                   since: float) -> Decision:  # fmt: skip
        """A client holding ``place``: in at its turn, held until it if near, else told again (it keeps it).

        Near means due within what is left of the pacing window, at the head's pace or at the promised H:
        while a live estimator drains a queue the head slows down for a moment, and a client held
        through it is in when the pace comes back, where one sent away would come back a second late.
        A client that was held and cannot be held on (its window is spent, or no waiter slot is free) whose
        place is due within the lead is let in now, ahead of its place (its token, or paced for it): told to
        come back, it would return after its place was passed.
        """
        schedule = self.schedule
        due = schedule.due_in(place[0], now)
        if due <= DUE_SLACK:
            return self._turn(key, place, cost, reserve, now, since)
        left = self.place_hold - (now - since)
        soon = min(due, (place[0] - schedule.head(now)) / self._promise)
        if soon <= left and self.waiters < self.max_waiters:
            return self._pace(min(due, left), now, key, cost, reserve, place, None, since, held=now > since)
        if now > since and due <= self.lead:
            # Held, not to be held on, and due within the lead: told to come back (1 s at least), it would
            # return after its place was passed, and the share of H its place stands for would go unused.
            return self._turn(key, place, cost, reserve, now, since)
        if place[2] == since:  # (a new place, never told: held while the fleet's herd lands)
            held = self._unheard(key, place, cost, reserve, now, since)
            if held is not None:
                return held
        return self._reject(key, place, now, early=now < place[2] - self.tuning.early_slack)

    def _turn(self, key: Hashable, place: Place, cost: float, reserve: float, now: float, since: float) -> Decision:
        """``key``'s place is due: its token now, or paced for it, or held a moment to ask again (the bucket
        is short: μ was cut, or a shared budget's next grant has not come yet), or back at the head.

        The schedule only says when a client may come; the bucket still says how much goes in, so every
        admission stays within ``rate·t + burst`` whatever the schedule promised.
        """
        pacer, schedule = self.pacer, self.schedule
        longest = self.max_pacing_delay if self.waiters < self.max_waiters else 0.0
        token = pacer.reserve(cost, now, longest, reserve * pacer.burst)  # (not try_take: counted already)
        if token is None:
            if self.probes is not None:  # (its place is due, the rate is short)
                self.probes.limited()
            left = self.place_hold - (now - since)
            if left > self.refresh_interval and self.waiters < self.max_waiters:
                return self._pace(self.refresh_interval, now, key, cost, reserve, place, None, since)
            return self._reject(key, (schedule.head(now), place[1], place[2]), now, early=False)
        # (A place not yet due stays where it is: its token was reserved out of H's budget, which the head pays
        # back when it crosses the place. Released, the head skipped ahead of H and starved new arrivals.)
        schedule.forget(key, now)
        self.stats.scheduled += 1
        wait = pacer.due_in(token, now)
        if wait > DUE_SLACK or self._shut(cost, now, reserve):
            return self._pace(wait, now, key, cost, reserve, None, token, now)
        return self._let_in(cost, now)

    def _pace(self, wait: float, now: float, key: Hashable | None, cost: float, reserve: float, place: Place | None,
              token: float | None, since: float, held: bool = False) -> Decision:  # fmt: skip
        """Hold for ``wait`` seconds from ``now`` (woken every :meth:`recheck` s to look again). ``held``: the
        request is held already and holds on (a returner whose place is not due yet): counted once, when its hold
        began. A token due but no room (see :meth:`_shut`): held for room (see :meth:`_in`) within ``max_pacing_delay``
        (short of the replica's bucket only: its token reserved there at once), and with no window at all (0: pacing
        off) turned away at once as :meth:`_in` turns a hold away."""
        room = token is not None and wait <= DUE_SLACK and self._shut(cost, now, reserve)  # its token due, no room
        if room and self.room_hold - (now - since) <= DUE_SLACK:
            self.pacer.give(cost, now)
            return self._requeue(key, cost, reserve, now)
        self.waiters += 1
        spot, delay = None, min(wait, self.recheck)
        if room:
            reserved = self._reserve_room(cost, now, since, reserve)
            if reserved is not None:  # (the replica's bucket is short: its token there, as in _in; the wait planned)
                spot, wait = reserved
                delay = min(wait, self.recheck)
            else:  # no room in flight: held for the rest of its window, woken when room may have come (wait_room)
                delay = self.room_hold - (now - since) if self.full else self.tuning.room_wait
        elif delay <= DUE_SLACK and self._shut(cost, now, reserve):  # (a returner whose window ends before its place)
            delay = self.tuning.room_wait
        if not held:
            pacing = self.stats.pacing
            pacing.counts[bisect_left(PACING_BOUNDS, wait)] += 1
            pacing.seconds += wait
        return Decision(Verdict.PACE, delay, 0, self.schedule.rate, key, cost, reserve, place, token, self.pacer.epoch,
                        since, now + wait, guard=spot, room=room and spot is None and self.full)  # fmt: skip

    def limit_of(self, tenant: str | None, now: float) -> tuple[TokenPacer, float]:
        """The bucket an admitted response's rate-limit fields show (this gate's), and its rate."""
        return self.pacer, self.pacer.rate

    def _shut(self, cost: float, now: float, reserve: float) -> bool:
        """Nothing of a class that leaves ``reserve`` of a burst goes in now: the in-flight limit is reached
        (:attr:`full`), or in a tenants' pool the replica's bucket (:attr:`guard`) has not ``cost`` tokens beyond
        that part of its burst (a sheddable request in one pool takes no token the replica keeps for another's)."""
        guard = self._guard
        return self.full or (guard is not None and guard.tokens(now) + guard.rate * DUE_SLACK  # (rounding)
                             < cost + reserve * guard.burst)  # fmt: skip

    def _reserve_room(self, cost: float, now: float, since: float, reserve: float) -> tuple[float, float] | None:
        """A request whose own token is due, in a tenants' pool whose replica's bucket (:attr:`guard`) is short (the
        pools spent more than μ between them), reserves its token there, behind those held before it: (its place,
        seconds until it is due), if that comes within the hold's window; None otherwise, or with no such bucket, or
        no room in flight (held in turn so; polled for, holds lost their tokens to the requests arriving at each
        instant and were turned away at their windows' ends). None too for a class that leaves part of a burst
        (``reserve``): a reservation charges the bucket at once, and the classes above it would find no more there;
        it is held for room instead, and goes in once the bucket holds its token beyond that part (see :meth:`_shut`),
        or is turned away at its window's end."""
        guard = self._guard
        if guard is None or self.full or reserve:
            return None
        window = max(0.0, self.max_pacing_delay + DUE_SLACK - (now - since))
        place = guard.reserve(cost, now, window)
        return None if place is None else (place, guard.due_in(place, now))

    def _room_left(self, decision: Decision, now: float) -> bool:
        """A hold waiting for room may wait ``room_wait`` more: within its window, and a waiter's slot free."""
        wait = self.tuning.room_wait
        return now - decision.since + wait <= self.room_hold + DUE_SLACK and self.waiters < self.max_waiters

    def _let_in(self, cost: float, now: float) -> Decision:
        """A request goes in: charged to the replica's bucket too, in a tenants' pool (see :attr:`guard`)."""
        guard = self._guard
        if guard is not None:
            guard.charge(cost, now)
        return ADMITTED

    def _in(self, decision: Decision, token: float, now: float) -> Decision:
        """A hold whose token (of the current epoch) is due: in if there is room (in flight, and in a tenants' pool
        a token in the replica's bucket, :attr:`guard`); else held on for room while its hold stays within
        ``max_pacing_delay`` (for the replica's bucket: its token reserved there, in turn; see :meth:`end_hold`), or
        placed at the head of the schedule, its token given back to the bucket (up to its size: a token due and
        unclaimed is a token in the bucket, so the bound ``rate·t + burst`` holds; left unused, every hold the
        limit turned away was capacity lost for good)."""
        if not self._shut(decision.cost, now, decision.reserve):
            return self._let_in(decision.cost, now)
        reserved = (self._reserve_room(decision.cost, now, decision.since, decision.reserve)
                    if self.waiters < self.max_waiters else None)  # fmt: skip
        if reserved is not None:
            place, due = reserved
            self.waiters += 1
            return dataclasses.replace(decision, delay=min(due, self.recheck), token=token, epoch=self.pacer.epoch,
                                       until=now + due, guard=place)  # fmt: skip
        if self._room_left(decision, now):  # (for room in flight: woken when it may have come; else it polls)
            self.waiters += 1
            full = self.full
            delay = self.room_hold - (now - decision.since) if full else self.tuning.room_wait
            return dataclasses.replace(decision, delay=delay, token=token, epoch=self.pacer.epoch, until=now,
                                       room=full)  # fmt: skip
        self.pacer.give(decision.cost, now)
        return self._requeue(decision.key, decision.cost, decision.reserve, now)

    def _requeue(self, key: Hashable | None, cost: float, reserve: float, now: float) -> Decision:
        """A hold turned away (no room in flight within its window, or its token would now come too late): the next
        place in the schedule, as a request that found no token is given, held while a herd lands (:meth:`_unheard`).
        (At the head, a crowd turned away at once, as a herd held for room at an unknown capacity is, was told one
        second all together.)"""
        place = (self._new_place(key, cost, now, 0.0), cost, now)
        return self._unheard(key, place, cost, reserve, now, now) or self._reject(key, place, now, early=False)

    def _reject(self, key: Hashable | None, place: Place, now: float, early: bool) -> Decision:
        """Tell ``key`` when its place will be due (forecast), book it, and hold the 429 if it came early."""
        schedule, stats = self.schedule, self.stats
        work = place[0] - schedule.head(now)  # tokens ahead of this place
        promise = self._promise
        # (no capacity measured yet: ask again in a second, when it will be, and keep the place)
        seconds = forecast(work / promise, self.growth) if self.known else self.lead + 1.0
        if self._peak > 0 and self._level > 0 and (self.collapsed or self._level < self.tuning.collapse * self._peak):
            at_peak = work / (self._peak * promise / self._level)  # (this replica's part of it)
            # In an outage, capacity may come back at any moment. Otherwise μ stands and H does not: new arrivals
            # take μ (closed-loop clients count as new), in a spike or sustained overload, which cannot be told
            # apart now. Told their places at H's floor, clients turned away in a 4 s spike at 1.5 μ were told up to
            # 61 s and the service stood idle from 7 to 31 s; told at the peak (as in an outage), a busy tenant's
            # clients asked every second. At the peak, but not sooner than a λ_new window (by then λ_new is measured
            # anew), until the overload has lasted long enough for the peak to fade to 1/`collapse` of H.
            # A low H that began with μ cut (in a tenants' pool, its share cut as other tenants woke: it comes back as
            # they drain) is waited out at the peak, as an outage is (floored, a herd in a pool after its replica's
            # outage drained in 77 s where 66 s does, and a herd across 100 tenants at 1.179 of its bound in one
            # seed of three, against 1.085).
            struck = self.collapsed or self._struck
            seconds = min(seconds, at_peak if struck else max(self._new.span, at_peak))
        retry_after = max(1, math.ceil(seconds - self.lead - CEIL_SLACK))
        if retry_after > self._cap:
            retry_after = self._overflow(retry_after)
        hold = 0.0
        if early:
            stats.early += 1
            if self.tarpit and retry_after > 1 and self.tarpitted < self.max_tarpitted:
                hold = min(self.tarpit, retry_after - 1)  # what is held comes off the wait it is told
                retry_after = math.ceil(retry_after - hold)
                self.tarpitted += 1
        told = now + hold + retry_after
        if key is None or isinstance(key, Stranger):  # (back then as a new request, unless its ticket comes back)
            self._new.told(told)
        self._strays.add(key, told, now)  # (if its client may come back under another key: a key of its kind claims it)
        if key is not None:
            schedule.hold(key, (place[0], place[1], told), now)
        stats.rejected += 1
        return Decision(Verdict.REJECT, hold, retry_after, schedule.rate, key)

    def end_hold(self, decision: Decision, now: float, gone: bool = False) -> Decision | None:
        """A hold is over at ``now``: what next. ``gone``: the client went away while held.

        After the tarpit, the same rejection (send it). After pacing: ADMITTED once the request's token exists or its
        place in the schedule is due. A wake-up before the end of the wait it was given (:attr:`Decision.until`) holds
        it on otherwise. If the rate or H fell while it was held, it reserves again (or waits on for its place) while
        its total hold stays within ``max_pacing_delay``, else it is rejected, with a place at the head of the schedule
        or its own place kept. None if the client went away (its token, of the current epoch and reserved last, is
        refunded). The rate is refreshed first when due: a herd held at once is decided again only at its wake-ups."""
        if decision.verdict is Verdict.REJECT:
            self.tarpitted -= 1
            return dataclasses.replace(decision, delay=0.0)
        if now >= self.next_refresh:  # (a tenant's pool whose clients are all held reads its share only here)
            self.refresh(now)
        if decision.landing:
            self.landing -= 1
        else:
            self.waiters -= 1
        token, pacer, guard = decision.token, self.pacer, self._guard
        current = decision.epoch == pacer.epoch
        if gone:
            self.stats.abandoned += 1
            if decision.guard is not None and guard is not None:  # (its place in the replica's bucket: given up)
                guard.release(decision.cost, now, decision.guard)
            if token is not None and current:
                if pacer.due_in(token, now) <= DUE_SLACK:  # due and unclaimed (held for room): back in the bucket,
                    pacer.give(decision.cost, now)  # as Gate._in gives it back (it holds no place others stand behind)
                else:
                    pacer.release(decision.cost, now, token)
            return None
        if decision.guard is not None and guard is not None:  # (its own token came due before: the replica's)
            return self._replica_due(decision, decision.guard, guard, now)
        if now < decision.until - DUE_SLACK and (token is None or current):
            return self._woken(decision, now)
        if token is None:  # a client held for its place
            return self._held(decision, now)
        if current:
            due = pacer.due_in(token, now)
        else:  # the rate was cut while it was held: reserve again, behind those reserved before it
            left = max(0.0, self.max_pacing_delay - (now - decision.since))
            token = pacer.reserve(decision.cost, now, left, decision.reserve * pacer.burst)
            if token is None:  # too long a wait now: a place in the schedule instead
                return self._requeue(decision.key, decision.cost, decision.reserve, now)
            due = pacer.due_in(token, now)
        if due <= DUE_SLACK:
            return self._in(decision, token, now)
        if due + (now - decision.since) <= self.max_pacing_delay + DUE_SLACK and self.waiters < self.max_waiters:
            self.waiters += 1
            return dataclasses.replace(decision, delay=min(due, self.recheck), token=token, epoch=pacer.epoch,
                                       until=now + due)  # fmt: skip
        # The rate fell (less than a deep cut) and its token would come too late: it takes a place in the schedule
        # instead. In a tenant's pool its place on the refill axis goes to the next request reserved (see
        # TokenPacer.release): there the rate moves with the shares, and each token left unused was capacity lost
        # (20 of a busy tenant's 70/s). Elsewhere the rate fell because the capacity is thought to have: its token
        # goes unused once, as a real bucket's would (reused, the live estimator's trials settled a doubled capacity
        # in 5.1 s, median of five seeds, against 4.6 s and the 5 s asked).
        if self.parent is not None:
            pacer.release(decision.cost, now, token)  # (this epoch's: reserved again above if it was not)
        return self._requeue(decision.key, decision.cost, decision.reserve, now)

    def _replica_due(self, decision: Decision, place: float, guard: TokenPacer, now: float) -> Decision:
        """A hold whose own token came due while the replica's bucket was short, its token reserved there at
        ``place``: in once that is due (with room in flight), held on within its window, else turned away."""
        due = guard.due_in(place, now)
        within = now - decision.since + due <= self.max_pacing_delay + DUE_SLACK
        if due > DUE_SLACK and within:  # (due later than it was: μ was cut since; held on within its window)
            self.waiters += 1
            return dataclasses.replace(decision, delay=min(due, self.recheck), until=now + due)
        if due <= DUE_SLACK and not self.full:
            return ADMITTED
        if due <= DUE_SLACK and self._room_left(decision, now):
            self.waiters += 1  # (no room in flight now: held on for it, its tokens kept, as _in holds)
            return dataclasses.replace(decision, delay=self.tuning.room_wait)
        # Beyond its window (μ cut while it waited, or no room in flight): its places given up, and a place at
        # the head of the schedule instead. (Held on, a cut to a twentieth kept holds 6.5 s in a 1.5 s window.)
        guard.release(decision.cost, now, place)
        self.pacer.give(decision.cost, now)
        return self._reject(decision.key, (self.schedule.head(now), decision.cost, now), now, early=False)

    def _woken(self, decision: Decision, now: float) -> Decision:
        """A hold woken before the end of the wait it was given (see ``tuning.recheck``): in if its token exists or
        its place is due at the rate in force, else held on to the end of that wait, where it is judged as a hold
        that slept it out. A wake-up only brings a hold in sooner: judged on the rate of a moment (a live
        estimator's drain, a tenant's share between reallocations, a shared budget's grant), the tail of a
        pacing queue was turned away at a dip its tokens would have ridden out, and a returner held through a
        drain was sent away before the lead let it in at its window's end."""
        if decision.token is None:  # a returning client held for its place
            assert decision.key is not None and decision.place is not None
            due = self.schedule.due_in(decision.place[0], now)
            if due <= DUE_SLACK:
                return self._turn(decision.key, decision.place, decision.cost, decision.reserve, now, decision.since)
        else:
            due = self.pacer.due_in(decision.token, now)
            if due <= DUE_SLACK:
                return self._in(decision, decision.token, now)
        self.waiters += 1
        return dataclasses.replace(decision, delay=min(due, decision.until - now, self.recheck))

    def __repr__(self) -> str:
        return f"Gate({self.pacer!r}, {self.schedule!r}, waiters={self.waiters})"
