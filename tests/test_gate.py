"""The gate's one admission sequence (admit, end_hold) on an injected clock."""

import heapq
import itertools
import logging
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import ConfigError, Settings
from admitgate.core.gate import ADMITTED, Decision, Gate, Verdict
from admitgate.core.ledger import Parent
from admitgate.core.pacer import TokenPacer
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.core.probes import Probes
from admitgate.core.source import RateReading, StaticCapacity
from admitgate.core.tuning import GATE
from admitgate.limit.capacity import LiveCapacity
from admitgate.limit.estimators import Static

DEFAULT = DEFAULT_CLASSES["default"]
COLLAPSE, RECHECK, ROOM_WAIT, SPARE = GATE.collapse, GATE.recheck, GATE.room_wait, GATE.spare
CRITICAL = DEFAULT_CLASSES["critical"]
SHEDDABLE = DEFAULT_CLASSES["sheddable"]


def admit(g: Gate, now: float, key=None, cost: float = 1.0, priority=DEFAULT):
    return g.admit(cost, priority, now, lambda: key)


class Rate:
    """A capacity source whose rate a test sets by hand."""

    def __init__(self, rate: float) -> None:
        self.value = rate

    def rate(self, now: float) -> float:
        return self.value


def warm(g: Gate, seconds: int, new_per_second: int = 0, start: float = 0.0) -> float:
    """Run whole seconds of steady new traffic (so λ_new has its history); return the time reached."""
    now = start
    for second in range(seconds):
        for i in range(new_per_second):
            now = start + second + i / new_per_second
            d = admit(g, now)
            while d.delay:
                d = g.end_hold(d, now + d.delay)
        now = start + second + 1
        g.refresh(now)
    return now


def serve(g: Gate, holds: list[Decision], now: float, rates: tuple[tuple[float, Rate, float], ...] = ()
          ) -> list[tuple[Decision, float]]:  # fmt: skip
    """Follow every hold through its wake-ups in time order (each wake-up calls ``end_hold``, as the
    middleware's and the simulator's hold loops do): each one's last decision and when it came, in order.
    ``rates``: (time, source, value): the source reads ``value`` from that time on (the gate refreshes then)."""
    out: list[tuple[Decision, float]] = [(d, now) for d in holds]
    heap = [(now + d.delay, i) for i, d in enumerate(holds) if d.delay]
    heapq.heapify(heap)
    changes = sorted(rates, key=lambda change: change[0])
    while heap:
        at, i = heapq.heappop(heap)
        while changes and changes[0][0] <= at:
            when, source, value = changes.pop(0)
            source.value = value
            g.next_refresh = when
            g.refresh(when)
        d = g.end_hold(out[i][0], at)
        out[i] = (d, at)
        if d is not None and d.verdict is Verdict.PACE and d.delay:
            heapq.heappush(heap, (at + d.delay, i))
    return out


def test_admit_then_pace_then_reject() -> None:
    g = Gate(10, Settings(burst=2, max_pacing_delay=0.25), now=0.0)
    assert admit(g, 0.0).verdict is Verdict.ADMIT and admit(g, 0.0).verdict is Verdict.ADMIT
    d1, d2 = admit(g, 0.0), admit(g, 0.0)
    assert (d1.verdict, d1.delay) == (Verdict.PACE, pytest.approx(0.1))
    assert (d2.verdict, d2.delay) == (Verdict.PACE, pytest.approx(0.2))
    d3 = admit(g, 0.0)
    assert d3.verdict is Verdict.REJECT and d3.retry_after == 1 and d3.delay == 0
    assert g.waiters == 2 and g.stats.paced == 2 and g.stats.rejected == 1
    assert g.end_hold(d1, 0.1).verdict is Verdict.ADMIT and g.waiters == 1


def test_identify_is_called_only_when_the_answer_matters() -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=0), now=0.0)
    calls = []

    def who():
        calls.append(1)
        return "a"

    assert g.admit(1, DEFAULT, 0.0, who).verdict is Verdict.ADMIT and not calls  # nobody holds a place
    assert g.admit(1, DEFAULT, 0.0, who).verdict is Verdict.REJECT and calls == [1]
    g.admit(1, DEFAULT, 5.0, who)  # now someone holds a place: an admitted request is identified too
    assert calls == [1, 1]


def test_waiter_bound() -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=5, max_waiters=1), now=0.0)
    admit(g, 0.0)
    held = admit(g, 0.0)
    assert held.verdict is Verdict.PACE
    assert admit(g, 0.0).verdict is Verdict.REJECT
    g.end_hold(held, held.delay)
    assert admit(g, 0.1).verdict is Verdict.PACE


def test_a_client_gone_while_paced_gives_its_token_back() -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=1), now=0.0)
    admit(g, 0.0)
    held = admit(g, 0.0)
    assert g.end_hold(held, 0.05, gone=True) is None
    assert g.waiters == 0 and g.stats.abandoned == 1
    assert g.pacer.tokens(0.05) == pytest.approx(0.5)
    assert admit(g, 0.05).delay == pytest.approx(0.05)  # first in the queue again


def test_clients_gone_while_paced_ahead_of_others_leave_their_tokens_unused_not_shared() -> None:
    """A token handed back while reservations stand behind it would be reserved again at a place one of them
    holds (the bucket's count says one more is free, their places on the refill axis do not move): two
    requests would go in on one token. Only the newest reservation gives its token back."""
    g = Gate(10, Settings(burst=1, max_pacing_delay=1), now=0.0)
    admit(g, 0.0)
    held = [admit(g, 0.0) for _ in range(10)]  # tokens due at 0.1, 0.2, ... 1.0
    assert [d.verdict for d in held] == [Verdict.PACE] * 10
    for d in held[:5]:  # the first five go away at once
        assert g.end_hold(d, 0.05, gone=True) is None
    late = [admit(g, 0.05) for _ in range(5)]
    ends = sorted([d.delay for d in held[5:]] + [0.05 + d.delay for d in late if d.verdict is Verdict.PACE])
    for i, end in enumerate(ends):  # whatever went in, at most rate·t + burst over every interval
        for j in range(i, len(ends)):
            assert j - i + 1 <= 10 * (ends[j] - end) + 1 + 1e-9
    newest = admit(g, 0.5)  # nobody stands behind the newest reservation: its token does come back
    tokens = g.pacer.tokens(0.5)
    assert newest.verdict is Verdict.PACE and g.end_hold(newest, 0.5, gone=True) is None
    assert g.pacer.tokens(0.5) == pytest.approx(tokens + 1)


def test_retry_after_leads_the_place_by_up_to_one_second() -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=0), now=0.0)
    admit(g, 0.0)
    # no pacing: lead 0, so Retry-After = ceil(due); 25 places at 10/s from now
    told = [admit(g, 0.0).retry_after for _ in range(25)]
    assert told[:3] == [1, 1, 1] and told[-1] == 3
    g2 = Gate(10, Settings(burst=1, max_pacing_delay=1.5, max_waiters=0), now=0.0)
    admit(g2, 0.0)
    assert [admit(g2, 0.0) for _ in range(25)][-1].retry_after == 2  # due at 2.5 s, told 0.5 s before


def test_a_cohort_rejected_at_once_comes_back_flat_at_h() -> None:
    rate, m = 180.0, 2000
    g = Gate(rate, Settings(burst=20, max_pacing_delay=1.5), now=0.0)
    verdicts, told = Counter(), Counter()
    for _ in range(m):
        d = admit(g, 0.0)
        verdicts[d.verdict] += 1
        if d.verdict is Verdict.REJECT:
            told[d.retry_after] += 1
    assert verdicts[Verdict.ADMIT] == 20 and verdicts[Verdict.PACE] == 270  # 1.5 s of tokens held
    assert max(told.values()) <= rate + 1
    assert all(told[s] >= rate - 1 for s in range(2, max(told)))  # a flat stream, no gaps
    assert max(told) == math.ceil((m - 20 - 270) / rate + 1.5) - 1  # the last place, less the 1 s lead


def test_lambda_new_is_measured_from_first_attempts_and_a_herd_is_not_new_traffic() -> None:
    g = Gate(200, Settings(burst=20, max_pacing_delay=1.5), now=0.0)
    now = warm(g, 6, new_per_second=20)
    assert g.new_rate() == pytest.approx(20, abs=1)
    assert g.headroom(now) == pytest.approx(200 - 20 - math.sqrt(20), abs=1)
    for i in range(2000):  # a herd within one second
        admit(g, now + i / 4000, key=i)
    now = warm(g, 2, new_per_second=20, start=math.floor(now) + 1)
    assert g.new_rate() == pytest.approx(20, abs=1)  # the median of five seconds leaves the herd's second out


def test_critical_traffic_is_admitted_charged_and_counted_as_new() -> None:
    g = Gate(100, Settings(burst=10, max_pacing_delay=0), now=0.0)
    for i in range(400):  # 20 critical requests/s for 20 s
        assert admit(g, i * 0.05, priority=CRITICAL).verdict is Verdict.ADMIT
    g.refresh(20.0)
    assert g.new_rate() == pytest.approx(20.0, abs=1)
    for _ in range(20):
        admit(g, 20.0, priority=CRITICAL)
    assert g.pacer.tokens(20.0) == -10.0  # critical drove the bucket to its floor
    assert admit(g, 20.0).verdict is Verdict.REJECT


def test_sheddable_class_is_shed_before_default() -> None:
    g = Gate(10, Settings(burst=10, max_pacing_delay=0), now=0.0)
    assert sum(admit(g, 0.0, priority=SHEDDABLE).verdict is Verdict.ADMIT for _ in range(10)) == 5
    assert sum(admit(g, 0.0).verdict is Verdict.ADMIT for _ in range(10)) == 5


def test_a_returning_client_is_held_until_its_place_and_then_admitted() -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=1.5, max_waiters=0), now=0.0)
    admit(g, 0.0)
    for _ in range(30):  # others hold the first places
        admit(g, 0.0)
    first = admit(g, 0.0, key="a")  # due 3.1 s from now, told 3 (the lead)
    assert first.retry_after == 3
    g.max_waiters = 100
    assert admit(g, 3.0).verdict is Verdict.ADMIT  # someone takes the token the bucket has refilled
    back = admit(g, 3.0, key="a")
    assert back.verdict is Verdict.PACE and back.delay == pytest.approx(0.1)
    assert g.end_hold(back, 3.1).verdict is Verdict.ADMIT
    assert g.schedule.place_of("a", 3.1) is None and g.stats.scheduled == 1


class Draining(Rate):
    """A live source draining a queue: it believes in ``capacity`` and sets the pacer lower for a while."""

    probes = None

    def __init__(self, rate: float, capacity: float) -> None:
        super().__init__(rate)
        self.capacity = capacity

    def read(self, now: float) -> RateReading:
        return RateReading(self.value, self.capacity)

    def state(self) -> None:
        return None


def draining_with_places() -> Gate:
    """A gate draining at 50/s (H from the belief: 200/s, a 1 s window) where keys 0-199 hold places."""
    g = Gate(Draining(50.0, 200.0), Settings(burst=1, max_pacing_delay=1.0, max_waiters=0, growth=0.0), now=0.0)
    admit(g, 0.0)
    for i in range(200):
        admit(g, 0.0, key=i)
    g.max_waiters = 100
    return g


def test_a_returner_held_through_its_window_and_due_within_the_lead_is_let_in_not_sent_away() -> None:
    g = draining_with_places()
    assert g.schedule.place_of(75, 0.0)[0] - g.schedule.head(0.0) == pytest.approx(75, abs=1)
    held = admit(g, 0.0, key=75)  # 1.5 s away at the head's pace (50/s), 0.375 s at the promise (200/s)
    assert held.verdict is Verdict.PACE and held.delay == pytest.approx(RECHECK)  # (a live rate: it looks again)
    # At the window's end its place is 0.5 s away. Sent away, it would be back in a second (after its place
    # was passed, its token unused); it is let in at its turn instead, within what the bucket refilled.
    [(after, at)] = serve(g, [held], 0.0)
    assert after.verdict is Verdict.ADMIT and at == pytest.approx(1.0)  # the whole window, at most
    assert g.schedule.place_of(75, 1.0) is None and g.stats.scheduled == 1
    # One 180 places out is held too (0.9 s at the promise), but at the window's end its place is still
    # 2.6 s away (130 places at 50/s), past the lead: it is told to come back, and keeps its place.
    far = admit(g, 1.0, key=179)
    assert far.verdict is Verdict.PACE
    [(again, at)] = serve(g, [far], 1.0)
    assert again.verdict is Verdict.REJECT and at == pytest.approx(2.0) and g.schedule.place_of(179, 2.0) is not None
    assert g.stats.pacing.counts and sum(g.stats.pacing.counts) == 2  # a hold is counted once, not per wake-up


def test_a_returner_held_through_a_drain_is_not_sent_away_by_a_wake_up_before_its_window_ends() -> None:
    g = draining_with_places()
    held = admit(g, 0.0, key=95)  # 1.9 s away at the head's pace (50/s), 0.475 s at the promise (200/s)
    assert held.verdict is Verdict.PACE
    # At 0.75 s it is 0.29 s away at the promise with 0.25 s of its window left, and 1.15 s away at the head's
    # pace: past the lead. At its window's end it is 0.9 s away, within the lead: in, as a hold that slept
    # its window out was. (Judged at that wake-up, it was told to come back and lost its turn.)
    [(after, at)] = serve(g, [held], 0.0)
    assert after.verdict is Verdict.ADMIT and at == pytest.approx(1.0)
    assert g.schedule.place_of(95, 1.0) is None and g.stats.scheduled == 1 and g.waiters == 0


def test_an_early_returner_is_tarpitted_keeps_its_place_and_the_horizon_stays() -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=0.5, max_waiters=0), now=0.0)
    admit(g, 0.0)
    for _ in range(30):
        admit(g, 0.0)
    first = {k: admit(g, 0.0, key=k) for k in ("a", "b", "c")}
    place = g.schedule.place_of("a", 0.0)
    horizon = g.schedule.horizon(0.0)
    d = admit(g, 0.05, key="a")  # "a" ignores Retry-After and hammers
    assert d.verdict is Verdict.REJECT and d.delay == 1.0  # its 429 is held a second (the tarpit)...
    assert d.retry_after == first["a"].retry_after - 1  # ... which comes off what it is told
    assert g.schedule.place_of("a", 0.05)[0] == place[0]  # same place
    assert g.schedule.horizon(0.0) == horizon and g.stats.early == 1 and g.tarpitted == 1
    assert g.end_hold(d, 1.05).delay == 0 and g.tarpitted == 0


def test_a_rising_estimate_pulls_the_horizon_in() -> None:
    h = Rate(100.0)
    g = Gate(h, Settings(burst=10, max_pacing_delay=0, refresh_interval=0.1, growth=0.0), now=0.0)
    for _ in range(10):
        admit(g, 0.0)
    told = [admit(g, 0.0, key=i).retry_after for i in range(500)]
    assert max(told) == 5  # 500 places at 100/s
    h.value = 250.0
    g.refresh(0.1)
    # the same 500 places (the first due once the bucket has a token, 0.01 s out), due sooner
    assert g.schedule.horizon(0.1) == pytest.approx((1 + 500 - 100 * 0.1) / 250)
    g.pacer.try_take(g.pacer.tokens(0.1), 0.1)  # others take what the bucket refilled
    assert admit(g, 0.1, key="late").retry_after == 2  # a newcomer's place is due 2 s out, not 5


def test_a_falling_estimate_tells_returners_again_and_they_keep_their_places() -> None:
    h = Rate(100.0)
    g = Gate(h, Settings(burst=10, max_pacing_delay=1.5, max_waiters=0, growth=0.0), now=0.0)
    for _ in range(10):
        admit(g, 0.0)
    for i in range(400):
        admit(g, 0.0, key=i)
    place = g.schedule.place_of(100, 0.0)
    assert place[2] == pytest.approx(1.0)  # client 100 (due 1.01 s out) was told to come back at 1 s
    h.value = 20.0  # capacity falls to a fifth
    g.refresh(0.1)
    g.max_waiters = 1000
    g.pacer.try_take(g.pacer.tokens(1.0), 1.0)  # others take what the bucket refilled
    again = admit(g, 1.0, key=100)  # back on time: its place is now 3.65 s away, so it is told again
    assert again.verdict is Verdict.REJECT and again.delay == 0  # not an ignorer: no tarpit
    assert g.schedule.place_of(100, 1.0)[0] == place[0]  # it keeps its place...
    g.max_waiters = 0  # (no pacing: the newcomer gets a place)
    newcomer = admit(g, 1.0, key="new")
    assert g.schedule.place_of("new", 1.0)[0] > place[0]  # ... and newcomers still queue behind it
    assert again.retry_after < newcomer.retry_after


def test_after_a_collapse_clients_are_told_when_they_would_be_due_at_the_recent_peak() -> None:
    h = Rate(200.0)
    g = Gate(h, Settings(burst=20, max_pacing_delay=1.5, max_waiters=0, growth=0.0), now=0.0)
    warm(g, 2)
    h.value = 1.0  # an outage
    g.refresh(2.5)
    told = [admit(g, 2.5, key=i).retry_after for i in range(1000)]
    assert max(told) <= 5  # not 1000 s: 1,000 places at the peak of ~200/s, less the lead


@pytest.mark.parametrize("live", [False, True])
def test_new_arrivals_taking_the_capacity_are_no_outage(live: bool) -> None:
    """Closed-loop clients count as new arrivals: at λ_new near μ, H falls to its floor while μ stands. That is no
    outage (told at the peak, 1 s, such clients asked every second); nor can it be told from a spike, so a client
    whose place is far down the schedule is told when it would be due at the peak, but not sooner than a λ_new
    window. Once the overload has lasted long enough for the peak of H to fade, clients are told their places."""
    source = LiveCapacity(Static(100.0)) if live else 100.0
    g = Gate(source, Settings(burst=5, max_pacing_delay=1.5, max_waiters=0, growth=0.0), now=0.0)
    now = warm(g, 10, new_per_second=96)
    assert g.headroom(now) == pytest.approx(5.0) and not g.collapsed  # (μ·MIN_SHARE: 100 − 96 − √96 < 5)
    g.pacer.try_take(g.pacer.tokens(now), now)  # the busy tenant's clients took what the bucket refilled
    told = [admit(g, now, key=i).retry_after for i in range(50)]
    window = g.settings.new_window
    assert max(told) == math.ceil(window - g.lead)  # not 9 s (50 places at 5/s, less the lead), nor 1 (the peak)
    assert told[:20] == [math.ceil(max(1, (i + 1) / 5 - g.lead)) for i in range(20)]  # due sooner: told by H now
    # 90 s more of it: sustained (the peak stands for 30 s, then fades from about 95/s to 4 × H in 47 s)
    now = warm(g, 90, new_per_second=96, start=now)
    g.pacer.try_take(g.pacer.tokens(now), now)
    work = g.schedule.backlog(now)
    told = [admit(g, now, key=("late", i)).retry_after for i in range(100)]
    assert max(told) == math.ceil((work + 100) / g.promise - g.lead) > window  # where the places are


def test_the_clients_of_a_spike_of_new_arrivals_are_in_soon_after_it() -> None:
    """A 4 s spike of first tries at 1.5 μ: λ_new reads it as sustained overload for seconds after it ends, and H
    sits at its floor. Told their places at that floor (up to 61 s), its clients left the service idle from 7 to 31 s;
    told at the peak but not sooner than a λ_new window, they are all in within two after the spike ends (one for
    λ_new to forget it, one at most to be told again; every client obeys Retry-After)."""
    g = Gate(100.0, Settings(growth=0.0), now=0.0)
    events = [(2 + i / 150, i) for i in range(600)]
    heapq.heapify(events)
    admitted: dict[int, float] = {}
    while events:
        now, key = heapq.heappop(events)
        d = admit(g, now, key=key)
        while d.delay:
            now += d.delay
            d = g.end_hold(d, now)
        if d.verdict is Verdict.ADMIT:
            admitted[key] = now
        else:
            heapq.heappush(events, (now + d.delay + d.retry_after, key))
    assert len(admitted) == 600
    assert max(admitted.values()) <= 6 + 2 * g.settings.new_window  # 13.0 s (told at H's floor: 61 s)


def test_an_outage_ends_a_new_arrivals_window_after_the_capacity_is_back() -> None:
    """A herd arriving through an outage is new arrivals in λ_new's median for seconds after μ returns, and H reads
    low until they are out of it: its clients are told at the peak until then, not at H's floor."""
    h = Rate(200.0)
    g = Gate(h, Settings(burst=20, max_pacing_delay=1.5, max_waiters=0, growth=0.0), now=0.0)
    now = warm(g, 2, new_per_second=20)
    peak = 200.0  # the peak of H before the outage, as the warm-up leaves it (its new arrivals not yet in λ_new)
    h.value = 1.0  # an outage, through which a herd arrives: 150 first tries a second for 5 s
    for second in range(5):
        for i in range(150):
            admit(g, now + second + i / 150, key=(second, i))
        g.refresh(now + second + 1)
    assert g.collapsed
    h.value = 200.0  # back
    now += 5.2
    g.refresh(now)
    assert g.collapsed and g.headroom(now) < COLLAPSE * peak  # λ_new still reads the herd
    work = g.schedule.backlog(now)
    told = admit(g, now, key="late").retry_after
    assert told <= math.ceil((work + 1) / peak - g.lead)  # at the peak, not at H's floor
    for step in range(1, 60):  # a λ_new window later it is over
        g.refresh(now + step / 10)
    assert not g.collapsed


class Lease:
    """A shared budget as the gate sees it (:class:`~admitgate.core.budget.Budget`), its figures set by hand: the
    fleet's μ, and this replica's share of the fleet's H (None: no lease yet)."""

    def __init__(self, fleet_rate: float) -> None:
        self.local_rate: float | None = None
        self.fleet_rate: float | None = fleet_rate
        self.share: float | None = None

    def overdue(self, now: float) -> None:
        pass

    def headroom(self, backlog: float) -> float | None:
        return self.share

    def unsettled(self, backlog: float) -> bool:
        return False


class Landing(Lease):
    """A shared budget whose fleet's backlog is still landing until ``landing`` is set False."""

    def __init__(self, fleet_rate: float) -> None:
        super().__init__(fleet_rate)
        self.landing = True

    def unsettled(self, backlog: float) -> bool:
        return self.landing


def test_a_herd_held_while_it_lands_on_the_fleet_leaves_the_pacing_slots_and_is_told_once_it_has_landed() -> None:
    """A herd of 100 lands on a replica (``max_waiters`` 20) while the fleet's backlog lands: its new places are
    held apart from the pacing holds, so a request whose token comes within the pacing window is still paced for it
    (counted among them, a herd of 3,500 took every slot, and such requests were told to come back). When the
    budget finds the backlog landed the gate wakes every held place, and each is told by its share of the fleet's H,
    none of those told sent back in the same second as more than that share."""
    g = Gate(100.0, Settings(burst=1, max_pacing_delay=0.5, max_waiters=20, growth=0.0), now=0.0)
    now = warm(g, 2) + g.refresh_interval
    lease = Landing(100.0)
    lease.share = 20.0  # (a fifth of the fleet's H: the others hold four times as many places)
    g.backend = lease
    g.refresh(now)
    assert g.schedule.rate == 20.0
    woken: list[int] = []
    herd = [admit(g, now, key=i) for i in range(100)]
    held = [d for d in herd if d.landing]
    assert len(held) >= 75 and g.landing == len(held) and g.waiters == 20
    assert all(d.verdict is Verdict.PACE and d.delay > 0 for d in held)
    for k, d in enumerate(herd):
        if d.landing:
            assert d.place is not None
            g.wait_landing(lambda k=k: woken.append(k) is None, d.place[0])
    paced = [d for d in herd if d.verdict is Verdict.PACE and not d.landing]
    for d in paced:  # the paced holds go in at their tokens: their slots come free
        assert g.end_hold(d, d.until) is ADMITTED
    at = max(d.until for d in paced)
    assert admit(g, at, key="late").verdict is Verdict.PACE and g.waiters == 1  # paced for its token, not held
    assert not woken
    lease.landing = False
    g.landed()  # (as the shared budget does at a lease that finds the fleet's backlog landed)
    assert sorted(woken) == [k for k, d in enumerate(herd) if d.landing]
    told: Counter[int] = Counter()
    for d in held:
        after = g.end_hold(d, at)
        assert after is not None
        if after.verdict is Verdict.REJECT:
            told[int(at + after.retry_after)] += 1
    assert g.landing == 0
    assert sum(told.values()) >= 60 and max(told.values()) <= 1.2 * lease.share, sorted(told.items())


def test_before_a_shared_budgets_first_lease_clients_expect_the_recent_h_back() -> None:
    """Until its first lease a replica is granted nothing (the pacer paused), so its promise is 0: that time is an
    outage, and a herd is told at the peak of H (at a rate of 0 it was folded under the cap: told 1-3599 s). It ends
    with the first lease, and then the fleet's μ is judged: this replica's share of H falls whenever a herd lands on
    the others, and that is no outage."""
    g = Gate(400.0, Settings(burst=1, max_pacing_delay=0, growth=0.0), now=0.0)
    warm(g, 2)
    lease = Lease(400.0)
    g.backend = lease
    g.pacer.set_grant(0.0, 2.0)  # (as RedisBudget.attach does)
    g.refresh(2.1)
    assert g.collapsed
    told = [admit(g, 2.1, key=i).retry_after for i in range(2000)]
    assert max(told) == 5  # at the peak of H, the 400/s before: 2,000 / 400 s (no lead: max_pacing_delay=0)
    lease.share = 360.0  # the first lease
    g.refresh(2.2)
    assert not g.collapsed
    lease.share = 20.0  # a herd on the others: this replica's share of the fleet's H falls, the fleet's μ stands
    for i in range(20):
        g.refresh(2.3 + i / 10)
    assert not g.collapsed


def test_the_peak_an_outage_is_waited_out_at_does_not_fade_while_the_outage_lasts() -> None:
    h = Rate(200.0)
    g = Gate(h, Settings(burst=20, max_pacing_delay=1.5, max_waiters=0, growth=0.0), now=0.0)
    warm(g, 2)
    h.value = 1.0  # an outage, 10 s long so far
    for i in range(100):
        g.refresh(2.1 + i / 10)
    told = [admit(g, 12.0, key=i).retry_after for i in range(2000)]
    # the capacity before the outage is the best guess for after it: 2,000 / 200 s, told the lead (1 s) early;
    # faded over 10 s it would be ~40 % more (13)
    assert max(told) == 9
    for i in range(300):  # 30 s more: a collapse that lasts is believed at last, and the peak fades
        g.refresh(12.1 + i / 10)
    g.pacer.try_take(g.pacer.tokens(42.0), 42.0)  # others take what the bucket refilled
    work = g.schedule.backlog(42.0)
    assert admit(g, 42.0, key="late").retry_after > math.ceil(work / 200 - g.lead)  # later than at the peak


def test_the_cap_never_hands_one_value_to_a_crowd(caplog) -> None:
    g = Gate(10, Settings(burst=1, max_pacing_delay=0, max_retry_after=10), now=0.0)
    admit(g, 0.0)
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        told = Counter(admit(g, 0.0, key=i).retry_after for i in range(1000))
    assert set(told) == set(range(1, 11))
    assert max(told.values()) <= math.ceil(1000 / (10 * 10)) * 10  # the fewest any spread within 10 s allows
    assert g.stats.overflow == 1000 - 100
    assert len([r for r in caplog.records if "max_retry_after" in r.getMessage()]) == 1  # logged once


def test_new_requests_during_a_herd_are_paced_not_sent_away() -> None:
    g = Gate(200, Settings(burst=20, max_pacing_delay=1.5), now=0.0)
    now = warm(g, 6, new_per_second=20)
    for i in range(2000):
        admit(g, now, key=i)
    later = now + 3.0  # the standing-queue rule would only pace them for 0.1 s: they are no flood
    verdicts = Counter(admit(g, later + i / 20).verdict for i in range(20))
    assert verdicts[Verdict.REJECT] == 0


def test_new_requests_at_four_fifths_of_a_small_rate_are_no_flood_and_keep_their_whole_window() -> None:
    """New requests at 20/s on 25/s (a tenants' pool given a quarter more than it asks, as the newcomers' pool beside
    a herd across 100 tenants is): a burst above the mean makes a queue that stands half a second. Counted with
    H's allowance, λ_new + √λ_new = 24.5 of 25/s read as a flood, and the requests behind the burst were held
    50 ms at most and turned away (the new arrivals beside that herd: 0.90-0.96 served). New requests alone
    fill 80 % of the rate: a hold of its whole window serves them."""
    g = Gate(25, Settings(), now=0.0)
    now = warm(g, 6, new_per_second=20)
    burst = [admit(g, now) for _ in range(10)]  # ten at once, then on at 20/s: the debt is repaid at 5/s
    steady = [admit(g, now + (i + 1) / 20) for i in range(12)]
    assert all(d.verdict is Verdict.PACE for d in burst[3:] + steady)
    later = [admit(g, now + 0.65 + i / 20) for i in range(5)]  # the queue has stood 0.65 s
    assert g.new_rate() >= 19 and all(d.verdict is Verdict.PACE for d in later)
    assert min(d.delay for d in later) > g.fresh_pacing_delay


def test_under_a_flood_of_new_requests_a_standing_queue_gives_them_places() -> None:
    g = Gate(100, Settings(burst=1, max_pacing_delay=1.5, standing_queue=0.3, fresh_pacing_delay=0.1), now=0.0)
    now = 0.0
    for second in range(6):  # 300 new requests/s against 100/s
        for i in range(300):
            now = second + i / 300
            d = admit(g, now)
            if d.verdict is Verdict.PACE:
                g.end_hold(d, now + d.delay)
        g.refresh(second + 1.0)
    assert g.new_rate() >= 100
    early = admit(g, now)
    assert early.verdict is Verdict.REJECT  # standing and flooded: no long hold for a new request


def test_a_deep_rate_cut_makes_held_requests_reserve_again_and_turns_away_those_too_late() -> None:
    h = Rate(100.0)
    g = Gate(h, Settings(burst=1, max_pacing_delay=1.0, refresh_interval=0.1), now=0.0)
    admit(g, 0.0)
    held = [admit(g, 0.0, key=i) for i in range(100)]  # one second of reservations at 100/s
    assert all(d.verdict is Verdict.PACE for d in held) and g.pacer.due_in(held[-1].token, 0.0) == pytest.approx(1.0)
    h.value = 20.0
    g.refresh(0.1)  # the pacer's rate falls below half: a new epoch
    after = [d for d, _ in serve(g, held, 0.0)]
    verdicts = Counter(d.verdict for d in after)
    assert verdicts[Verdict.REJECT] > 50  # at 20/s most of them cannot be let in within their second
    admitted = [d for d in after if d.verdict is not Verdict.REJECT]
    assert len(admitted) <= 10 + 20 * 1.0  # what was due before the cut, then 20/s


def test_holds_go_in_when_a_risen_rate_brings_their_tokens_sooner_and_the_bucket_bound_stands() -> None:
    h = Rate(100.0)
    g = Gate(h, Settings(burst=1, max_pacing_delay=1.0, refresh_interval=0.1, growth=0.0), now=0.0)
    admit(g, 0.0)
    held = [admit(g, 0.0) for _ in range(100)]  # one second of reservations at 100/s
    assert all(d.verdict is Verdict.PACE and d.delay <= RECHECK for d in held) and held[-1].delay == RECHECK
    h.value = 400.0
    g.refresh(0.1)  # the estimate quadruples: the 90 tokens still to come exist 0.225 s later, not 0.9 s
    done = serve(g, held, 0.0)
    assert all(d.verdict is Verdict.ADMIT for d, _ in done)
    times = sorted(at for _, at in done)
    assert times[-1] == pytest.approx(0.1 + 90 / 400)  # woken at 0.25, held on to its token: where it slept to 1.0
    for at in times:  # every admission within the bucket's bound: rate·t + burst, at the rates in force
        assert sum(t <= at for t in times) <= 1 + 100 * min(at, 0.1) + 400 * max(0.0, at - 0.1) + 1e-9


def test_holds_read_a_risen_rate_at_their_wake_ups_when_no_new_request_comes_to_refresh_it() -> None:
    """A tenant's pool whose clients are all held (a herd that arrived at once) is decided again only at their
    wake-ups: its share, raised by a reallocation, was read at the next new request, and the herd went in at the
    pool's first rate while the estimator, seeing no queue, grew on (to 354/s against 200 in the simulator's
    tenant herd, which then drained at 1.15 of the bound, now 1.11)."""
    h = Rate(100.0)
    g = Gate(h, Settings(burst=1, max_pacing_delay=1.0, refresh_interval=0.1, growth=0.0), now=0.0)
    admit(g, 0.0)
    held = [admit(g, 0.0) for _ in range(100)]  # one second of reservations at 100/s
    h.value = 400.0  # nobody refreshes the gate: only the holds' wake-ups (from 0.25 s) come to it
    done = serve(g, held, 0.0)
    assert all(d.verdict is Verdict.ADMIT for d, _ in done)
    times = sorted(at for _, at in done)
    assert times[-1] == pytest.approx(0.1 + 90 / 400)  # read at the wake-up at 0.1 s: where it slept to 1.0


def test_a_returner_held_for_its_place_goes_in_when_a_risen_h_brings_its_place_due() -> None:
    h = Rate(100.0)
    g = Gate(h, Settings(burst=1, max_pacing_delay=2.0, max_waiters=0, refresh_interval=0.1, growth=0.0), now=0.0)
    admit(g, 0.0)
    for i in range(150):
        admit(g, 0.0, key=i)  # places told at 100/s
    g.max_waiters = 100
    place = g.schedule.place_of(120, 0.0)[0] - g.schedule.head(0.0)
    back = admit(g, 0.0, key=120)  # held: its place is due in about 1.2 s, within the window
    assert back.verdict is Verdict.PACE and back.token is None and back.delay == pytest.approx(RECHECK)
    h.value = 400.0
    g.refresh(0.1)
    [(after, at)] = serve(g, [back], 0.0)
    assert after.verdict is Verdict.ADMIT
    due = 0.1 + (place - g._room(100.0) * 0.1) / g._room(400.0)  # the head's move at the old H, then the new
    assert at <= due + RECHECK and at < place / g._room(100.0) - 0.5  # half a second or more sooner


def test_a_moment_s_dip_in_the_rate_turns_away_only_the_holds_whose_tokens_it_pushes_past_the_window() -> None:
    h = Rate(100.0)
    g = Gate(h, Settings(burst=1, max_pacing_delay=1.0, refresh_interval=0.1, growth=0.0), now=0.0)
    admit(g, 0.0)
    held = [admit(g, 0.0) for _ in range(100)]  # one second of reservations at 100/s
    # 70/s (a live estimator's drain, a tenant's share between reallocations) for 0.15 s: 4.5 tokens late.
    done = serve(g, held, 0.0, rates=((0.2, h, 70.0), (0.35, h, 100.0)))
    rejected = [at for d, at in done if d.verdict is Verdict.REJECT]
    # Tokens up to 95.5 exist by the window's end (1 s): the last five are turned away, no more. Judged at the
    # 0.25 s wake-up as if 70/s lasted, the last 24 were (their tokens lost), though 19 of them came in time.
    assert len(rejected) == 5 and g.waiters == 0
    assert rejected == pytest.approx([0.96, 0.97, 0.98, 0.99, 1.0])  # at the end of the wait each was given


def test_holds_on_a_typed_in_rate_sleep_their_whole_wait() -> None:
    g = Gate(100, Settings(burst=1, max_pacing_delay=1.0), now=0.0)
    admit(g, 0.0)
    held = [admit(g, 0.0) for _ in range(100)]
    assert held[-1].delay == pytest.approx(1.0) and g.recheck == math.inf  # nothing can bring it sooner
    assert [at for _, at in serve(g, held, 0.0)] == pytest.approx([d.delay for d in held])


def test_capacity_changes_are_pulled_on_the_refresh_cadence() -> None:
    class Ramp:
        def rate(self, now: float) -> float:
            return 10.0 + now

    g = Gate(Ramp(), Settings(burst=5, refresh_interval=0.5), now=0.0)
    g.refresh(0.1)
    assert g.pacer.rate == 10.0
    g.refresh(0.5)
    assert g.pacer.rate == 10.5
    assert Gate(StaticCapacity(3), Settings(burst=1), now=0.0).pacer.rate == 3.0  # a configured one, from the start


def bounded(rate: float, floor: float = 4.0, **settings) -> Gate:
    """A gate on a live capacity holding ``rate`` (an in-flight limit starting at ``floor``)."""
    return Gate(LiveCapacity(Static(rate), initial=rate, inflight_floor=floor), Settings(**settings), now=0.0)


def go_in(g: Gate, decision: Decision, now: float) -> Decision:
    """What the middleware does with an admitted request: it goes on to the app, in flight from ``now``."""
    if decision.verdict is Verdict.ADMIT:
        g.probes.admit(now)
    return decision


def test_nothing_goes_in_beyond_the_inflight_limit_and_each_answer_lets_two_more_in() -> None:
    """A herd on an idle service: four go in at once (the limit's floor) though the bucket holds 20 tokens; the
    rest are held for room. Each response served lets two more in (the limit grows by one: slow start)."""
    g = bounded(200.0, burst=20)
    first = [go_in(g, admit(g, 0.0, key=i), 0.0) for i in range(10)]
    assert [d.verdict for d in first] == [Verdict.ADMIT] * 4 + [Verdict.PACE] * 6
    held = [d for d in first if d.verdict is Verdict.PACE]
    assert all(d.room and d.delay == pytest.approx(g.room_hold) for d in held) and g.full  # (woken when room comes)
    again = [go_in(g, g.end_hold(d, ROOM_WAIT), ROOM_WAIT) for d in held]  # woken, nothing answered: held on
    assert all(d.verdict is Verdict.PACE and d.room and d.delay == pytest.approx(g.room_hold - ROOM_WAIT)
               for d in again)  # fmt: skip
    for _ in range(2):
        g.probes.complete(0.03, 200, 0.03)  # two answers: two places free, and the limit is six
    after = [go_in(g, g.end_hold(d, 2 * ROOM_WAIT), 2 * ROOM_WAIT) for d in again]
    assert Counter(d.verdict for d in after) == {Verdict.ADMIT: 4, Verdict.PACE: 2}
    assert g.probes.inflight == 6 == g.probes.limit
    assert admit(g, 2 * ROOM_WAIT).verdict is Verdict.PACE  # a new request finds no room either


def test_a_hold_that_finds_no_room_in_its_window_is_placed_at_the_head_of_the_schedule() -> None:
    """A service that stops answering: what is held for room is turned away with a place once its pacing window
    is spent, not let in; its token, due and unclaimed, goes back to the bucket (left unused, each hold the limit
    turned away was capacity lost for good, and a tenant's pacing queue stalled behind them)."""
    g = bounded(1.0, burst=10, max_pacing_delay=0.1)
    decisions = [go_in(g, admit(g, 0.0, key=i), 0.0) for i in range(6)]
    held = [d for d in decisions if d.verdict is Verdict.PACE]
    assert len(held) == 2 and g.pacer.tokens(0.0) == pytest.approx(4.0)  # four taken, two reserved
    done = serve(g, held, 0.0)
    assert all(d.verdict is Verdict.REJECT and d.retry_after >= 1 for d, _ in done)
    assert all(at <= 0.1 + 1e-9 for _, at in done) and g.waiters == 0
    assert g.probes.inflight == 4 and g.stats.rejected == 2
    assert g.pacer.tokens(0.1) == pytest.approx(4.0 + 2 + 0.1)  # the two given back, and 0.1 s of refill at 1/s


@pytest.mark.parametrize("max_pacing_delay", [0.0, 0.005])
def test_a_request_that_finds_no_room_is_held_no_longer_than_max_pacing_delay(max_pacing_delay: float) -> None:
    """max_pacing_delay 0 (pacing off): a request with a free token but no room in flight is turned away at once,
    with a place at the head and its token back in the bucket, never held; below ROOM_WAIT, it is held at most that
    long. (It was held ROOM_WAIT, 20 ms, whatever max_pacing_delay said, then turned away.)"""
    g = bounded(100.0, burst=10, max_pacing_delay=max_pacing_delay)
    for i in range(4):
        go_in(g, admit(g, 0.0, key=i), 0.0)
    d = admit(g, 0.0, key="late")
    if max_pacing_delay == 0:
        assert d.verdict is Verdict.REJECT and d.delay == 0 and d.retry_after >= 1 and g.waiters == 0
        at = 0.0
    else:
        [(d, at)] = serve(g, [d], 0.0)
        assert d.verdict is Verdict.REJECT and at <= max_pacing_delay + 1e-9 and g.waiters == 0
    assert g.pacer.tokens(at) == pytest.approx(6.0 + 100 * at)  # its token back in the bucket (and the refill)
    assert g.stats.rejected == 1 and g.probes.inflight == 4


def test_a_hold_for_room_whose_client_leaves_gives_its_due_token_back() -> None:
    """Three held for room, their tokens due; the first two clients leave. Their tokens are due and unclaimed, as a
    hold turned away finds its own (Gate._in): back in the bucket, whatever was reserved after them. (Refunded only
    while its place was the newest reservation's, the second went unused: 4 tokens at the end instead of 5.)"""
    g = bounded(1.0, burst=10)
    for i in range(4):
        go_in(g, admit(g, 0.0, key=i), 0.0)
    held = [admit(g, 0.0, key=f"h{i}") for i in range(3)]
    assert all(d.verdict is Verdict.PACE and d.room for d in held)
    assert g.pacer.tokens(0.0) == pytest.approx(3.0)
    assert g.end_hold(held[0], 0.01, gone=True) is None and g.end_hold(held[1], 0.01, gone=True) is None
    assert g.pacer.tokens(0.01) == pytest.approx(5.0 + 0.01) and g.waiters == 1


def test_critical_requests_are_never_held_for_room_in_flight() -> None:
    g = bounded(100.0, burst=10)
    for _ in range(4):
        go_in(g, admit(g, 0.0), 0.0)
    assert g.full
    assert all(admit(g, 0.0, priority=CRITICAL).verdict is Verdict.ADMIT for _ in range(3))


def test_an_inflight_floor_of_zero_and_a_typed_in_rate_have_no_inflight_limit() -> None:
    g = bounded(100.0, floor=0, burst=10)
    assert g.bound is None
    assert all(go_in(g, admit(g, 0.0), 0.0).verdict is Verdict.ADMIT for _ in range(10))
    typed = Gate(100, Settings(burst=10), now=0.0)
    typed.probes = Probes(now=0.0)  # as the middleware adds for metrics: probes to export, no limit
    assert typed.bound is None and not typed.full


@pytest.mark.parametrize(
    ("rate", "settings", "field"),
    [
        (0, {}, "rate"),
        (-5, {}, "rate"),
        ("100", {}, "rate"),
        (None, {}, "rate"),
        (1e308, {}, "rate"),  # was an OverflowError: the default max_waiters was 2 × rate × 1.5
        (float("nan"), {}, "rate"),
        (10, {"burst": 0}, "burst"),
        (10, {"max_pacing_delay": -1}, "max_pacing_delay"),
        (10, {"max_pacing_delay": 1e9}, "max_pacing_delay"),  # a hold of 30 years is a mistake
        (10, {"max_waiters": -1}, "max_waiters"),
        (10, {"spread": "fifo"}, "spread"),
        (10, {"max_retry_after": 0.5}, "max_retry_after"),
        (10, {"max_retry_after": 1e300}, "max_retry_after"),
        (10, {"max_tarpitted": -1}, "max_tarpitted"),
        (10, {"growth": -1}, "growth"),
        (10, {"new_window": 0}, "new_window"),
        (10, {"max_keys": 5.0}, "max_keys"),
    ],
)
def test_bad_config_names_the_field(rate, settings, field) -> None:
    with pytest.raises(ConfigError) as info:
        Gate(rate, Settings(**settings))
    assert info.value.field == field


def test_settings_are_a_value() -> None:
    assert Settings(burst=20) == Settings(burst=20.0) and Settings(burst=20).burst == 20.0
    with pytest.raises(ConfigError) as info:
        Gate(10, {"burst": 2})  # type: ignore[arg-type]
    assert info.value.field == "settings"


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 5000),
    cap=st.integers(1, 600),
    pace=st.floats(0, 3),
    arrivals=st.lists(st.tuples(st.floats(0, 0.5), st.sampled_from(["a", "b", None]), st.sampled_from([1.0, 2.0])),
                      min_size=1, max_size=200),
)  # fmt: skip
def test_retry_after_is_always_a_positive_integer_within_the_cap(rate, cap, pace, arrivals) -> None:
    g = Gate(rate, Settings(burst=2, max_pacing_delay=pace, max_retry_after=cap), now=0.0)
    now = 0.0
    for gap, key, cost in arrivals:
        now += gap
        d = admit(g, now, key=key, cost=cost)
        held = now
        while d is not None and d.delay:  # (a returning client is held up to the lead, whatever the pacing window)
            assert (0 <= d.delay <= g.place_hold + 1e-9) if d.verdict is Verdict.PACE else d.delay <= g.tarpit
            held += d.delay
            d = g.end_hold(d, held)
        if d is not None and d.verdict is Verdict.REJECT:
            assert isinstance(d.retry_after, int) and 1 <= d.retry_after <= cap


@settings(max_examples=150, deadline=None)
@given(
    rate=st.floats(1, 500),
    burst=st.floats(1, 20),
    arrivals=st.lists(st.tuples(st.floats(0, 0.3), st.integers(0, 30)), min_size=1, max_size=300),
)
def test_what_goes_in_never_exceeds_rate_times_t_plus_burst(rate, burst, arrivals) -> None:
    """Whatever mix of new and returning clients arrives, admissions (held ones when their hold ends)
    stay within rate·t + burst over every interval: the schedule only says when a client may come."""
    g = Gate(rate, Settings(burst=burst, max_pacing_delay=1.0), now=0.0)
    pending: list[tuple[float, object, int]] = []  # (when a hold ends, decision, key)
    admitted: list[float] = []
    now = 0.0

    def settle(until: float) -> None:
        pending.sort(key=lambda p: p[0])
        while pending and pending[0][0] <= until:
            at, d, _ = pending.pop(0)
            after = g.end_hold(d, at)
            if after is not None and after.delay:
                pending.append((at + after.delay, after, 0))
                pending.sort(key=lambda p: p[0])
            elif after is not None and after.verdict is not Verdict.REJECT:
                admitted.append(at)

    for gap, key in arrivals:
        now += gap
        settle(now)
        d = admit(g, now, key=key)
        if d.delay:
            pending.append((now + d.delay, d, key))
        elif d.verdict is Verdict.ADMIT:
            admitted.append(now)
    settle(math.inf)
    admitted.sort()
    for i in range(len(admitted)):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= rate * (admitted[j] - admitted[i]) + burst + 1e-6


def test_a_hold_a_small_cut_turns_away_gives_its_place_to_the_next_request() -> None:
    """Ten held up to the 1 s window at 10/s, one more held at 0.5 s behind them; the rate falls to 9.9/s, and the
    tenth's token now comes 10 ms beyond its window: it is turned away. In a tenant's pool its place on the refill
    axis is not lost: the next request is held for it (5 ms), not behind the one reserved after it (0.2 s). Left
    unused, each such token was capacity lost: in a tenant's pool 1.5 s deep, 20 of its 70/s (tests/test_tenants.py).
    A plain gate leaves it unused, as a bucket would: its rate fell because the capacity is thought to have."""
    for releases, wait in ((True, 0.01), (False, 0.21)):
        source = Rate(10.0)
        g = Gate(source, Settings(burst=1.0, max_pacing_delay=1.0, tarpit=0.0), now=0.0)
        g.parent = Parent(None, SPARE) if releases else None  # (a tenant's pool's gate; a plain gate leaves the token
        # unused, as a bucket would)
        first = [admit(g, 0.0, key=i) for i in range(11)]
        assert [d.verdict for d in first] == [Verdict.ADMIT] + [Verdict.PACE] * 10
        source.value = 9.9
        g.refresh(0.0)
        assert admit(g, 0.5, key="late").verdict is Verdict.PACE
        done = serve(g, first[1:], 0.0)
        assert [d.verdict for d, _ in done] == [Verdict.ADMIT] * 9 + [Verdict.REJECT]
        at = done[-1][1]
        assert at == pytest.approx(1.0)
        new = admit(g, at, key="new")
        assert new.verdict is Verdict.PACE and new.until - at < wait  # (behind the one held at 0.5 s: 0.207 s)


def test_a_released_place_is_not_taken_by_a_class_that_must_leave_a_reserve() -> None:
    """A sheddable request must leave part of the burst: the place a client gone left is not for it (it was shed,
    and the default request behind it was then turned away: the classes' order inverted)."""
    g = Gate(10.0, Settings(burst=2.0, max_pacing_delay=1.0, tarpit=0.0), now=0.0)
    for k in range(2):
        assert g.admit(1.0, DEFAULT, 0.0, lambda k=k: k).verdict is Verdict.ADMIT
    held = [g.admit(1.0, DEFAULT, 0.0, lambda k=k: ("d", k)) for k in range(10)]  # due at 0.1 .. 1.0 s
    assert all(d.verdict is Verdict.PACE for d in held)
    sheddable = DEFAULT_CLASSES["sheddable"]
    assert g.admit(1.0, sheddable, 0.0, lambda: "s0").verdict is Verdict.REJECT  # it would wait 1.2 s: shed
    assert g.end_hold(held[4], 0.01, gone=True) is None  # its place, due at 0.5 s, released
    assert g.admit(1.0, sheddable, 0.01, lambda: "s1").verdict is Verdict.REJECT
    assert g.admit(1.0, DEFAULT, 0.02, lambda: "d-late").verdict is Verdict.PACE


def _guarded(guard_rate: float, guard_burst: float) -> tuple[Gate, TokenPacer]:
    """A gate of 100/s (burst 10) whose admissions are also bounded by a guard bucket (a tenants' pool's)."""
    gate = Gate(100.0, Settings(tarpit=0.0, burst=10.0))
    guard = TokenPacer(guard_rate, guard_burst, now=0.0, max_debt=100.0)
    gate.parent = Parent(guard, SPARE)
    return gate, guard


def _settle(gate: Gate, decisions: list[Decision]) -> list[float]:
    """End each hold when it ends, as the middleware does: the times the requests went in."""
    wakes = [(d.delay, i, d) for i, d in enumerate(decisions) if d.delay]
    times = [0.0 for d in decisions if d.verdict is Verdict.ADMIT and not d.delay]
    heapq.heapify(wakes)
    while wakes:
        at, i, d = heapq.heappop(wakes)
        after = gate.end_hold(d, at)
        assert after is not None and after.verdict is not Verdict.REJECT
        if after.delay:
            heapq.heappush(wakes, (at + after.delay, i, after))
        else:
            times.append(at)
    return sorted(times)


def test_a_guarded_gate_admits_no_more_than_its_guard_holds_and_lets_the_rest_in_at_its_rate() -> None:
    """The gate's own bucket holds 10 tokens, the guard 2 (refilling at 20/s): 2 go in at once, the other 8 are
    held, their tokens reserved in the guard at once, and go in one every 1/20 s, in turn."""
    gate, guard = _guarded(20.0, 2.0)
    decisions = [gate.admit(1.0, DEFAULT, 0.0, lambda: None) for _ in range(10)]
    assert sum(d.verdict is Verdict.ADMIT and not d.delay for d in decisions) == 2
    times = _settle(gate, decisions)
    assert len(times) == 10
    assert times[2:] == pytest.approx([k / 20.0 for k in range(1, 9)], abs=ROOM_WAIT + 1e-6)
    assert all(b - a >= 1 / 20.0 - 1e-6 for a, b in itertools.pairwise(times[2:]))  # never two on one guard token
    assert guard.tokens(times[-1]) == pytest.approx(0.0, abs=1e-6)


def test_a_held_request_whose_client_goes_gives_up_its_place_in_the_guard_to_the_next_held_not_to_a_newcomer() -> None:
    """Holds whose tokens came due while the guard was short reserve their tokens there, in turn. One whose client
    goes gives its place up: the newest one's token comes back to the guard; an earlier one's place goes to the
    next hold reserved, never to a request arriving meanwhile (given back, two requests went in on one token,
    beyond rate·t + burst)."""
    gate, guard = _guarded(20.0, 1.0)
    decisions = [gate.admit(1.0, DEFAULT, 0.0, lambda: None) for _ in range(4)]
    assert decisions[0].verdict is Verdict.ADMIT
    held = decisions[1:]  # their own tokens free, the guard's not: places in the guard, in turn
    assert all(h.verdict is Verdict.PACE and h.guard is not None and h.delay > 0 for h in held)
    places = [h.guard for h in held]
    assert places == sorted(places) and len(set(places)) == 3
    now = 0.025
    tokens = guard.tokens(now)
    assert gate.end_hold(held[0], now, gone=True) is None  # the first of three: its place stands for the next
    assert guard.tokens(now) == pytest.approx(tokens)  # (nothing comes back for a newcomer to take)
    assert gate.admit(1.0, DEFAULT, now, lambda: None).verdict is Verdict.PACE  # (a newcomer: held, not let in)
    assert gate.end_hold(held[2], now, gone=True) is None  # the newest: its token comes back
    assert guard.tokens(now) == pytest.approx(tokens + 1.0)


def test_a_request_whose_token_in_the_guard_comes_due_while_nothing_more_may_be_in_flight_waits_for_room() -> None:
    """Its token in the replica's bucket is reserved; due when the in-flight limit is reached, it is held on for
    room as any hold is (it kept its tokens), not let in beyond the limit."""
    gate = bounded(100.0, floor=4.0, burst=10, tarpit=0.0)
    gate.parent = Parent(guard := TokenPacer(20.0, 1.0, now=0.0, max_debt=100.0), SPARE)
    first, second = (gate.admit(1.0, DEFAULT, 0.0, lambda: None) for _ in range(2))
    assert first.verdict is Verdict.ADMIT and second.guard is not None  # (its place in the guard: due at 0.05 s)
    for _ in range(4):
        gate.probes.admit(0.0)  # four in flight and none answered: the limit is reached
    assert gate.full
    after = gate.end_hold(second, 0.05)
    assert after is not None and after.verdict is Verdict.PACE and after.delay == ROOM_WAIT and after.guard is not None
    assert guard.tokens(0.05) == pytest.approx(0.0)  # (its token stays reserved)


def test_a_hold_whose_own_token_comes_due_while_the_guard_is_short_reserves_its_token_there() -> None:
    """Held for its own bucket's token (due at 0.01 s), it finds the replica's bucket spent by the others meanwhile:
    it reserves its token there, in turn, and goes in when that is due, not at once."""
    gate = Gate(100.0, Settings(tarpit=0.0, burst=1.0))
    gate.parent = Parent(guard := TokenPacer(20.0, 5.0, now=0.0, max_debt=100.0), SPARE)
    guard.cap(3.0, 0.0)  # (the other pools spent some: no more than half of its burst is left after this one)
    assert gate.admit(1.0, DEFAULT, 0.0, lambda: None).verdict is Verdict.ADMIT
    held = gate.admit(1.0, DEFAULT, 0.0, lambda: None)
    assert held.verdict is Verdict.PACE and held.guard is None and held.delay == pytest.approx(0.01)
    assert guard.try_take(2.0, 0.0)  # (the other pools spend the rest)
    after = gate.end_hold(held, 0.01)
    assert after is not None and after.verdict is Verdict.PACE and after.guard is not None
    assert after.delay == pytest.approx(0.05 - 0.01 * 20.0 / 20.0, abs=1e-6)  # (0.2 of a token refilled by 0.01 s)
    final = gate.end_hold(after, 0.01 + after.delay)
    assert final is not None and final.verdict is Verdict.ADMIT


def test_a_request_waiting_in_the_guard_beyond_its_window_after_a_cut_is_given_a_place_instead() -> None:
    """μ is cut while it waits for its token in the replica's bucket: that token now comes beyond its pacing window
    (1 s). It gives the token up and is told its place, rather than held for seconds past the window."""
    gate = Gate(100.0, Settings(tarpit=0.0, burst=10.0, max_pacing_delay=1.0))
    gate.parent = Parent(guard := TokenPacer(20.0, 1.0, now=0.0, max_debt=100.0), SPARE)
    decisions = [
        gate.admit(
            1.0,
            DEFAULT,
            0.0,
            lambda: None,
        )
        for _ in range(10)
    ]
    last = decisions[-1]
    assert last.guard is not None and guard.due_in(last.guard, 0.0) == pytest.approx(0.45)
    guard.set_grant(2.0, 0.1)  # a cut to a tenth: its token would come 4.5 s later
    after = gate.end_hold(last, 0.25)
    assert after is not None and after.verdict is Verdict.REJECT and after.retry_after >= 1
    assert guard.tokens(0.25) == pytest.approx(-9.0 + 20 * 0.1 + 2 * 0.15 + 1.0)  # (its token came back: the newest)


def test_a_class_that_leaves_part_of_the_burst_leaves_it_in_the_guard_too() -> None:
    """A sheddable request (reserve 0.5) leaves half of the replica's bucket (burst 4) to the classes above it, as it
    leaves half of its own: with 2 tokens there it is not let in although its own bucket is full, and it reserves
    nothing there (a reservation charges the bucket at once). Two default requests after it, of its pool or
    another's, still go in at once; on the tree before, it took one of the two tokens and the second default request
    waited. It is held for room and goes in once the replica's bucket, refilling at 20/s, holds its token beyond
    what it leaves: 3 tokens, 0.15 s after the defaults emptied it."""
    gate, guard = _guarded(20.0, 4.0)
    assert all(gate.admit(1.0, DEFAULT, 0.0, lambda: None) is ADMITTED for _ in range(2))
    shed = gate.admit(1.0, SHEDDABLE, 0.0, lambda: None)
    assert shed.verdict is Verdict.PACE and shed.reserve == 0.5 and shed.guard is None
    assert guard.tokens(0.0) == pytest.approx(2.0)  # (nothing charged for it)
    assert all(gate.admit(1.0, DEFAULT, 0.0, lambda: None) is ADMITTED for _ in range(2))
    times = _settle(gate, [shed])
    assert times == pytest.approx([0.15], abs=ROOM_WAIT + 1e-6) and times[0] >= 0.15 - 1e-6


def test_a_hold_planned_on_the_guard_is_counted_for_the_wait_planned_there() -> None:
    """The pacing histogram counts each hold as planned: a request whose own token is free but whose replica's bucket
    is short is held for its token there, and that is the wait it counts (on the tree before, 0 s: the 8 holds of
    the guard test counted 0 s between them, where they were planned to wait 1/20 to 8/20 s)."""
    gate, _ = _guarded(20.0, 2.0)
    for _ in range(10):
        gate.admit(1.0, DEFAULT, 0.0, lambda: None)
    assert sum(gate.stats.pacing.counts) == 8
    assert gate.stats.pacing.seconds == pytest.approx(sum(k / 20.0 for k in range(1, 9)))


def test_a_request_whose_reserved_token_is_due_at_once_goes_in_and_leaves_no_waiter() -> None:
    """Where the first branch's ``tokens - cost >= keep`` and the reservation's ``cost + keep - tokens`` round apart
    (0.7 tokens, a sheddable request of cost 0.2 leaving 0.5 of a burst of 1: 0.49999999999999994 left, and nothing
    missing), the token reserved is due now. It goes in at once. As a hold of no delay, it was
    served at once, never ended, and its waiter was counted for ever (it kept a tenants' table from opening)."""
    gate = Gate(10.0, Settings(burst=1.0, tarpit=0.0), now=0.0)
    gate.pacer.charge(0.3, 0.0)  # (critical traffic took 0.3)
    assert gate.pacer.tokens(0.0) == 0.7
    decision = gate.admit(0.2, SHEDDABLE, 0.0, lambda: "client")
    assert gate.stats.contended == 1 and gate.pacer.asked == 1  # (not the first branch: a token was reserved)
    assert decision.verdict is Verdict.ADMIT and not decision.delay
    assert gate.waiters == 0


def test_a_request_short_of_its_pools_token_goes_in_on_what_the_pools_left_in_the_guard() -> None:
    """In a tenants' pool, a request whose own bucket is short goes in on the replica's bucket alone while that would
    still hold ``keep`` (SPARE, or the largest class reserve) of its burst and two requests' cost: the pools left that
    refill unused (each one's rate is what it was measured to ask, a little more), and beyond the burst it was lost
    (fifty light tenants beside a busy one: 91.6 of 100/s admitted, now 100.1). Its own bucket is untouched, and it
    counts as a new request in λ_new. Not below that, nor for a class that leaves part of a burst (its reserve is the
    pools' own), nor with no room in flight."""
    gate = Gate(100.0, Settings(tarpit=0.0, burst=1.0))
    gate.parent = Parent(guard := TokenPacer(100.0, 10.0, now=0.0, max_debt=100.0), SPARE)
    assert gate.parent.keep == SPARE == 0.5
    assert gate.admit(1.0, DEFAULT, 0.0, lambda: None).verdict is Verdict.ADMIT  # its own token: 9 left in the guard
    decisions = [gate.admit(1.0, DEFAULT, 0.0, lambda: None) for _ in range(3)]
    assert [d.verdict for d in decisions] == [Verdict.ADMIT] * 2 + [Verdict.PACE]  # (9 and 8 leave 5 and two more)
    assert gate.stats.spare == 2 and guard.tokens(0.0) == pytest.approx(7.0)
    assert gate.pacer.tokens(0.0) == pytest.approx(-1.0)  # (untouched by the two; the third reserved its own)
    assert gate.new_requests == 4
    assert gate.admit(1.0, SHEDDABLE, 0.01, lambda: None).verdict is not Verdict.ADMIT  # (8 in the guard: not for it)
    assert gate.admit(1.0, DEFAULT, 0.01, lambda: None).verdict is Verdict.ADMIT and gate.stats.spare == 3
    gate.parent.keep = 0.6  # (a class reserving 0.6 of the burst in use: 6 and two more kept)
    assert gate.admit(1.0, DEFAULT, 0.02, lambda: None).verdict is Verdict.PACE and gate.stats.spare == 3
    bounded_gate = bounded(100.0, floor=1.0, burst=1, tarpit=0.0)
    bounded_gate.parent = Parent(TokenPacer(100.0, 10.0, now=0.0, max_debt=100.0), SPARE)
    assert go_in(bounded_gate, bounded_gate.admit(1.0, DEFAULT, 0.0, lambda: None), 0.0).verdict is Verdict.ADMIT
    assert bounded_gate.admit(1.0, DEFAULT, 0.0, lambda: None).verdict is Verdict.PACE  # (one in flight: the limit)
    assert bounded_gate.stats.spare == 0
