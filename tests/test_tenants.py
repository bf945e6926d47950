"""Tenants: weighted max-min fair shares of the capacity through the real Gate, on virtual time."""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
import tracemalloc
from collections import Counter, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from admitgate import AdmitGate, ConfigError, HeaderPolicy, ManualClock, Settings
from admitgate.asgi.keys import naming
from admitgate.config import load
from admitgate.core.fair import fair_shares
from admitgate.core.gate import ADMITTED, Decision, Gate, Verdict
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.core.settings import MIN_RATE
from admitgate.core.tenants import Tenancy, Tenants
from admitgate.core.tenants.policy import NEWCOMERS
from admitgate.core.tenants.pool import asked_rates as _rates
from admitgate.core.tenants.share import Share, Split
from admitgate.core.tenants.tuning import FAIR
from admitgate.core.tuning import GATE
from admitgate.limit.capacity import LiveCapacity
from admitgate.limit.estimators import Static
from tests.test_middleware import call, http_scope

DEFAULT = DEFAULT_CLASSES["default"]
CRITICAL = DEFAULT_CLASSES["critical"]
HISTORY, SLACK, ROOM_WAIT = FAIR.history, FAIR.slack, GATE.room_wait
#: The pacing window these tests hold requests for (longer than the default's half second): the fair share's
#: mechanisms are pinned at it.
HOLD = 1.5


def scope(name: str | None) -> str | None:
    """A request of tenant ``name``, as the table is given it: its name (the shell reads it from x-api-key)."""
    return name


def table(rate: float = 100.0, **tenancy: object) -> Tenants:
    """A table at ``rate`` requests/s, closed unless ``open_below`` says (the pools' own contract), holding requests
    up to 1.5 s (the window its mechanisms are pinned at, longer than the default's)."""
    root = Gate(rate, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    return Tenants(Tenancy(**{"open_below": 0.0, **tenancy}), root)  # type: ignore[arg-type]


class Rate:
    """A capacity source whose rate a test sets by hand (requests/s)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def rate(self, now: float) -> float:
        return self.value


class Run:
    """Drive a table with requests at fixed rates on virtual time; count admissions per tenant.

    ``rates``: tenant -> ((start, end, requests/s), ...). Requests come from anonymous clients (a rejected
    one is dropped); paced ones are admitted when their hold ends, as the middleware does.
    """

    def __init__(self, tenants: Tenants) -> None:
        self.tenants = tenants
        self.admitted: Counter[tuple[str, int]] = Counter()  # (tenant, whole second) -> admissions
        self.last = 0.0  # the last admission's time
        self._events: list[tuple[float, int, str, Decision | None]] = []
        self._seq = itertools.count()

    def send(self, tenant: str, start: float, end: float, rate: float) -> Run:
        for k in range(int((end - start) * rate)):
            heapq.heappush(self._events, (start + k / rate, next(self._seq), tenant, None))
        return self

    def go(self) -> Run:
        while self._events:
            now, _, tenant, held = heapq.heappop(self._events)
            if held is None:
                decision = self.tenants.admit(1.0, DEFAULT, now, lambda: None, scope(tenant))
            else:
                after = self.tenants.end_hold(held, now)
                assert after is not None
                decision = after
            if decision.delay:
                heapq.heappush(self._events, (now + decision.delay, next(self._seq), tenant, decision))
            elif decision.verdict is Verdict.ADMIT:
                self.admitted[tenant, int(now)] += 1
                self.last = now
        return self

    def rate(self, tenant: str, start: int, end: int) -> float:
        """Admissions/s of ``tenant`` over whole seconds [start, end)."""
        return sum(self.admitted[tenant, s] for s in range(start, end)) / (end - start)


Worker = tuple[str, int, float, float, bool, float]  # tenant, connection, end, think, obeys, retry


class Workers(Run):
    """Drive a table with worker pools on virtual time: each of a tenant's ``connections`` sends a request, and
    ``think`` seconds after each answer its next, until ``end``; told to wait (429), it sends again after the
    Retry-After if it ``obeys``, else ``retry`` seconds after. A worker is a client of its own (its connection)."""

    def __init__(self, tenants: Tenants) -> None:
        super().__init__(tenants)
        self._workers: list[tuple[float, int, Worker, Decision | None]] = []

    def pool(self, tenant: str, connections: int, end: float, think: float = 0.12, obeys: bool = True,
             retry: float = 0.1) -> Workers:  # fmt: skip
        for c in range(connections):
            worker = (tenant, c, end, think, obeys, retry)
            heapq.heappush(self._workers, (c * think / connections, next(self._seq), worker, None))
        return self

    def go(self) -> Workers:
        events = self._workers
        while events:
            now, _, worker, held = heapq.heappop(events)
            tenant, connection, end, think, obeys, retry = worker
            if held is None:
                if now >= end:
                    continue
                identify = functools.partial(tuple, (tenant, connection))  # (its connection)
                decision = self.tenants.admit(1.0, DEFAULT, now, identify, scope(tenant))
            else:
                after = self.tenants.end_hold(held, now)
                assert after is not None
                decision = after
            if decision.delay:
                heapq.heappush(events, (now + decision.delay, next(self._seq), worker, decision))
                continue
            if decision.verdict is Verdict.ADMIT:
                self.admitted[tenant, int(now)] += 1
                again = now + think
            else:
                again = now + (decision.retry_after if obeys else retry)
            heapq.heappush(events, (again, next(self._seq), worker, None))
        return self


def test_equal_tenants_asking_twice_their_share_get_a_sixth_each() -> None:
    run = Run(table())
    for name in "abcdef":
        run.send(name, 0, 30, 2 * 100 / 6)
    run.go()
    for name in "abcdef":
        assert run.rate(name, 10, 30) == pytest.approx(100 / 6, rel=0.1)


def test_weights_divide_the_capacity_3_1_1() -> None:
    run = Run(table(weights={"gold": 3}))
    for name in ("gold", "x", "y"):
        run.send(name, 0, 30, 200)
    run.go()
    assert run.rate("gold", 10, 30) == pytest.approx(60, rel=0.1)
    assert run.rate("x", 10, 30) == pytest.approx(20, rel=0.1)
    assert run.rate("y", 10, 30) == pytest.approx(20, rel=0.1)


@pytest.mark.parametrize(("connections", "think"), [(2, 0.12), (4, 0.12), (16, 0.12)])
def test_worker_pools_beside_an_abuser_each_reach_their_share(connections: int, think: float) -> None:
    """Five tenants whose clients are worker pools (each worker asks again 120 ms after an answer, and waits the
    Retry-After after a 429) beside one retrying on 20 connections every 100 ms whatever it is told. A pool given
    what it asked asks no more: water-filled over the asks alone, two workers asking their share at most were held
    to 0.75-0.88 of it and the abuser took twice its own. Each pool is offered room to grow (``FairTuning.slack``)."""
    run = Workers(table()).pool("abuser", 20, 30, obeys=False)
    names = [f"t{i}" for i in range(5)]
    for name in names:
        run.pool(name, connections, 30, think)
    run.go()
    share = 100 / 6
    for start, end in ((3, 10), (3, 30)):
        assert all(run.rate(name, start, end) >= 0.9 * share for name in names), (start, end)
        assert run.rate("abuser", start, end) <= 1.1 * share, (start, end)


def test_worker_pools_asking_more_than_their_share_grow_to_it_beside_an_abuser() -> None:
    """Two workers asking again 50 ms after each answer (2.4 times their share of 100/6): held at 0.46-0.71 of it
    beside the abuser, which took 3.4 times its own."""
    run = Workers(table()).pool("abuser", 20, 30, obeys=False)
    names = [f"t{i}" for i in range(5)]
    for name in names:
        run.pool(name, 2, 30, think=0.05)
    run.go()
    share = 100 / 6
    assert all(run.rate(name, 10, 30) >= 0.95 * share for name in names)
    assert run.rate("abuser", 10, 30) <= 1.05 * share


def test_weights_divide_the_capacity_3_1_1_among_worker_pools() -> None:
    run = Workers(table(weights={"gold": 3}))
    for name in ("gold", "x", "y"):
        run.pool(name, 16, 30)
    run.go()
    for start, end in ((3, 10), (3, 30)):
        assert run.rate("gold", start, end) == pytest.approx(60, rel=0.1)
        assert run.rate("x", start, end) == pytest.approx(20, rel=0.1)
        assert run.rate("y", start, end) == pytest.approx(20, rel=0.1)


def test_a_class_weight_applies_through_classify() -> None:
    tenants = table(weights={"premium": 3.0, "x": 2.0}, classify=lambda name: "premium" if name[0] == "p" else None)
    assert (tenancy := tenants.tenancy).weight("p1") == 3.0 and tenancy.weight("x") == 2.0
    assert tenancy.weight("z") == 1.0


def test_what_a_modest_tenant_leaves_goes_to_the_others() -> None:
    run = Run(table()).send("small", 0, 30, 10).send("b", 0, 30, 200).send("c", 0, 30, 200).go()
    assert run.rate("small", 10, 30) == pytest.approx(10, rel=0.05)
    assert run.rate("b", 10, 30) == pytest.approx(45, rel=0.1)
    assert run.rate("c", 10, 30) == pytest.approx(45, rel=0.1)


def test_a_lone_tenant_gets_all_of_the_capacity() -> None:
    run = Run(table()).send("alone", 0, 30, 200).go()
    assert run.rate("alone", 5, 30) >= 97


def test_tenants_arriving_and_leaving_take_and_give_back_their_share() -> None:
    run = Run(table()).send("a", 0, 40, 200).send("b", 10, 25, 200).go()
    assert run.rate("a", 3, 10) >= 97  # alone
    assert run.rate("a", 15, 25) == pytest.approx(50, rel=0.1)  # b came: half each
    assert run.rate("b", 15, 25) == pytest.approx(50, rel=0.1)
    assert run.rate("a", 30, 40) >= 97  # b left: all of it again


def test_a_flood_of_new_keys_competes_as_one_tenant() -> None:
    tenants = table()
    run = Run(tenants).send("a", 0, 30, 100).send("b", 0, 30, 100)
    for k in range(30 * 500):  # 500 new keys a second, each sending one request
        heapq.heappush(run._events, (k / 500, next(run._seq), f"flood-{k}", None))
    run.go()
    assert run.rate("a", 10, 30) >= 0.9 * 100 / 3
    assert run.rate("b", 10, 30) >= 0.9 * 100 / 3
    assert len(tenants) == 2  # no flood key ever got a pool


@pytest.mark.slow
@pytest.mark.parametrize(("newcomer_share", "least", "most"), [(0.1, 9.0, 15.0), (0.0, 0.0, 6.0)])
def test_beside_many_busy_tenants_the_newcomers_keep_their_floor(
    newcomer_share: float, least: float, most: float
) -> None:
    """20 tenants each asking twice the capacity, and requests without a tenant key at 15/s: as one tenant of
    weight 1 among 21 the newcomers got 100/21 = 4.8/s (a herd across 500 tenants served one new arrival in ten).
    Their weight is raised to ``newcomer_share`` of the capacity (10/s here); each tenant still gets its part of
    what is left (90/20 = 4.5/s), and with ``newcomer_share=0`` the weight alone decides, as before."""
    run = Run(table(newcomer_share=newcomer_share))
    for k in range(20):
        run.send(f"t{k}", 0, 30, 200)
    run.send(None, 0, 30, 15).go()  # type: ignore[arg-type]
    assert least <= run.rate(None, 10, 30) <= most  # type: ignore[arg-type]
    share = (100 - run.rate(None, 10, 30)) / 20  # type: ignore[arg-type]
    for k in range(20):
        assert run.rate(f"t{k}", 10, 30) >= 0.9 * share
    # What each is sure of (its entitlement: the q of its rate-limit fields) sums to the capacity, the floor
    # included (the tenants' parts are of what the newcomers leave; of all of it, they summed to 105 of 100/s).
    sure = sum(pool.share.entitlement for pool in run.tenants.pools(30.0) if pool.awake)
    assert sure == pytest.approx(100.0, rel=0.01)


def test_light_tenants_do_not_lift_the_newcomers_above_their_floor() -> None:
    """40 tenants asking 1/s each, one asking 200/s, and keyless requests at 200/s on 100/s. The floor is a share
    of the capacity, not a weight: as a weight raised against the 41 tenants asking, the light ones (given what
    they ask) left the rest to the newcomers and the busy tenant at 3.7 : 1, and the keyless flood took most
    of the busy tenant's share. Above their floor the newcomers are one tenant: they and the busy one split
    what the light ones leave."""
    tenants = table()
    run = Run(tenants)
    for k in range(40):
        run.send(f"light{k}", 0, 0.03, 100)  # three requests: established
        run.send(f"light{k}", 0.5, 30, 1)
    run.send("big", 0, 30, 200).send(None, 0, 30, 200).go()  # type: ignore[arg-type]
    keyless, big = run.rate(None, 10, 30), run.rate("big", 10, 30)  # type: ignore[arg-type]
    assert big >= 20 and keyless <= 1.1 * big
    assert tenants.newcomers.weight == 1.0


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(tenants_=st.integers(1, 14), keyless=st.floats(2.0, 60.0))
def test_under_overload_the_newcomers_keep_their_floor_and_the_sum_stays_within_the_capacity(
    tenants_: int, keyless: float
) -> None:
    """Any number of busy tenants (each asking twice the capacity) beside keyless requests at any rate: the
    newcomers are admitted at least their floor (a tenth of the capacity, or less if they ask less) or their one
    weighted share, whichever is more, and never more than the capacity is admitted in all. (What the busy
    tenants get of the rest is not pinned here: beside a light pool, 10-13 of them leave 5-9 % of the capacity
    unused and are served unevenly, as they were before the floor; see docs/fairness.md.)"""
    run = Run(table())
    names = [f"t{k}" for k in range(tenants_)]
    for name in names:
        run.send(name, 0, 15, 200)
    run.send(None, 0, 15, keyless).go()  # type: ignore[arg-type]
    newcomers = run.rate(None, 5, 15)  # type: ignore[arg-type]
    assert newcomers >= 0.9 * min(keyless, max(10.0, 100 / (tenants_ + 1))) - 1
    assert sum(run.rate(name, 5, 15) for name in names) + newcomers <= 100 * 1.02


def _herd_beside_new_arrivals(tenants_: int, seed: int, clients: int = 2000, new: float = 20.0) -> tuple[float, float]:
    """A herd of ``clients`` obedient clients across ``tenants_`` tenants released at 1 s on 200/s (the default
    settings), beside keyless new arrivals at ``new``/s (Poisson, one try each) from 0 s: (the share of the new
    arrivals after the release served, until the herd is in; the herd's drain over its bound M / (μ − new))."""
    tenants = Tenants(Tenancy(open_below=0.0), Gate(200.0, Settings()))
    rng, seq = random.Random(seed), itertools.count()
    events: list[tuple[float, int, int, Decision | None]] = [(1.0, next(seq), i, None) for i in range(clients)]
    at = 0.0
    while at < 60.0:
        at += rng.expovariate(new)
        events.append((at, next(seq), -1, None))  # (-1: a new arrival)
    heapq.heapify(events)
    served, finished, last = Counter(), 0, 0.0
    while events and finished < clients:
        now, _, who, held = heapq.heappop(events)
        if held is not None:
            decision = tenants.end_hold(held, now)
            assert decision is not None
        else:
            tenant = None if who < 0 else f"t{who % tenants_}"
            decision = tenants.admit(1.0, DEFAULT, now, functools.partial(tuple, (who,)), scope(tenant))
        if decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), who, decision))
        elif who < 0:
            served[decision.verdict is Verdict.ADMIT] += now >= 1.0
        elif decision.verdict is Verdict.ADMIT:
            finished, last = finished + 1, now
        else:
            heapq.heappush(events, (now + decision.retry_after, next(seq), who, None))
    return served[True] / (served[True] + served[False]), (last - 1.0) / (clients / (200.0 - new))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_new_arrivals_beside_a_herd_across_100_tenants_are_served_as_beside_a_herd_in_one(seed: int) -> None:
    """2,000 clients as 100 tenants of 20 beside keyless new arrivals at 20/s, a tenth of the capacity: the
    newcomers' floor. Given the floor as it was, 20/s for Poisson arrivals at 20/s, the newcomers' pool read as
    flooded and held the arrivals behind a burst 50 ms at most: 0.87-0.94 of them served over eight seeds (beside a
    herd in one tenant, where the newcomers are given a quarter more than they ask, 1.0). The floor is of what
    they ask, given room as any pool's ask is (``FairTuning.slack``), and a flood is λ_new alone (see
    ``Gate._flooded``): 0.99-1.0. Either alone: 0.94-1.0 and 0.90-0.96."""
    new_served, drain = _herd_beside_new_arrivals(100, seed)
    assert new_served >= 0.95 and drain <= 1.15


def test_a_held_request_is_not_counted_twice_in_its_pools_demand() -> None:
    """A held request was counted as asked when it came; counted again as a backlog, one hold lifted the keyless
    pool (7.5/s, just above its weighted share) to 9.5/s and back at each reallocation, and the cuts between
    turned the tenants' holds away. The more of the two is counted."""
    run = Run(table())
    for k in range(13):
        run.send(f"t{k}", 0, 15, 200)
    run.send(None, 0, 15, 7.5).go()  # type: ignore[arg-type]
    assert sum(run.rate(f"t{k}", 5, 15) for k in range(13)) + run.rate(None, 5, 15) >= 90  # type: ignore[arg-type]


def test_beside_a_few_tenants_the_newcomers_weigh_what_newcomer_weight_says() -> None:
    """With nine tenants or fewer the newcomers' one share is already a tenth of the capacity or more: the floor
    changes nothing (the abuse benchmark's six tenants divide the capacity as before)."""
    run = Run(table())
    for name in "abcde":
        run.send(name, 0, 30, 100)
    run.send(None, 0, 30, 100).go()  # type: ignore[arg-type]
    assert run.rate(None, 10, 30) == pytest.approx(100 / 6, rel=0.1)  # type: ignore[arg-type]
    assert run.tenants.newcomers.weight == 1.0


def test_critical_requests_are_never_shed_and_are_charged_first() -> None:
    tenants = table()
    now = 0.0
    for k in range(2000):  # 200/s of critical traffic for 10 s: all admitted
        now = k / 200
        assert tenants.admit(1.0, CRITICAL, now, lambda: None, scope("a")) is not None
    assert tenants.root.stats.critical == 2000 and tenants.spare == 0  # (on the root: beyond no pool's share)
    tenants.rebalance(now + 0.01)
    assert tenants._available == pytest.approx(100 * 0.05)  # critical took it all: the floor is left to share


def test_a_pools_share_cut_as_others_wake_is_told_at_its_peak() -> None:
    """A pool whose share is cut under a quarter of its recent peak as other tenants wake has it back as they drain:
    its clients are told when their places would be due at its peak, as in an outage, not at the cut share (2,000
    s here) nor at a λ_new window at least, as where new arrivals take the capacity (a herd across 100 tenants then
    drained at 1.179 of its bound in one seed of three in the simulator, against 1.085)."""
    tenants = table()
    now = 0.0
    for k in range(300):  # "busy" alone, 100/s
        now = k / 100
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("busy"))
    for k in range(300):  # 30 tenants wake, 10 requests/s each, beside busy's 100/s
        now = 3 + k / 100
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("busy"))
        for t in range(k % 10, 30, 10):
            tenants.admit(1.0, DEFAULT, now, lambda: None, scope(f"t{t}"))
    pool = tenants._pools.get("busy", now)
    assert pool is not None and pool.share.capacity < 0.25 * 90  # (its peak H was about 90/s)
    # (250: its backlog is then told at 2 s, above every Retry-After's floor of 1 s; held requests here never end, so
    # the tokens they reserve are never charged to the replica's bucket, and its pool took what that bucket held)
    told = [tenants.admit(1.0, DEFAULT, now, lambda k=k: f"h{k}", scope("busy")).retry_after for k in range(250)]
    # at its peak, the table's whole 100/s while it was alone: 250 places take 2.5 s, told the lead (1 s) early;
    # at the cut share (under 22.5/s) 11 s or more, and not sooner than a λ_new window (5 s) it would be 4
    assert max(told) == 2


def test_a_pools_own_clients_taking_its_share_are_told_as_a_replicas_are() -> None:
    """A tenant's closed-loop clients are new arrivals to its pool: they take its share and its H falls to its floor,
    its share uncut. That low H is waited out as a replica's is, at the peak but not sooner than a λ_new window (at
    the peak alone, such clients asked every second: 50.9 429s a second beside ten light tenants, now 12.7)."""
    tenants = table()
    now = 0.0
    for k in range(96 * 10):  # "busy" alone, 96 new requests/s for 10 s
        now = k / 96
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("busy"))
    pool = tenants._pools.get("busy", now)
    assert pool is not None
    gate = pool.gate
    gate.max_waiters = 0  # (no pacing: each client is given a place)
    gate.pacer.try_take(gate.pacer.tokens(now), now)  # its clients took what the bucket refilled
    told = [tenants.admit(1.0, DEFAULT, now, lambda k=k: f"h{k}", scope("busy")).retry_after for k in range(50)]
    assert max(told) == math.ceil(gate.settings.new_window - gate.lead)  # not 1 s (the peak), nor 9 (H's floor)


def test_a_stampeding_tenant_does_not_push_back_the_small_one() -> None:
    tenants = table()
    now = 0.0
    for k in range(5 * 100):  # both established; the herd's tenant is busy, the small one asks 10/s
        now = k / 100
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("herd"))
        if k % 10 == 0:
            tenants.admit(1.0, DEFAULT, now, lambda: None, scope("small"))
    herd = [tenants.admit(1.0, DEFAULT, now, lambda k=k: f"h{k}", scope("herd")) for k in range(2000)]
    small = [tenants.admit(1.0, DEFAULT, now, lambda k=k: f"s{k}", scope("small")) for k in range(10)]
    assert max(d.retry_after for d in herd) >= 20  # 2000 clients spread at its share (about 90/s)
    assert max(d.retry_after for d in small) <= 2  # 10 clients at its own share


def test_a_herds_tenant_beside_a_light_one_is_told_at_what_the_light_one_leaves() -> None:
    """Retry-After is told at what the tenant gets while it stays busy (the capacity less what the others use),
    not at its weighted entitlement: half of the capacity here, which told 2,000 clients to come back over
    twice the time the capacity needs, and left the rest unused."""
    tenants = table(200.0)
    now = 0.0
    for k in range(5 * 10):  # both established: the small tenant asks 10/s, the herd's 1/s
        now = k / 10
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("small"))
        if k % 10 == 0:
            tenants.admit(1.0, DEFAULT, now, lambda: None, scope("herd"))
    herd = [tenants.admit(1.0, DEFAULT, now, lambda k=k: f"h{k}", scope("herd")) for k in range(2000)]
    bound = 2000 / (200 - 10)
    assert 0.8 * bound <= max(d.retry_after for d in herd) <= 1.2 * bound  # (was 20: told at 100/s)


@pytest.mark.parametrize("spread", [0.0, 2e-4])
def test_a_herd_whose_first_requests_came_as_newcomers_is_told_at_what_the_light_one_leaves(spread: float) -> None:
    """A herd's first requests come before its key is established (``establish``), to the newcomers' pool. That
    pool, woken by them, counted in the herd's promise as using its whole entitlement (half of the capacity) until
    the next reallocation, and its two requests as its demand after it: the herd was told at 86 of 200/s, up to
    22 s where 11 s does."""
    tenants = table(200.0)
    for k in range(50):  # the small tenant asks 10/s
        tenants.admit(1.0, DEFAULT, k / 10, lambda: None, scope("small"))
    herd = [tenants.admit(1.0, DEFAULT, 5.0 + k * spread, lambda k=k: f"h{k}", scope("herd")) for k in range(2000)]
    bound = 2000 / (200 - 10)
    assert 0.8 * bound <= max(d.retry_after for d in herd) <= 1.2 * bound


def test_an_established_key_takes_along_only_its_own_requests_the_newcomers_pool_counted_this_interval() -> None:
    tenants = table(200.0, interval=0.5)
    tenants.admit(1.0, DEFAULT, 0.0, lambda: None, scope("late"))
    tenants.admit(1.0, DEFAULT, 0.1, lambda: None, scope("late"))  # two as a newcomer, in the first interval
    for k in range(4):  # four keyless requests in the second: the newcomers' pool's own demand
        tenants.admit(1.0, DEFAULT, 0.6 + k * 0.01, lambda: None, scope(None))
    tenants.admit(1.0, DEFAULT, 0.7, lambda: None, scope("late"))  # established
    # Its first two were the newcomers' pool's demand in the first interval, measured there; the four
    # keyless requests of this one are not its. (Two of them were taken: the newcomers' demand read 2/s for 8/s.)
    assert tenants.newcomers.asked == 4 and tenants.pool_of("late", 0.7).asked == 1


def test_an_established_key_does_not_take_along_its_early_returns_the_newcomers_pool_did_not_count() -> None:
    root = Gate(1.0, Settings(burst=1, max_pacing_delay=0.0, tarpit=0.0))
    tenants = Tenants(Tenancy(open_below=0.0, establish=3, interval=60.0), root)
    assert tenants.admit(1.0, DEFAULT, 0.0, lambda: None, scope(None)).verdict is Verdict.ADMIT
    assert tenants.admit(1.0, DEFAULT, 0.0, lambda: "c", scope("late")).verdict is Verdict.REJECT
    early = root.stats.early + sum(g.stats.early for g in tenants.gates(0.0))
    assert tenants.admit(1.0, DEFAULT, 0.01, lambda: "c", scope("late")).verdict is Verdict.REJECT  # back at once
    assert sum(g.stats.early for g in tenants.gates(0.01)) == early + 1  # ignoring Retry-After: no demand
    assert tenants.newcomers.asked == 2  # the first request, and the client's first attempt
    tenants.admit(1.0, DEFAULT, 0.02, lambda: None, scope(None))  # another newcomer's
    tenants.admit(1.0, DEFAULT, 0.03, lambda: "d", scope("late"))  # the key's third: established
    assert tenants.newcomers.asked == 2 and tenants.pool_of("late", 0.03).asked == 2


def test_a_tenant_whose_demand_surges_is_measured_again_once_it_turns_clients_away() -> None:
    """A herd's tenant woke at a third of the capacity (beside the newcomers' pool and a small tenant) and kept
    that rate until the next reallocation, up to half a second, holding the herd's first wave at it."""
    tenants = table(200.0)
    for k in range(50):  # the small tenant asks 10/s
        tenants.admit(1.0, DEFAULT, k / 10, lambda: None, scope("small"))
    now, first = 5.0, None
    for k in range(600):  # a herd, a request a millisecond (the first 400 are let in or held)
        now = 5.0 + k * 1e-3
        d = tenants.admit(1.0, DEFAULT, now, lambda k=k: f"h{k}", scope("herd"))
        if first is None and d.verdict is Verdict.REJECT:
            first = now
    assert first is not None
    herd = tenants.pool_of("herd", now)
    assert tenants._last <= first + 0.5 * 0.1 + 0.01  # reallocated within a tenth of the interval of it
    assert herd.share.value >= 0.9 * (200 - 10 * 1.25 - 1)  # and given what the small one leaves


def test_idle_pools_expire_and_the_table_is_bounded() -> None:
    tenants = table(max_tenants=50, establish=2, idle=10.0)
    for k in range(200):
        for _ in range(2):
            tenants.admit(1.0, DEFAULT, k * 0.01, lambda: None, scope(f"t{k}"))
    assert len(tenants) == 50  # the rest stayed newcomers
    tenants.rebalance(100.0)
    assert len(tenants) == 0 and tenants.pools(100.0) == [tenants.newcomers]


@pytest.mark.slow
def test_a_million_tenant_keys_stay_within_the_bound() -> None:
    tenants = table(max_tenants=1000, establish=2)
    for k in range(1_000_000):  # every key seen once: all newcomers, a thousand remembered
        assert tenants.pool_of(f"key-{k}", k * 1e-5) is tenants.newcomers
    assert len(tenants) == 0 and len(tenants._candidates) == 1000
    for k in range(100_000):  # every key twice in a row: a thousand pools, the rest newcomers
        tenants.pool_of(f"again-{k}", 10.0 + k * 1e-5)
        tenants.pool_of(f"again-{k}", 10.0 + k * 1e-5)
    assert len(tenants) == 1000 and len(tenants._candidates) <= 1000


def test_the_memory_of_many_keys_does_not_grow_with_them() -> None:
    tenants = table(max_tenants=100, establish=2)
    tracemalloc.start()
    try:
        for k in range(2_000):
            tenants.pool_of(f"key-{k}", k * 1e-3)
        before = tracemalloc.get_traced_memory()[0]
        for k in range(2_000, 50_000):
            tenants.pool_of(f"key-{k}", k * 1e-3)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 50_000  # bytes: 48,000 more keys, the same hundred remembered


def test_newcomers_pool_is_not_a_tenant_name() -> None:
    tenants = table()
    assert tenants.pool_of(None, 0.0) is tenants.newcomers
    assert tenants.newcomers.name is NEWCOMERS


@pytest.mark.parametrize(
    ("field", "value"),
    [("key", "cookie"), ("key", "header:"), ("weights", {"a": 0}), ("weights", {"a": -1.0}), ("weights", [1]),
     ("max_tenants", 0), ("establish", 0), ("window", 0.0), ("interval", "1"), ("idle", -1.0),
     ("classify", 3), ("newcomer_weight", 0), ("newcomer_share", 0.95), ("newcomer_share", -0.1),
     ("open_below", 1.5), ("open_below", -0.1)],
)  # fmt: skip
def test_bad_tenancy_is_a_config_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field.split("_")[0]):
        Tenancy(**{field: value})  # type: ignore[arg-type]


def test_a_failing_tenant_function_makes_a_newcomer() -> None:
    def boom(scope: object) -> str:
        raise RuntimeError("no")

    assert naming(Tenancy(key=boom).key)({"type": "http", "headers": [(b"x-api-key", b"a")]}) is None


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    demands=st.lists(st.floats(10.0, 300.0), min_size=1, max_size=4),
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=4, max_size=4),
)
def test_under_overload_no_tenant_is_below_its_floor_and_the_sum_stays_within_the_capacity(
    demands: list[float], weights: list[float]
) -> None:
    names = [f"t{i}" for i in range(len(demands))]
    weight = dict(zip(names, weights, strict=False))
    tenants = table(weights=weight)
    run = Run(tenants)
    for name, rate in zip(names, demands, strict=True):
        run.send(name, 0, 20, rate)
    run.go()
    total = sum(run.admitted.values())
    end = max(20.0, run.last)  # (requests held at 20 s are admitted after it)
    burst = sum(pool.gate.pacer.burst for pool in tenants.pools(20.0)) + tenants.root.pacer.burst
    assert total <= 100 * end + burst * 2  # within the capacity (plus the buckets it started with)
    floors = fair_shares(100.0, dict(zip(names, demands, strict=True)), weight)
    for name in names:
        assert run.rate(name, 8, 20) >= 0.9 * floors[name] - 1


# -- the open table -------------------------------------------------------------------------------
def test_a_table_whose_tenants_ask_little_opens_and_admits_from_the_replicas_bucket_without_a_pool() -> None:
    """Below the capacity there is nothing to share out: after SPAN quiet reallocations (the tenants established
    and measured meanwhile) the table opens, and a request is admitted from the replica's bucket. (40/s of 100/s:
    at 50/s, exactly half, the sixth tenant's first request is turned away, the five woken before it each
    looking busy from its first request, and the table stays closed.)"""
    tenants = table(rate=100.0, open_below=0.5, establish=1)
    run = Run(tenants)
    for k in range(6):  # 40/s from six tenants for 6 s
        run.send(f"t{k}", k / 40, 6, 40 / 6)
    run.go()
    assert not tenants.closed and len(tenants) == 6
    assert all(pool.asked == 0 for pool in tenants.pools(6.0))  # (none asked: nothing was decided there)
    sent = sum(int((6 - k / 40) * 40 / 6) for k in range(6))
    assert sum(run.admitted.values()) == sent and tenants.root.pacer.taken >= sent * 3 / 6  # the bucket's, from 1.5 s
    assert tenants.limit_of(scope("t1"), 6.0) == (tenants.root.pacer, 100.0)  # (its fields: the replica's)


def test_the_request_that_finds_the_open_bucket_empty_closes_the_table_and_the_shares_are_fair_from_there() -> None:
    tenants = table(rate=100.0, open_below=0.5, establish=1)
    Run(tenants).send("modest", 0.0, 3, 30).go()
    assert not tenants.closed
    run = Run(tenants).send("greedy", 3.0, 9, 400).send("modest", 3.0, 9, 30).go()
    assert tenants.closed
    assert run.rate("modest", 4, 9) >= 0.97 * 30  # all it asks (its fair share is 50/s)
    assert run.rate("greedy", 4, 9) >= 0.9 * 70


def test_a_request_that_finds_no_room_in_flight_closes_the_open_table_and_is_held_in_its_tenants_pool() -> None:
    """No room under the in-flight limit is contention as an empty bucket is: the pools decide from then on. (Held
    on the replica's own gate instead, a herd's first wave took places in the replica's schedule, where its tenant's
    pool never saw them, and the table stayed open: the simulator's tenant herd drained at 1.087 of its bound, worst
    seed 1.368, against 1.054 without the limit.)"""
    root = Gate(
        LiveCapacity(Static(100.0), initial=100.0, inflight_floor=4), Settings(tarpit=0.0, max_pacing_delay=HOLD)
    )
    tenants = Tenants(Tenancy(open_below=0.5, establish=1), root)
    Run(tenants).send("modest", 0.0, 3, 30).go()
    assert not tenants.closed and root.pacer.tokens(3.0) >= 1  # open, with tokens to spare
    for _ in range(4):
        root.probes.admit(3.0)  # four in flight and none answered: the limit is reached
    assert root.full
    d = tenants.admit(1.0, DEFAULT, 3.0, lambda: "c1", scope("herd"))
    assert tenants.closed
    assert d.verdict is Verdict.PACE and d.room and d.pool is not None and d.pool is not root
    assert d.delay == pytest.approx(root.room_hold)  # (held for the rest of its window: woken when room comes)


def test_the_table_opens_again_once_the_tenants_ask_little_and_nobody_is_turned_away() -> None:
    tenants = table(rate=100.0, open_below=0.5, establish=1)
    Run(tenants).send("greedy", 0.0, 2, 20).go()
    assert not tenants.closed
    Run(tenants).send("greedy", 2.0, 4, 400).go()
    assert tenants.closed
    Run(tenants).send("greedy", 4.0, 6, 20).go()  # a fifth of the capacity, while the flood's holds end
    assert tenants.closed
    Run(tenants).send("greedy", 6.0, 9, 20).go()  # SPAN quiet reallocations in a row
    assert not tenants.closed


def test_the_tenants_who_asked_before_the_table_opened_keep_their_pools_however_long_it_stays_open() -> None:
    """A table open longer than ``idle`` (30 s): the small tenant still has its pool, with its share, when a herd
    in another tenant closes it, and is not turned away (as a newcomer, one of its two requests that second was)."""
    tenants = table(rate=100.0, open_below=0.5)
    Run(tenants).send("small", 0.0, 40, 2).send("big", 0.0, 40, 20).go()
    assert not tenants.closed and tenants._pools.get("small", 40.0) is not None
    run = Run(tenants).send("small", 40.0, 44, 2).send("big", 40.0, 44, 400).go()
    assert tenants.closed
    assert run.rate("small", 40, 44) == 2  # every one of its requests
    assert tenants.root.ledger.new == 0.0  # (open, the replica's own λ_new counts the tenants' new requests)


def test_the_fast_path_takes_nothing_from_a_pool_while_the_table_is_open() -> None:
    """Open, the replica's bucket decides: a pool's bucket, full and due no refresh, is not taken from (this
    once rested only on the pools' refresh falling due as the table opened, which nothing else promises)."""
    tenants = table(rate=100.0, open_below=0.5, establish=1)
    Run(tenants).send("a", 0.0, 3, 20).go()
    assert tenants.admit(1.0, DEFAULT, 3.0, lambda: None, scope("a")).verdict is Verdict.ADMIT  # (reallocated)
    assert not tenants.closed and tenants.next_rebalance > 3.01
    pool = tenants.pool_of("a", 3.01)
    assert pool.awake and pool.gate.pacer.tokens(3.01) >= 1
    pool.gate.next_refresh = math.inf  # as if its rate had just been read
    taken = pool.gate.pacer.taken
    tenants.try_take(1.0, 3.01, scope("a"))  # (open: the replica's bucket's answer)
    assert pool.asked == 0 and pool.gate.pacer.taken == taken


def test_clients_turned_away_keep_the_table_closed_whatever_they_are_counted_to_ask() -> None:
    """Requests that come back before their time are no demand; they are turned away, and that keeps the table
    closed (open, they would take the replica's bucket first come, first served)."""
    tenants = table(rate=100.0, open_below=0.5, establish=1)
    now, k = 0.0, 0
    while now < 6.0:  # 200/s from one client that ignores Retry-After, beside a modest tenant
        tenants.admit(1.0, DEFAULT, now, lambda: "pest", scope("pest"))
        if k % 10 == 0:
            tenants.admit(1.0, DEFAULT, now, lambda k=k: k, scope("modest"))
        now, k = now + 0.005, k + 1
    assert tenants.closed and tenants.rejections > 100


def test_a_pool_woken_as_the_table_closes_after_mu_moved_gets_its_share_in_the_units_of_the_others() -> None:
    """Open, a reallocation shares nothing out, and the pools keep their shares: parts of μ as of the last one
    before it opened (followed as μ moves, see Share). A pool that wakes as the table closes must be given its
    part of that same μ. The open reallocations took μ and the capacity to share out anew: after μ doubled, the
    waking pool was given half of the new capacity beside shares that still summed to the old one, which had
    doubled meanwhile (300/s on a 200/s replica until the next reallocation)."""
    source = Rate(100.0)
    tenants = Tenants(Tenancy(establish=1, open_below=0.5), Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD)))
    Run(tenants).send("a", 0.0, 3, 20).go()
    assert not tenants.closed
    source.value = 200.0  # the estimator doubles μ while the table is open
    Run(tenants).send("a", 3.0, 5, 20).go()
    assert not tenants.closed
    run = Run(tenants).send("a", 5.0, 5.4, 400).send("b", 5.0, 5.4, 400).go()
    assert tenants.closed and len(tenants) == 2
    rates = [pool.share.rate(5.4) for pool in tenants.pools(5.4) if pool.awake]
    assert sum(rates) <= 200.0 * 1.01
    assert run.admitted["a", 5] + run.admitted["b", 5] <= 200 + 2 * 10 + 2  # (the root's burst twice: the close)


def test_a_tenant_that_opens_and_closes_the_table_in_turn_gets_no_more_than_the_capacity() -> None:
    """While the table is open the pools' buckets refill beside the replica's, which admits, and while it is
    closed the replica's refills beside the pools': neither may then admit a burst of its own on top of what the
    other admitted. They did: one tenant that blasted the replica's bucket empty each time the table opened,
    then its own pool's, and kept a trickle between (its pool stayed awake, at all of the capacity), was admitted
    twice the burst at each close, and over a minute 7,683 requests on a 100/s replica whose burst is 200
    (bound: 6,200; 6,771 with the pools' buckets emptied at the close alone)."""
    root = Gate(100.0, Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=200.0))
    tenants = Tenants(Tenancy(establish=1, open_below=0.5), root)
    run = Run(tenants).send("a", 0.0, 60, 2)
    for start in range(5, 60, 3):
        run.send("a", start, start + 0.045, 10_000)  # 450 at once
    run.go()
    assert sum(n for (_, second), n in run.admitted.items() if second < 60) <= 100 * 60 + 200 + 10


def _admissions(tenants: Tenants, arrivals: list[tuple[float, str]], cost: float = 1.0) -> list[float]:
    """When each of ``arrivals`` (time, tenant; each of ``cost`` tokens) was admitted, decided as the middleware
    decides: the replica's bucket while the table is open, then the tenant's fast path, then admit (holds ended when
    they end)."""
    root, seq = tenants.root, itertools.count(len(arrivals))
    events: list[tuple[float, int, str, Decision | None]] = [(t, i, name, None) for i, (t, name) in
                                                             enumerate(arrivals)]  # fmt: skip
    heapq.heapify(events)
    admitted = []
    while events:
        now, _, name, held = heapq.heappop(events)
        if held is None:
            if not tenants.closed and now < root.next_refresh and root.pacer.try_take(cost, now):
                admitted.append(now)
                continue
            if tenants.try_take(cost, now, scope(name)):
                admitted.append(now)
                continue
            decision = tenants.admit(cost, DEFAULT, now, lambda: None, scope(name))
        else:
            after = tenants.end_hold(held, now)
            assert after is not None
            decision = after
        if decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), name, decision))
        elif decision.verdict is Verdict.ADMIT:
            admitted.append(now)
    return admitted


def _beyond(times: list[float], rate: float) -> float:
    """The most admissions in any interval beyond ``rate`` × its length (the bound is ``rate·t + burst``)."""
    most, low = -math.inf, math.inf
    for k, t in enumerate(sorted(times)):
        low = min(low, k - rate * t)
        most = max(most, k + 1 - rate * t - low)
    return most


@pytest.mark.parametrize(("tenants_", "period", "burst"), [(30, 3.0, 20), (100, 5.0, 10)])
def test_tenants_waking_in_turn_are_admitted_within_the_one_bucket(tenants_: int, period: float, burst: int) -> None:
    """Tenants each sending a burst at once every few seconds, in turn (each pool sleeps and wakes again and
    again), on 100/s with a burst of 10: what all the pools admit stays within rate·t + burst. With the wake-up
    credit refilled at all of μ beside the pools' buckets (a second bucket), tenants were admitted
    beyond rate·t + burst."""
    arrivals = [(c * period + i * period / tenants_ + j * 0.0005, f"t{i}")
                for c in range(int(30 / period)) for i in range(tenants_) for j in range(burst)]  # fmt: skip
    tenants = Tenants(
        Tenancy(establish=1, open_below=0.0), Gate(100.0, Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=10.0))
    )
    assert _beyond(_admissions(tenants, arrivals), 100.0) <= 10.0 + 1.0


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([10.0, 100.0]),
    st.sampled_from([5.0, 10.0, 50.0, 200.0]),
    st.lists(st.tuples(st.floats(0, 20), st.sampled_from("abc"), st.integers(1, 300), st.floats(0.05, 3)),
             min_size=1, max_size=10),
)  # fmt: skip
def test_across_openings_and_closings_admissions_stay_within_the_bound_the_closed_table_keeps(
    rate: float, burst: float, bursts: list[tuple[float, str, int, float]]
) -> None:
    """Any traffic (bursts of requests from three tenants, at any time): in no interval does the open table
    admit more beyond ``rate·t`` than the closed table does, or than the burst, give or take half a burst for a
    transition (each pool's bucket holds a token at least, whatever its part)."""
    arrivals = [(start + k * length / n, name) for start, name, n, length in bursts for k in range(n)]
    beyond = []
    for open_below in (0.0, 0.5):
        tenants = Tenants(
            Tenancy(establish=1, open_below=open_below),
            Gate(rate, Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=burst)),
        )
        beyond.append(_beyond(_admissions(tenants, arrivals), rate))
    assert beyond[1] <= max(beyond[0], burst) + burst / 2 + 6


# -- the middleware and the configuration ---------------------------------------------------------
def _app(clock: ManualClock, sleep, tenants: Tenancy | None) -> AdmitGate:
    async def ok(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return AdmitGate(ok, rate=10, tenants=tenants, clock=clock, sleep=sleep, wall_clock=lambda: 1e9,
                     settings=Settings(max_pacing_delay=0, tarpit=0), headers=HeaderPolicy(on_admit=True))  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_through_the_middleware_one_tenant_emptying_its_bucket_leaves_the_others_theirs(clock, sleep) -> None:
    """Tenant "greedy" sends 20 requests every 0.1 s, "modest" one just after it (10/s, a burst of one, no
    pacing): with tenants "modest" has its half from its tenant's first reallocation on (woken beside a pool that uses
    all of the capacity, it waits for that, within a tenth of the interval); with one bucket, first come
    first served, it has nothing."""

    async def run(app: AdmitGate) -> tuple[list[int], dict[str, str]]:
        modest, headers = [], {}
        for _ in range(20):
            for _ in range(20):
                await call(app, http_scope(headers=[(b"x-api-key", b"greedy")]))
            status, headers, _ = await call(app, http_scope(headers=[(b"x-api-key", b"modest")]))
            modest.append(status)
            clock.advance(0.1)
        return modest, headers

    modest, headers = await run(_app(clock, sleep, Tenancy(key="header:x-api-key", establish=1)))
    assert modest[2:].count(200) >= 8  # its 5/s of 10/s: every other tenth of a second
    assert headers["ratelimit-policy"] == '"admitgate";q=5;w=1'  # its entitlement: half of 10/s
    modest, _ = await run(_app(clock, sleep, None))  # the same without tenants
    assert modest.count(200) == 0


def test_with_metrics_and_a_typed_in_rate_every_pool_shares_the_replicas_probes() -> None:
    """Metrics give a typed-in rate probes (its latency and in-flight series); the newcomers' pool, built with the
    table, shares them as every later pool does (it was built before them and had none)."""
    app = AdmitGate(lambda s, r, c: None, rate=10, tenants=Tenancy(key="header:x-api-key"),  # type: ignore[arg-type]
                    metrics=CollectorRegistry())  # fmt: skip
    assert app.gate.probes is not None
    assert app.tenants is not None and app.tenants.newcomers.gate.probes is app.gate.probes


def test_a_bad_tenancy_fails_the_middleware_naming_it() -> None:
    with pytest.raises(ConfigError, match="tenants"):
        AdmitGate(lambda s, r, c: None, rate=10, tenants={"key": "address"})  # type: ignore[arg-type]


def test_tenants_from_the_file_and_the_environment(tmp_path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[tenants]\nkey = "address"\nweights = { premium = 3 }\nmax_tenants = 500\n')
    tenancy = load(path, env={"ADMITGATE_TENANTS_ESTABLISH": "5", "ADMITGATE_TENANTS_NEWCOMER_SHARE": "0.2"})["tenants"]
    assert tenancy == Tenancy(key="address", weights={"premium": 3.0}, max_tenants=500, establish=5, newcomer_share=0.2)
    env = {"ADMITGATE_TENANTS_KEY": "header:x-api-key", "ADMITGATE_TENANTS_WEIGHTS": '{"gold": 2}'}
    assert load(env=env)["tenants"] == Tenancy(key="header:x-api-key", weights={"gold": 2})
    path.write_text("[tenants]\nweights = { premium = 0 }\n")
    with pytest.raises(ConfigError) as info:
        load(path, env={})
    assert info.value.field == "tenants.weights['premium']"


def test_a_new_tenant_whose_share_is_held_by_others_gets_it_within_a_tenth_of_the_interval() -> None:
    tenants = table()
    now = 0.0
    for k in range(2):  # two requests without a key: the newcomers' pool asks, and holds all of the capacity
        now = k * 0.001
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope(None))
    for k in range(3):  # two newcomers' requests, then its pool (which takes them along as its own demand)
        now = 0.002 + k * 0.001
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("late"))
    assert tenants.newcomers.asked == 2 and tenants.pool_of("late", now).asked == 3
    assert tenants.next_rebalance <= now + 0.5 * 0.1
    run = Run(tenants).send("late", now, 5, 200).go()
    assert run.rate("late", 1, 5) >= 97


def test_a_tenant_whose_clients_come_in_bursts_keeps_its_share_between_them() -> None:
    """60 clients held together and sent back together every second: every other 0.5 s interval sees none of
    them. Judged interval by interval, the tenant would lose its share (and its schedule's pace) in each."""
    tenants = table()
    for step in range(600):  # 6 s; "modest" asks 100/s throughout
        now = step / 100
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("modest"))
        if step % 100 == 0:
            for c in range(60):
                tenants.admit(1.0, DEFAULT, now + c / 1000, lambda: None, scope("bursty"))
        if step >= 200:
            bursty = tenants.pool_of("bursty", now)
            assert bursty.demand > 20 and bursty.share.value > 20, (now, bursty.demand, bursty.share.value)


def test_retries_of_clients_that_ignore_retry_after_are_not_demand() -> None:
    tenants = table()
    for step in range(500):  # 5 s: "abuser" has 20 clients asking every 100 ms whatever they are told (holds
        # are never ended here: only the demand the table measures is looked at)
        now = step / 100
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("modest"))
        if step % 10 == 0:
            for c in range(20):
                tenants.admit(1.0, DEFAULT, now + c / 1000, lambda c=c: f"a{c}", scope("abuser"))
    abuser = tenants.pool_of("abuser", 5.0)
    assert abuser.gate.stats.early > 100  # many of its retries came early (told to wait, they did not) ...
    assert abuser.demand < 0.75 * 200  # ... and are not counted: it made 200 attempts/s


def test_a_pool_that_sheds_tells_the_live_estimator_that_demand_is_above_its_rate() -> None:
    """With tenants on, every decision is taken in a pool; the estimator learning μ reads the root's probes.
    Unless the pools report pacing and rejections there, it sees a gate that never limits (app-limited)
    and never raises μ past its first guess: a herd in one tenant then drained at 2.3× its bound."""
    from admitgate import BandwidthDelay, LiveCapacity

    source = LiveCapacity(BandwidthDelay(seed=1), initial=10)
    root = Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    tenants = Tenants(Tenancy(open_below=0.0, establish=1), root)
    for i in range(50):  # far above 10/s at one instant: paced, then rejected
        tenants.admit(1.0, DEFAULT, 0.0, lambda i=i: i, scope("big"))
    probes = source.probes
    probes.roll(probes.width)  # close the bucket they fell in
    assert probes.ring[-1].shed >= 40


def test_the_pools_rates_follow_the_capacity_between_reallocations_in_proportion() -> None:
    """A live estimator's start-up doubles μ in a second. Pools that followed it only at each reallocation held
    admissions below the rate it was testing, so it grew on, to 1.5 times the capacity in the simulator's tenant
    herd (drained at 1.104 of the bound, median of 16 seeds, worst 1.231; with it 1.077, worst 1.111)."""

    source = Rate(100.0)
    tenants = Tenants(
        Tenancy(open_below=0.0, establish=1, interval=0.5), Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    )
    Run(tenants).send("a", 0, 2, 150).send("b", 0, 2, 30).go()
    pools = tenants.pools(2.0)
    values = {pool.name: pool.share.value for pool in pools}
    assert values["a"] > 60 and values["b"] > 20  # (the shares of 100/s as of the last reallocation)
    source.value = 200.0
    tenants.root.next_refresh = 2.0
    tenants.root.refresh(2.0)  # μ doubles; no reallocation yet
    for pool in pools:
        pool.gate.next_refresh = 2.0
        pool.gate.refresh(2.0)
        assert pool.gate.pacer.rate == pytest.approx(2 * values[pool.name])
    tenants.root.backend = object()  # type: ignore[assignment]  # a shared budget: μ is a lease, moving each 0.1 s
    for pool in pools:
        assert pool.share.rate(2.0) == values[pool.name]


def test_a_cut_between_reallocations_comes_out_of_the_pools_not_given_all_they_ask() -> None:
    """Max-min fairness under a cut: a pool given all it asked keeps its rate while the others are left more per
    weight than it has; below that all are cut in proportion; the rates sum to the root's as before. Cut in
    proportion at each of the live estimator's re-measurements (¾ of μ for a few tenths of a second), a small tenant
    beside a herd's was cut below what it asked, and (in the simulator's tenant herd started at the capacity, seed
    7) one of its requests was turned away after waiting out its pacing window."""
    source = Rate(200.0)
    tenants = Tenants(
        Tenancy(open_below=0.0, establish=1, interval=0.5), Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    )
    Run(tenants).send("herd", 0, 2, 400).send("small", 0, 2, 10).go()
    pools = {pool.name: pool for pool in tenants.pools(2.0)}
    herd, small = pools["herd"].share, pools["small"].share
    assert small.kept and not herd.kept
    before = {name: pool.share.rate(2.0) for name, pool in pools.items()}
    assert 10 <= before["small"] < 20 < before["herd"]

    def cut(rate: float) -> dict[object, float]:
        source.value = rate
        tenants.root.next_refresh = 2.0
        tenants.root.refresh(2.0)  # no reallocation yet
        for pool in pools.values():
            pool.gate.next_refresh = 2.0
            pool.gate.refresh(2.0)
        return {name: pool.gate.pacer.rate for name, pool in pools.items()}

    after = cut(150.0)  # a re-measurement at ¾ of μ
    assert after["small"] == pytest.approx(before["small"])  # (in proportion: ¾ of it, under what it asks)
    assert after["herd"] == pytest.approx(before["herd"] - 0.25 * math.fsum(before.values()))  # (all of the cut)
    assert math.fsum(after.values()) == pytest.approx(0.75 * math.fsum(before.values()))
    after = cut(2.2 * before["small"])  # the herd's pool left more than the small one: the small keeps its rate
    assert after["small"] == pytest.approx(before["small"]) and after["herd"] > before["small"]
    after = cut(20.0)  # it would be left less: all in proportion
    assert after == pytest.approx({name: rate * 0.1 for name, rate in before.items()})
    after = cut(300.0)  # a rise: in proportion, as start-up's growth must be followed
    assert after == pytest.approx({name: rate * 1.5 for name, rate in before.items()})
    # a pool woken between reallocations is not known to be given all it asks: a cut comes out of it too
    small.unkeep(1.0)
    assert not small.kept
    assert cut(150.0) == pytest.approx({name: rate * 0.75 for name, rate in before.items()}, abs=1e-3)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.01, 500), st.floats(0.1, 5), st.booleans()), min_size=1, max_size=8),
    st.floats(0.01, 3.0),
)
def test_between_reallocations_the_pools_rates_sum_to_the_roots_and_a_cut_spares_the_kept_while_it_can(
    pools: list[tuple[float, float, bool]], ratio: float
) -> None:
    """For any shares (value, weight, given all it asked) and any move of the root's rate: the rates sum to the
    root's rate × their sum over the basis, as in proportion; a rise is in proportion; a kept pool is never cut
    more than in proportion, and while any is spared, each other pool keeps more per weight than any kept pool."""
    basis = 200.0
    root = Gate(Rate(basis), Settings(tarpit=0.0, max_pacing_delay=HOLD))
    split = Split()
    shares = []
    for value, weight, kept in pools:
        share = Share(value, value, 0.0, root, basis, split)
        share.kept = kept
        shares.append((share, weight))
    held = [share.value / weight for share, weight in shares if share.kept]
    others = [share.value / weight for share, weight in shares if not share.kept]
    split.held = math.fsum(share.value for share, _ in shares if share.kept)
    split.rest = math.fsum(share.value for share, _ in shares if not share.kept)
    split.high, split.low = max(held, default=0.0), min(others, default=math.inf)
    root.pacer.set_rate(basis * ratio, 0.0)
    rates = [(share.rate(0.0), share, weight) for share, weight in shares]
    total = math.fsum(share.value for share, _ in shares)
    assert math.fsum(rate for rate, _, _ in rates) == pytest.approx(total * ratio, rel=1e-9)
    for rate, share, _ in rates:
        assert rate >= 0
        if ratio >= 1 or share.kept:
            assert rate >= share.value * ratio * (1 - 1e-9)
    spared = [share for rate, share, _ in rates if share.kept and rate > share.value * ratio * (1 + 1e-9)]
    if spared:
        least = min(rate / weight for rate, share, weight in rates if not share.kept)
        assert least >= max(share.value / weight for share, weight in shares if share.kept) * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d", None]), st.floats(0.0, 0.05), st.one_of(st.none(), st.floats(5, 400))
        ),
        min_size=20,
        max_size=200,
    ),
    st.floats(0.1, 5.0),
)
def test_the_split_follows_the_pools_through_requests_wake_ups_and_moves_of_the_capacity(
    events: list[tuple[str | None, float, float | None]], weight: float
) -> None:
    """Driven through the table (requests of tenants that come and go, a keyless one, the capacity moving between
    reallocations): the split's sums are the live pools' kept and other shares, its least per weight is at most any
    other pool's, and the pools' rates sum to what they sum to in proportion (the root's rate now over μ at the last
    reallocation, times their shares): a cut is only shared differently."""
    source = Rate(200.0)
    tenants = Tenants(Tenancy(open_below=0.0, establish=1, interval=0.5, weights={"a": weight}),
                      Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD)))  # fmt: skip
    now = 0.0
    for name, gap, rate in events:
        now += gap
        if rate is not None:
            source.value = rate
            tenants.root.next_refresh = now
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope(name))
        pools = tenants.pools(now)
        split = tenants._split
        kept = [pool for pool in pools if pool.share.kept]
        others = [pool for pool in pools if not pool.share.kept]
        assert split.held == pytest.approx(math.fsum(pool.share.value for pool in kept), abs=1e-6)
        assert split.rest == pytest.approx(math.fsum(pool.share.value for pool in others), abs=1e-6)
        assert all(split.low <= pool.share.value / pool.weight * (1 + 1e-9) for pool in others)
        rates = [pool.share.rate(now) for pool in pools]
        assert all(rate >= 0 for rate in rates)
        ratio = tenants.root.pacer.rate / tenants._mu  # (every pool's basis: μ as of the last reallocation)
        assert all(pool.share.basis == tenants._mu for pool in pools)
        assert math.fsum(rates) == pytest.approx(ratio * (split.held + split.rest), rel=1e-9)  # as in proportion


def test_a_pool_woken_between_reallocations_gets_its_part_of_the_burst_at_the_shares_basis() -> None:
    """A pool's share is of μ as of the last reallocation, and its pacer follows the root's rate in proportion;
    its bucket is that same part of the root's burst. Sized by the root's rate now, a tenant woken after μ had
    halved (and the pool it reclaimed from) got twice their parts: 40 tokens at once where the root's is 20."""

    source = Rate(200.0)
    tenants = Tenants(
        Tenancy(open_below=0.0, establish=1, interval=0.5), Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    )
    Run(tenants).send("a", 0, 1.8, 100).go()  # "a" holds all of 200/s (its demand, 100/s, and room to grow)
    source.value = 100.0
    tenants.root.next_refresh = 1.9
    tenants.admit(1.0, DEFAULT, 1.9, lambda: None, scope("b"))  # μ halves; "b" wakes, before the next reallocation
    # ("a" uses all of the halved μ, so "b" is given nothing until a reallocation, and its first request, with no
    # token passed to it, is turned away: that reallocation is due, not done)
    assert tenants.next_rebalance >= 1.9
    awake = [pool for pool in tenants.pools(1.9) if pool.awake]
    assert {pool.name for pool in awake} == {"a", "b"}
    for pool in awake:
        pool.gate.next_refresh = 1.9
        pool.gate.refresh(1.9)
    assert math.fsum(pool.gate.pacer.rate for pool in awake) <= tenants.root.pacer.rate + MIN_RATE  # (b's floor)
    assert math.fsum(pool.gate.pacer.burst for pool in awake) <= tenants.root.pacer.burst + 1  # (was 40; b's one)


def test_a_waking_tenant_takes_back_only_what_the_others_do_not_use_in_requests_per_second_now() -> None:
    """Between reallocations a share is a part of μ as of the last one (see Share), and what a pool uses is
    measured in requests/s: a tenant woken after μ had halved cut the pool using all of it (100/s) to 63/s."""
    source = Rate(200.0)
    tenants = Tenants(
        Tenancy(open_below=0.0, establish=1, interval=0.5), Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    )
    Run(tenants).send("a", 0, 1.8, 100).go()
    source.value = 100.0
    tenants.root.next_refresh = 1.9
    tenants.admit(1.0, DEFAULT, 1.9, lambda: None, scope("b"))  # μ halves; "b" wakes, before the next reallocation
    [a] = [pool for pool in tenants.pools(1.9) if pool.name == "a"]
    assert a.demand == pytest.approx(100.0, rel=0.05)
    assert a.share.rate(1.9) >= min(a.demand, tenants.root.pacer.rate) - 1e-9  # (was 63)


def test_a_pools_holds_follow_the_roots_risen_rate_when_no_new_request_comes_to_refresh_it() -> None:
    """A herd held at once in its tenant's pool is decided again only at its wake-ups, which the pool's gate
    ends (refreshing its rate), and its rate follows the root's. The root was refreshed only by a new request:
    μ doubled, and the herd went in at the first μ to its last hold (0.5 s where 0.3 s does). The holds sleep past
    their tokens (due sooner at the risen rate) to the next look (0.25 s), and the replica's bucket, full meanwhile,
    lets in its burst at once and the rest at μ: 0.33 s. (Without that bucket the pool let in all it owed at once,
    and 0.3 s was exact.)"""

    source = Rate(100.0)
    root = Gate(source, Settings(tarpit=0.0, max_pacing_delay=1.0, refresh_interval=0.1))
    tenants = Tenants(Tenancy(open_below=0.0, establish=1, interval=0.5), root)
    held = [tenants.admit(1.0, DEFAULT, 0.0, lambda: None, scope("a")) for _ in range(60)]
    assert sum(d.verdict is Verdict.PACE for d in held) == 50  # its burst of 10 in; 50 tokens reserved at 100/s
    source.value = 200.0  # the estimator doubles μ; nobody asks again
    wakes = [(d.delay, i) for i, d in enumerate(held) if d.delay]
    heapq.heapify(wakes)
    last = 0.0
    while wakes:
        at, i = heapq.heappop(wakes)
        after = tenants.end_hold(held[i], at)
        assert after is not None
        held[i] = after
        if after.delay:
            heapq.heappush(wakes, (at + after.delay, i))
        else:
            assert after.verdict is Verdict.ADMIT
            last = max(last, at)
    assert root.pacer.rate == 200.0
    assert last <= 0.1 + 40 / 200 + 0.035  # read at the wake-up at 0.1 s: where it slept to 0.5


def test_a_tenant_established_while_the_capacity_is_idle_is_not_turned_away() -> None:
    """The newcomers' pool held all of an idle capacity; a tenant established on its third request found no
    rate left until the next reallocation, and its fourth and fifth requests were rejected at 1e6/s."""
    tenants = table(rate=1e6)
    verdicts = [tenants.admit(1.0, DEFAULT, 0.001 * i, lambda: None, scope("acme")).verdict for i in range(10)]
    assert verdicts == [Verdict.ADMIT] * 10
    assert tenants.pool_of("acme", 0.01).share.value > 1000


def test_a_tenant_established_after_an_idle_spell_is_not_turned_away() -> None:
    """A server's first requests come after its table's first reallocation was due: the reallocation on the
    first request found nobody asking, the newcomers' pool woke on the key's first request with all of the
    capacity, and the key's pool, established on its third, found nothing to take back until the next one:
    on a real server at 1e9/s, 32 of the first 1,600 requests were rejected."""
    tenants = table(rate=1e6)
    verdicts = [tenants.admit(1.0, DEFAULT, 5.0 + 0.001 * i, lambda: None, scope("acme")).verdict for i in range(10)]
    assert verdicts == [Verdict.ADMIT] * 10


def test_a_tenant_waking_after_another_takes_back_what_the_first_does_not_use() -> None:
    """Two tenants idle through a reallocation wake one after the other: the first is given all of the capacity
    (it is alone), the second takes back what the first does not use (its one request in 0.11 s, with room to
    grow), as from a pool the reallocation found with a rate to spare: more than its half."""
    tenants = table(rate=100.0, establish=1)
    for name in ("a", "b"):
        tenants.admit(1.0, DEFAULT, 0.0, lambda: None, scope(name))
    for now in (0.5, 1.0, 1.5, 2.0):  # reallocations with nobody asking: every pool asleep
        tenants.rebalance(now)
    assert not any(pool.awake for pool in tenants.pools(2.0))
    tenants.admit(1.0, DEFAULT, 2.1, lambda: None, scope("a"))
    assert tenants.pool_of("a", 2.1).share.value == pytest.approx(100.0)
    first = tenants.admit(1.0, DEFAULT, 2.11, lambda: None, scope("b"))
    a, b = tenants.pool_of("a", 2.11).share.value, tenants.pool_of("b", 2.11).share.value
    assert first.verdict is Verdict.ADMIT  # (a's bucket gave up its tokens with its rate: they passed to b)
    assert a == pytest.approx(1 / 0.11 * SLACK + 1.0) and a + b == pytest.approx(100.0)


def test_a_herd_waking_beside_a_small_tenant_is_given_all_that_the_small_one_leaves() -> None:
    """A herd's tenant wakes between reallocations beside a small tenant (10/s) and the newcomers' pool: it is
    given what they leave unused at once, not its entitlement of a third. Given a third, it held a third as many
    of its first wave in its pacing window, and had nobody to admit at the rate the next reallocation gave it."""
    tenants = table(rate=100.0, establish=1)
    for i in range(20):  # the small tenant alone for 2 s, at 10/s
        tenants.admit(1.0, DEFAULT, 0.1 * i, lambda i=i: i, scope("small"))
    tenants.admit(1.0, DEFAULT, 2.0, lambda: "n", scope(None))  # a newcomer
    decisions = [tenants.admit(1.0, DEFAULT, 2.01, lambda i=i: i, scope("herd")) for i in range(300)]
    herd, small = tenants.pool_of("herd", 2.01), tenants.pool_of("small", 2.01)
    assert herd.share.value >= 100.0 - (small.demand * SLACK + 1.0) - (1 / 0.05 * SLACK + 1.0) - 1e-9
    assert sum(pool.share.value for pool in tenants.pools(2.01)) <= 100.0 + 3 * MIN_RATE  # (an idle pool's floor)
    paced = sum(d.verdict is Verdict.PACE for d in decisions)
    assert paced >= 0.5 * 1.5 * 100.0  # (its pacing window, 1.5 s, at well over half of the capacity)


def test_tenants_waking_together_take_no_more_at_once_than_the_one_bucket_holds() -> None:
    """500 tenants' first requests at the same instant (100/s, a burst of 10): what goes in at once is the
    root's burst, as without tenants; each new pool's bucket was full, and all 500 went in. The others are
    paced or told to come back, and the first tokens of the pools left without any are spread over their
    spacing, not all due at once."""
    tenants = table(rate=100.0, establish=1)
    decisions = [tenants.admit(1.0, DEFAULT, 1.0, lambda i=i: i, scope(f"t{i}")) for i in range(500)]
    assert sum(d.verdict is Verdict.ADMIT for d in decisions) <= 10
    fractions = sorted(max(0.0, pool.gate.pacer.tokens(1.0)) % 1.0 for pool in tenants.pools(1.0))
    assert fractions[-1] - fractions[0] > 0.9 and len(set(fractions)) > 400


def test_the_pools_holds_are_counted_with_the_roots_for_metrics() -> None:
    """Pools expire; what they paced must not vanish from a counter with them: they count into the root's."""
    tenants = table(rate=10.0)
    for i in range(30):
        tenants.admit(1.0, DEFAULT, 0.0, lambda i=i: i, scope("acme"))
    pool = tenants.pool_of("acme", 0.0)
    assert pool.gate.stats.pacing is tenants.root.stats.pacing
    assert tenants.root.stats.paced > 0 and tenants.root.stats.pacing.seconds > 0


def test_a_waking_tenant_finds_the_spare_share_behind_any_number_of_idle_pools() -> None:
    """The share to take back is held by a busy pool behind 200 idle (not yet expired) ones: a scan of the
    first few pools found only idle ones, and the waking tenant was rejected at an idle capacity."""
    tenants = table(rate=1e6, establish=1)
    for i in range(200):  # seen once, then quiet (they expire only after `idle`)
        tenants.admit(1.0, DEFAULT, 0.001, lambda: None, scope(f"idle-{i}"))
    now = 0.0
    while now < 4.0:  # "big" asks 10/s and holds the idle capacity
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("big"))
        now += 0.1
    verdicts = [tenants.admit(1.0, DEFAULT, now + k / 1000, lambda: None, scope("late")).verdict for k in range(10)]
    assert verdicts == [Verdict.ADMIT] * 10


def test_places_beyond_max_retry_after_in_a_tenants_schedule_are_counted_with_the_roots() -> None:
    """The schedule-overflow counter (metrics read the root's stats) covers the tenants' schedules."""
    root = Gate(10.0, Settings(tarpit=0.0, max_pacing_delay=HOLD, max_retry_after=5))
    tenants = Tenants(Tenancy(open_below=0.0, establish=1), root)
    decisions = [tenants.admit(1.0, DEFAULT, 0.0, lambda k=k: f"c{k}", scope("a")) for k in range(200)]
    assert max(d.retry_after for d in decisions) <= 5
    pool = tenants.pool_of("a", 0.0)
    assert pool.gate.stats.overflow > 100 and root.stats.overflow == pool.gate.stats.overflow


def _once(tenants: Tenants, tenant: str | None, clients: int) -> None:
    """``clients`` of ``tenant`` ask once at t = 0 and never come back; those held are let in or turned away when
    their holds end, as the middleware ends them."""
    first = [tenants.admit(1.0, DEFAULT, 0.0, lambda k=k: f"{tenant}{k}", scope(tenant)) for k in range(clients)]
    held = sorted((d.delay, k, d) for k, d in enumerate(first) if d.delay)
    while held:
        at, k, decision = held.pop(0)
        after = tenants.end_hold(decision, at)
        if after is not None and after.delay:
            held = sorted([*held, (at + after.delay, k, after)])


def test_a_light_tenant_beside_a_busy_one_is_served_on_its_first_try() -> None:
    """A tenant asking once every 2 s beside one asking 200/s of 100/s: its pool sleeps between its requests, and
    wakes to no rate (the busy one holds all of it) until the shares are recomputed a moment later. It takes the
    rate it asks from the busy pool, so its request is held a moment and served; it was turned away every time,
    told Retry-After 1, though max-min fairness gives it all it asks. (Its first request, its pool new, is not: a
    new pool's demand is not known.)"""
    run = Run(table(rate=100.0, establish=1)).send("busy", 0, 12, 200).send("light", 1, 12, 0.5).go()
    assert [run.admitted["light", s] for s in range(3, 11, 2)] == [1, 1, 1, 1]
    assert run.rate("busy", 3, 11) >= 0.97 * (100 - 0.5)


def test_fifty_light_tenants_beside_a_busy_one_leave_it_what_they_do_not_use() -> None:
    """Fifty tenants each asking once every 2 s beside one asking 200/s of 100/s (rejected requests are not sent
    again here): each light pool sleeps and wakes, and every wake-up recomputes the shares within a tenth of the
    interval. 42 of 100/s were admitted, none of the light tenants' requests among them; then 78, the light tenants
    served 8 of the 25/s they ask on their one try; then 93.5 (20.75 of them light); now 99.9, the busy tenant's
    requests going in on what the light pools leave in the replica's bucket (see Gate.admit, SPARE)."""
    run = Run(table(rate=100.0, establish=1)).send("busy", 0, 12, 200)
    for i in range(50):
        run.send(f"l{i}", i * 2 / 50, 12, 0.5)
    run.go()
    light = sum(run.rate(f"l{i}", 4, 12) for i in range(50))
    assert light >= 20.0 and light + run.rate("busy", 4, 12) >= 99.0
    tenants = run.tenants  # what went in so is the busy tenant's, counted by the table as by its pool (metrics)
    spare = {pool.name: pool.gate.stats.spare for pool in tenants.pools(12.0)}
    assert tenants.spare == spare["busy"] == sum(spare.values()) >= 100


def test_one_request_just_after_a_reallocation_is_not_measured_as_a_surge() -> None:
    """A pool woken short of its entitlement has the shares recomputed within a tenth of the interval. Measured
    over that tenth alone, its one request was 20/s, believed at once as a surge, and took a fifth of the busy
    tenant's share (80 of 100/s left it); it is measured over the interval before it too."""
    tenants = table(rate=100.0, establish=1)
    seen: list[tuple[float, float, float]] = []
    rebalance = tenants.rebalance

    def watched(now: float) -> None:
        rebalance(now)
        pools = {pool.name: pool for pool in tenants.pools(now)}
        if "light" in pools:
            seen.append((now, pools["light"].demand, pools["busy"].share.value))

    tenants.rebalance = watched  # type: ignore[method-assign]
    Run(tenants).send("busy", 0, 6, 200).send("light", 1.0, 1.01, 101).send("light", 5.0, 5.01, 101).go()
    now, demand, busy = next(item for item in seen if item[0] > 5.0)
    assert now < 5.1  # (recomputed within a tenth of the interval: the case in point)
    assert demand <= 1 / tenants.tenancy.interval + 1e-9 and busy >= 97.0


@pytest.mark.parametrize(
    ("counts", "spans", "expected"),
    [
        ([5.0, 5.0, 1.0], [0.5, 0.5, 0.05], (6.0 / 0.55, None, False)),  # one in 0.05 s: the interval before too
        ([0.0] * 40 + [1.0], [0.05] * 41, (1.0 / 0.55, 1.0 / 1.5, True)),  # every tenth: back to 0.5 s and 1.5 s
        ([1.0], [0.05], (20.0, None, False)),  # a new pool: what it has (no fall judged from it)
        ([30.0, 30.0, 30.0, 30.0], [0.5] * 4, (60.0, 60.0, False)),
        ([0.0, 0.0, 0.0, 1.0], [0.5] * 4, (2.0, 1.0 / 1.5, True)),  # one request in 1.5 s: lone
        ([0.0, 1.0, 0.0, 1.0], [0.5] * 4, (2.0, 2.0 / 1.5, False)),  # two: a rate
        ([0.0, 0.0, 0.0, 3.0], [0.5] * 4, (6.0, 3.0 / 1.5, False)),  # three at once: a rate
    ],
)
def test_what_a_pool_asked_is_measured_back_to_an_interval_and_to_span_intervals(
    counts: list[float], spans: list[float], expected: tuple[float, float | None, bool]
) -> None:
    recent, span, lone = _rates(deque(counts, maxlen=HISTORY), deque(spans, maxlen=HISTORY), 0.5)
    assert recent == pytest.approx(expected[0])
    assert span == (None if expected[1] is None else pytest.approx(expected[1]))
    assert lone is expected[2]


def test_a_busy_tenant_loses_nothing_to_holds_a_small_cut_turns_away() -> None:
    """A tenant asking 400/s beside one asking 30/s of 100/s: its clients stand 1.5 s deep in its pacing window,
    and each small move of its share turned the tail's holds away, their tokens unused (54-67 of its 70/s in
    seconds 5-7). Their places now go to the next requests held. (The modest tenant's room to grow, which it does
    not use, reaches the busy one through the replica's bucket, a few tokens at a time.)"""
    tenants = table(rate=100.0, open_below=0.5, establish=1)
    Run(tenants).send("modest", 0.0, 3, 30).go()
    run = Run(tenants).send("greedy", 3.0, 9, 400).send("modest", 3.0, 9, 30).go()
    greedy = [run.admitted["greedy", s] for s in range(4, 9)]
    assert sum(greedy) == 5 * 70 and all(abs(n - 70) <= 1 for n in greedy), greedy


def test_light_tenants_waking_together_beside_a_busy_one_are_admitted_within_the_one_bucket() -> None:
    """Sixty light tenants, each seen once, ask again together beside one that holds all of 100/s (a burst of 10):
    each takes its rate from the busy one, so what all admit stays within rate·t + burst. (Lent tokens as a debt
    in the busy pool's bucket instead, 30 were lent, the next reallocation's deep cut forgave the debt, and more
    than rate·t were admitted in one stretch.)"""
    arrivals = [(k / 200.0, "busy") for k in range(8 * 200)]
    for i in range(60):
        arrivals += [(1.0 + i * 0.01, f"l{i}"), (5.0 + i * 0.0002, f"l{i}")]
    tenants = Tenants(
        Tenancy(establish=1, open_below=0.0), Gate(100.0, Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=10.0))
    )
    assert _beyond(_admissions(tenants, arrivals), 100.0) <= 10.0 + 1.0


def test_tenants_established_together_beside_a_busy_one_are_measured_over_what_they_asked_as_newcomers() -> None:
    """Fifty light tenants, each asking once every 2 s, become tenants on their third request (seconds 4-6) beside
    one asking 200/s of 100/s. A new pool's demand is measured from its requests as a newcomer on: measured from
    the moment since the last reallocation alone, each was one request in 0.05 s, 20/s, the busy pool was cut to
    its entitlement, and the table admitted 12, 8 and 27 requests in seconds 4, 5 and 6."""
    tenants = Tenants(Tenancy(open_below=0.0), Gate(100.0, Settings(tarpit=0.0, max_pacing_delay=HOLD)))
    arrivals = [(k / 200.0, "busy") for k in range(10 * 200)]
    for i in range(50):
        arrivals += [(i * 2.0 / 50 + 2.0 * c, f"l{i}") for c in range(5)]
    per = Counter(int(t) for t in _admissions(tenants, arrivals))
    assert all(per[second] >= 70 for second in range(4, 10)), per


def test_light_tenants_keep_their_pools_between_their_requests_and_are_served_after_mu_is_cut() -> None:
    """Fifty tenants asking once every 2 s beside one asking 300/s; μ falls from 100 to 25/s at 10 s, back at 20 s.
    The light tenants ask all of the 25/s, and max-min gives it them. A tenant asking less often than a fall is
    judged over keeps asking one period's cost per period: judged over the last three intervals alone, each pool
    slept between its requests and woke to no rate, nobody could lend it one (the busy pool was at its
    entitlement), and the table admitted 1-3 requests a second."""

    class Cut:
        def rate(self, now: float) -> float:
            return 25.0 if 10.0 <= now < 20.0 else 100.0

    tenants = Tenants(
        Tenancy(establish=1, open_below=0.0),
        Gate(Cut(), Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=10.0, growth=0.0)),
    )
    arrivals = [(k / 300.0, "busy") for k in range(22 * 300)]
    for i in range(50):
        arrivals += [(i * 2.0 / 50 + k * 2.0, f"l{i}") for k in range(11)]
    per = Counter(int(t) for t in _admissions(tenants, arrivals))
    assert all(per[second] >= 15 for second in range(11, 20)), per


def test_light_tenants_each_asking_once_in_a_while_leave_the_rest_of_the_capacity_to_a_busy_one() -> None:
    """Fifty tenants asking once every 2 s (25/s together) beside one asking 300/s of 100/s: max-min gives the light
    ones what they ask and the busy one the rest, so the table admits the capacity. One request alone in the
    intervals a fall is judged over is no surge: believed, each light pool was measured at 2/s in the interval it
    asked and at 0.67/s in the two after, given 0.96/s on average for its 0.5/s, and the table admitted 78 a
    second, the rest of the capacity held for nobody (94.7 with the rule, 98.5 since the pools' admissions are
    bounded by the replica's bucket and held light requests are no exception to it; 100.4 since what the light pools
    leave there goes to the busy one, within rate·t + burst)."""
    tenants = table(rate=100.0)
    arrivals = [(k / 300.0, "busy") for k in range(20 * 300)]
    for i in range(50):
        arrivals += [(i * 2.0 / 50 + k * 2.0, f"l{i}") for k in range(10)]
    times = _admissions(tenants, arrivals)
    assert sum(8.0 <= t < 20.0 for t in times) >= 0.995 * 100 * 12
    assert _beyond(times, 100.0) <= 10.0 + 1.0  # (the burst of 10 the table's default gate has)


@pytest.mark.parametrize(("light", "busy", "period"), [(20, 90.0, 4.0), (120, 90.0, 4.0), (60, 120.0, 1.0)])
def test_light_tenants_coming_back_in_turn_are_admitted_within_the_one_bucket(light: int, busy: float,
                                                                               period: float) -> None:  # fmt: skip
    """Light tenants each asking once every ``period`` beside a busy one keep their pools awake between their
    requests, each with a bucket of at least one token: the pools' buckets held more between them than the
    replica's burst, and what they admitted ran beyond rate·t + burst by about a request per light tenant.
    Every admission is charged to the replica's bucket too (Gate.guard)."""
    arrivals = [(k / busy, "busy") for k in range(int(20 * busy))]
    for i in range(light):
        arrivals += [(1.0 + i * 0.01 + k * period, f"l{i}") for k in range(int(19 / period))]
    tenants = Tenants(
        Tenancy(establish=1, open_below=0.0), Gate(100.0, Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=10.0))
    )
    assert _beyond(_admissions(tenants, arrivals), 100.0) <= 10.0 + 1.0


def _obeying(tenants: Tenants, clients: list[tuple[float, str, bool]], end: float) -> tuple[list[tuple[float, str]],
                                                                                          Counter[str]]:  # fmt: skip
    """Clients (first request time, tenant, obeys) each sending one request until served, decided as the middleware
    decides: one that obeys comes back when told, one that does not is gone. Returns (time, tenant) admitted and
    the 429s per tenant."""
    seq = itertools.count()
    events: list[tuple[float, int, str, int, bool, Decision | None]] = [
        (t, i, name, i, obeys, None) for i, (t, name, obeys) in enumerate(clients)
    ]
    heapq.heapify(events)
    admitted: list[tuple[float, str]] = []
    rejected: Counter[str] = Counter()
    while events:
        now, _, name, client, obeys, held = heapq.heappop(events)
        if now > end:
            break
        if held is not None:
            after = tenants.end_hold(held, now)
            assert after is not None
            decision: Decision | None = after
        elif tenants.try_take(1.0, now, scope(name)):
            decision = None
        else:
            decision = tenants.admit(1.0, DEFAULT, now, lambda c=client: c, scope(name))  # type: ignore[misc]
        if decision is not None and decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), name, client, obeys, decision))
        elif decision is None or decision.verdict is Verdict.ADMIT:
            admitted.append((now, name))
        else:
            rejected[name] += 1
            if obeys:
                heapq.heappush(events, (now + decision.retry_after, next(seq), name, client, obeys, None))
    return admitted, rejected


@pytest.mark.parametrize("herd", [False, True])
def test_a_tenant_asking_every_few_seconds_that_bursts_is_measured_again_and_gives_its_share_back(herd: bool) -> None:
    """Tenant "x" asks once every 8 s (its pool keeps a token per period between), then 300 clients of it come at
    once beside a busy tenant asking 200/s of 100/s: sent once (a burst, then silence) or obeying Retry-After (a
    herd). Its clients are turned away at or below the demand it was measured at, so it is measured again within a
    tenth of the interval, as a pool waking is, and each herd client is turned away once. When they are done the
    busy tenant has the capacity back. (With what it asked at its last reallocation kept per period, the burst held
    half the capacity unused for 1.5 periods, the busy tenant served 528 where 880 are; the herd's clients were
    turned away again and again.)"""
    clients = [(k / 200.0, "busy", False) for k in range(30 * 200)]
    clients += [(k * 0.01, "x", False) for k in range(3)] + [(8.0, "x", False)]
    clients += [(10.2 + j * 1e-5, "x", herd) for j in range(300)]
    tenants = Tenants(Tenancy(open_below=0.0), Gate(100.0, Settings(tarpit=0.0, max_pacing_delay=HOLD)))
    admitted, rejected = _obeying(tenants, clients, 30.0)
    busy = [t for t, name in admitted if name == "busy"]
    if herd:
        assert rejected["x"] <= 300 and sum(name == "x" and t >= 10.2 for t, name in admitted) == 300
        assert sum(20.0 <= t < 30.0 for t in busy) >= 990
    else:
        assert sum(10.2 <= t < 20.0 for t in busy) >= 850


def test_light_tenants_waking_take_their_rate_from_a_busy_one_without_cutting_it_into_a_new_epoch() -> None:
    """Sixty light tenants wake together beside a busy one at all of 100/s: each takes its rate from the busy pool,
    down to its entitlement but never below half its epoch's rate (a deeper cut starts a new epoch: its holds, the
    deepest queue of all, reserve again and the tail is turned away; it went from 100/s to 40)."""
    tenants = table(rate=100.0, establish=1)
    run = Run(tenants).send("busy", 0, 4.99, 200)
    for i in range(60):
        run.send(f"l{i}", 1.0 + i * 0.01, 1.01 + i * 0.01, 101)  # (one request each: seen, then asleep)
    run.go()
    busy = tenants._pools.get("busy", 4.99)
    assert busy is not None
    epoch = busy.gate.pacer.epoch
    for i in range(60):
        tenants.admit(1.0, DEFAULT, 5.0 + i * 0.0002, lambda: None, scope(f"l{i}"))
    assert tenants.next_rebalance > 5.012  # (before the reallocation the wake-ups asked for)
    assert busy.gate.pacer.epoch == epoch and busy.gate.pacer.rate >= 50.0
    assert sum(pool.share.value for pool in tenants.pools(5.012)) <= 100.0 + len(tenants) * 1e-3


def test_a_light_tenant_given_what_it_asks_as_it_wakes_asks_for_no_early_reallocation() -> None:
    """A light tenant waking takes what it asks from the busy pool (``_borrow``): the shares are not recomputed early
    for it (they were, as for a pool short of its entitlement: fifty such tenants had the shares recomputed about
    twelve times a second, each time cutting a woken pool back to its measured demand, and its held request was
    turned away at its end: 72 % of their first tries served in ``bench/light_tenants.py``, now 94 %)."""
    tenants = table(rate=100.0, establish=1)
    Run(tenants).send("busy", 0, 4.99, 200).send("light", 1.0, 1.01, 101).go()  # (one request: seen, then asleep)
    light = tenants._pools.get("light", 4.99)
    assert light is not None and not light.awake and light.seen > -math.inf
    now, due = 4.99, tenants.next_rebalance
    assert due > now + tenants.tenancy.interval * 0.1  # (an early one would come sooner)
    tenants.admit(1.0, DEFAULT, now, lambda: None, scope("light"))
    assert light.awake and light.share.value >= light.demand * 1.25 + 1.0 - 1e-9
    assert tenants.next_rebalance == due


def test_fifty_light_tenants_held_beside_a_busy_one_are_not_cut_into_a_new_epoch_and_turned_away() -> None:
    """Fifty tenants asking once every 2 s beside one asking 200/s of 100/s. A light pool holding its request was cut
    at the regular reallocation to what it was measured to ask (about 2/s to 0.67/s: a new epoch), and its held
    request turned away. A pool with holds keeps half its epoch's rate."""
    run = Run(table(rate=100.0, establish=1)).send("busy", 0, 14, 200)
    for i in range(50):
        run.send(f"l{i}", 1.0 + i * 0.04, 13.0 + i * 0.04, 0.5)  # (six requests each; the first, its pool new)
    run.go()
    served = sum(count for (tenant, second), count in run.admitted.items() if tenant != "busy" and second >= 3)
    assert served >= 0.98 * 250


def test_a_tenant_asking_every_half_second_keeps_its_demand_through_the_first_reallocation_after_a_close() -> None:
    """A pool's history starts afresh when the table closes, and the first reallocation after it comes 0.19 s
    later: a fall is not judged from so short a history (it was: the small tenant's demand went to 0 and its pool
    to sleep)."""
    tenants = table(rate=100.0, open_below=0.5)
    Run(tenants).send("small", 0.0, 40, 2).send("big", 0.0, 40, 20).go()
    assert not tenants.closed
    Run(tenants).send("big", 40.0, 40.3, 400).go()  # closes at 40.03, reallocated at 40.22
    assert tenants.closed
    small = tenants._pools.get("small", 40.3)
    assert small is not None and small.awake and small.demand > 1.0


@pytest.mark.slow
def test_clients_who_gave_up_are_no_demand() -> None:
    """Places held by clients who never come back do not keep their pool's share: not a newcomers' flood's
    (that pool never expires), not an established tenant's herd's (before it idles out)."""
    tenants = table(100.0)
    _once(tenants, None, 5000)  # 5,000 keyless bots rejected once, never back
    run = Run(tenants).send("a", 0, 30, 200).send("b", 0, 30, 200).go()
    assert run.rate("a", 5, 30) + run.rate("b", 5, 30) >= 97  # (was 66.7: a third held for the bots)

    tenants = table(100.0, establish=1)
    _once(tenants, "x", 300)  # tenant x: a herd rejected at t = 0 that leaves
    run = Run(tenants).send("a", 0, 30, 200).send("b", 0, 30, 200).go()
    assert run.rate("a", 5, 30) + run.rate("b", 5, 30) >= 97  # (was 66.4 until x idled out at 30 s)


def test_the_rate_limit_fields_show_a_tenants_entitlement_not_the_rate_its_retry_after_is_timed_at() -> None:
    """``q`` on an admitted response is the tenant's weighted share among the tenants asking (what it is sure
    of), not what its schedule promises while the others leave capacity unused."""
    tenants = table(300.0)
    now = 0.0
    for k in range(50):  # three tenants established: s1 and s2 ask 10/s, the herd's 1/s
        now = k / 10
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("s1"))
        tenants.admit(1.0, DEFAULT, now + 0.01, lambda: None, scope("s2"))
        if k % 10 == 0:
            tenants.admit(1.0, DEFAULT, now, lambda: None, scope("herd"))
    for k in range(2000):
        tenants.admit(1.0, DEFAULT, now, lambda k=k: f"h{k}", scope("herd"))
    for _ in range(10):
        now += 0.1
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("s1"))
        tenants.admit(1.0, DEFAULT, now, lambda: None, scope("s2"))
    assert tenants.limit_of(scope("s1"), now)[1] == pytest.approx(100.0)  # 300 / 3 (was 186.5: μ less the others)
    assert tenants.pool_of("herd", now).share.capacity > 250  # its Retry-After: μ less what s1 and s2 use


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.floats(0.0, 0.02), st.floats(0.1, 1.5)),
            st.sampled_from(["a", "b", "c", None]),
            st.integers(0, 5),
        ),
        min_size=1,
        max_size=400,
    ),
    st.sampled_from([10.0, 100.0]),
)  # crowds and lulls; at 100/s steady traffic below the rate too
def test_the_fast_path_agrees_with_admit(steps: list[tuple[float, str | None, int]], rate: float) -> None:
    """Tenants.take (the middleware's admit path with tenants) admits exactly what Tenants.admit would have
    admitted at once, and leaves the table as admit leaves it; anything else is left to admit. Clients are
    recognised (a rejected one holds a place), and the rates move as the shares are reallocated."""
    one, two = table(rate=rate, establish=2, interval=0.5), table(rate=rate, establish=2, interval=0.5)
    _side_by_side(one, two, steps)


def test_the_fast_path_agrees_with_admit_under_steady_traffic_below_the_rate() -> None:
    """The fast path's own case: nobody is rejected, and reallocations come due between requests."""
    one, two = table(rate=100.0, establish=1, interval=0.5), table(rate=100.0, establish=1, interval=0.5)
    _side_by_side(one, two, [(0.013, "ab"[i % 2], 0) for i in range(300)])


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-api-key", b"a"), (b"x-api-key", b"b")],  # on two lines: one list, "a, b" (RFC 9110)
        [(b"x-api-key", b"k" * 300)],  # longer than a name may be: its digest names it
        [(b"x-api-key", b"")],  # empty: a newcomer
        [(b"X-API-KEY", b"a")],  # (ASGI lower-cases names: this is some other header)
        None,  # no headers at all (a mangled scope)
        [(b"x-api-key",)],  # a mangled header
        [(b"x-api-key", "a")],  # a mangled value (a str: admit names it a newcomer; take raised)
    ],
)
def test_the_fast_path_reads_a_tenants_header_as_admit_does(headers: list[tuple[bytes, ...]] | None) -> None:
    """The shell names a request once by its header key (a scope it cannot read names no tenant, and never
    raises): what the fast path admits at once by that name is in the pool admit would choose."""
    one, two = table(rate=1000.0, establish=1), table(rate=1000.0, establish=1)
    request = {"type": "http", "client": ("192.0.2.1", 4000)} | ({} if headers is None else {"headers": headers})
    name = naming("header:x-api-key")(request)
    for k in range(5):
        now = k * 0.01
        decision = one.admit(1.0, DEFAULT, now, lambda: None, name)
        if not two.try_take(1.0, now, name):
            assert two.admit(1.0, DEFAULT, now, lambda: None, name).verdict is decision.verdict
        assert decision.verdict is Verdict.ADMIT
    assert [(str(p.name), p.gate.pacer.taken) for p in one.pools(now)] == \
        [(str(p.name), p.gate.pacer.taken) for p in two.pools(now)]  # fmt: skip


def _side_by_side(one: Tenants, two: Tenants, steps: list[tuple[float, str | None, int]]) -> None:
    """Decide ``steps`` (seconds since the last, tenant, client) with admit on ``one`` and take-then-admit on
    ``two`` (two identical tables): the same answers, and the same state after every step."""
    now = 0.0
    for step, name, client in steps:
        now += step
        key = (name, client)
        decision = one.admit(1.0, DEFAULT, now, lambda key=key: key, scope(name))
        if two.try_take(1.0, now, scope(name)):
            assert decision.verdict is Verdict.ADMIT and not decision.delay
        else:
            other = two.admit(1.0, DEFAULT, now, lambda key=key: key, scope(name))
            assert (other.verdict, other.delay, other.retry_after) == (decision.verdict, decision.delay,
                                                                       decision.retry_after)  # fmt: skip
        assert _pool_state(one, name, now) == _pool_state(two, name, now)
        assert (one.next_rebalance, one.root.ledger.delegated, one.spare) == (
            two.next_rebalance, two.root.ledger.delegated, two.spare)  # fmt: skip
        assert _guard_tokens(one, now) == _guard_tokens(two, now)
    for name in ("a", "b", "c"):
        pools = [t._pools.get(name, now) for t in (one, two)]
        assert (pools[0] is None) == (pools[1] is None)
        if pools[0] is not None and pools[1] is not None:
            assert pools[0].asked == pools[1].asked
            assert pools[0].gate.pacer.taken == pools[1].gate.pacer.taken
    assert one.newcomers.asked == two.newcomers.asked
    assert one.newcomers.gate.pacer.taken == two.newcomers.gate.pacer.taken


def _guard_tokens(tenants: Tenants, now: float) -> float | None:
    """The replica's bucket's tokens at ``now`` (to nine places), or None without one."""
    guard = tenants.parent.bucket
    return None if guard is None else round(guard.tokens(now), 9)


def test_the_fast_path_takes_from_neither_bucket_when_the_replicas_is_short() -> None:
    """A pool with a token to spare whose replica's bucket (the guard) has none: the fast path declines and
    leaves both as they were; with both short of nothing it takes one token from each."""
    tenants = table(rate=50.0, establish=1)
    assert tenants.admit(1.0, DEFAULT, 0.0, lambda: None, scope("a")).verdict is Verdict.ADMIT  # establishes "a"
    now = 0.01
    pool, guard = tenants._pools.get("a", now), tenants.parent.bucket
    assert pool is not None and guard is not None and pool.awake
    assert tenants.try_take(1.0, now, scope("a"))  # both hold a token: one taken from each
    before = pool.gate.pacer.tokens(now), guard.tokens(now)
    assert before[0] >= 1.0
    guard.charge(guard.tokens(now) - 0.5, now)  # the others' pools took the replica's bucket down to half a token
    short = guard.tokens(now)
    assert not tenants.try_take(1.0, now, scope("a"))
    assert (pool.gate.pacer.tokens(now), guard.tokens(now)) == (before[0], short)
    assert pool.asked == 2.0 and pool.gate.pacer.taken == 2


def _pool_state(tenants: Tenants, name: str | None, now: float) -> tuple[float, ...] | None:
    """What a decision leaves in ``name``'s pool: asked, taken, places held, tokens, rate and H."""
    pool = tenants.newcomers if name is None else tenants._pools.get(name, now)
    if pool is None:
        return None
    gate = pool.gate
    return (pool.asked, gate.pacer.taken, gate.schedule.holders, gate.stats.returning, round(gate.pacer.tokens(now), 9),
            gate.pacer.rate, gate.schedule.rate)  # fmt: skip


def test_the_fast_path_takes_a_plain_request_from_its_tenants_bucket() -> None:
    tenants = table(rate=50.0, establish=1)
    assert tenants.admit(1.0, DEFAULT, 0.0, lambda: None, scope("a")).verdict is Verdict.ADMIT  # establishes "a"
    pool = tenants._pools.get("a", 0.01)
    assert pool is not None and pool.awake
    taken = pool.gate.pacer.taken
    assert tenants.try_take(1.0, 0.01, scope("a"))
    assert pool.gate.pacer.taken == taken + 1 and pool.asked == 2.0


def test_the_fast_path_leaves_a_request_to_admit_while_someone_in_its_pool_holds_a_place() -> None:
    """A token is free, but a client of the pool holds a place: admit must see the request (it may be that
    client, back early, whose place is then given up), so the fast path declines."""
    tenants = table(rate=10.0, establish=1)
    now, rejected = 0.0, None
    for i in range(200):  # a crowd in tenant "a" until one of its clients is told to come back
        now = i * 0.001
        decision = tenants.admit(1.0, DEFAULT, now, lambda i=i: i, scope("a"))
        if decision.verdict is Verdict.REJECT and not decision.delay:
            rejected = i
            break
    assert rejected is not None
    pool = tenants._pools.get("a", now)
    assert pool is not None and pool.gate.schedule.holders == 1
    later = now + 2.5  # the paced requests have had their tokens, and one is free (no reallocation between)
    tenants.next_rebalance = tenants.root.next_refresh = pool.gate.next_refresh = later + 1.0
    assert pool.gate.pacer.tokens(later) >= 1.0
    assert not tenants.try_take(1.0, later, scope("a"))
    assert tenants.admit(1.0, DEFAULT, later, lambda: rejected, scope("a")).verdict is Verdict.ADMIT
    assert pool.gate.schedule.holders == 0  # its place given up: it got in early


def test_every_request_a_pool_decides_is_counted_for_a_shared_budget() -> None:
    """Gate.delegated (what a shared budget's lease adds to the root's own demand) counts what the pools' buckets
    were asked, however the decision came: at once, paced, or a returner held for its place and let in when
    its hold ended (which the root ends on the pool's behalf)."""
    tenants = table(rate=100.0, establish=1)
    root = tenants.root
    seq = itertools.count()
    events = [(0.001 * i, next(seq), i, None) for i in range(400)]  # 400 clients of one tenant at once: a herd
    holds = 0
    while events:
        now, _, client, held = heapq.heappop(events)
        if held is not None:
            holds += 1
            decision = tenants.end_hold(held, now)
        else:
            decision = tenants.admit(1.0, DEFAULT, now, lambda client=client: client, scope("a"))
        assert decision is not None
        if decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), client, decision))
        elif decision.verdict is Verdict.REJECT:
            heapq.heappush(events, (now + decision.retry_after, next(seq), client, None))
    pools = [p for p in (tenants._pools.get("a", now), tenants.newcomers) if p is not None]
    assert holds > 100
    assert root.ledger.delegated == sum(p.gate.pacer.taken + p.gate.pacer.asked for p in pools)


@settings(max_examples=25, deadline=None)
@given(herds=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 150), st.floats(0.0, 2.0)), min_size=1,
                      max_size=4))  # fmt: skip
def test_the_root_counts_the_places_held_in_its_pools_at_every_step(herds: list[tuple[str, int, float]]) -> None:
    """Gate.held_below (what a shared budget leases for and publishes, in O(1) however many pools) is the
    number of clients holding places in the pools' schedules after every decision and every hold's end, not
    only after a reallocation makes it exact."""
    tenants = table(rate=100.0, establish=1)
    root = tenants.root
    seq = itertools.count()
    events = [(at + 0.001 * i, next(seq), f"{name}{k}-{i}", name, None)
              for k, (name, clients, at) in enumerate(herds) for i in range(clients)]  # fmt: skip
    heapq.heapify(events)
    while events:
        now, _, client, name, held = heapq.heappop(events)
        if held is not None:
            decision = tenants.end_hold(held, now)
        else:
            decision = tenants.admit(1.0, DEFAULT, now, lambda client=client: client, scope(name))
        assert decision is not None
        assert root.ledger.held == sum(pool.gate.schedule.holders for pool in tenants.pools(now))
        if decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), client, name, decision))
        elif decision.verdict is Verdict.REJECT:
            heapq.heappush(events, (now + decision.retry_after, next(seq), client, name, None))
    assert root.ledger.held == 0


def test_a_tenant_new_in_an_outage_is_told_its_place_and_nothing_fails() -> None:
    """μ collapses (an outage); a key never seen before becomes a tenant and its clients are turned away. Its pool,
    new in the outage, had no peak of H to wait the outage out at: telling its clients divided by zero, and the
    request failed (a 500 through the middleware)."""
    source = Rate(100.0)
    root = Gate(source, Settings(tarpit=0.0, max_pacing_delay=HOLD))
    tenants = Tenants(Tenancy(open_below=0.0, establish=1), root)
    Run(tenants).send("a", 0.0, 2.0, 50).go()
    source.value = 20.0  # below a quarter of the peak: an outage
    Run(tenants).send("a", 2.0, 2.5, 50).go()
    assert root.collapsed
    out = [tenants.admit(1.0, DEFAULT, 2.5 + k * 0.001, lambda k=k: ("z", k), scope("z")) for k in range(200)]
    rejected = [d for d in out if d.verdict is Verdict.REJECT]
    assert rejected and all(d.retry_after >= 1 for d in rejected)


@pytest.mark.parametrize("cost", [1.0, 2.0])
def test_light_tenants_established_on_their_first_request_beside_a_busy_one_do_not_take_its_share(cost: float) -> None:
    """With ``establish=1`` each of fifty light tenants (a request every 2 s) is established by its first request,
    beside a busy tenant asking 300/s of 100/s. A pool born since the last reallocation was measured over the moment
    since it alone (reallocations follow wake-ups within a tenth of the interval): one request in 0.05 s, 20/s.
    Fifty such took the busy tenant's share for what they did not use, and the table admitted 20, 8 and 25 of
    100/s in its first three seconds. A newborn pool's first request now spans an interval: 79, 71 and 77. One
    request is one whatever the route's cost (of 2 tokens: 20, 8 and 54 when a lone request was counted in
    tokens)."""
    rate = 100.0 * cost  # (requests of ``cost`` tokens: 100 of them a second)
    tenants = Tenants(
        Tenancy(establish=1, open_below=0.0), Gate(rate, Settings(tarpit=0.0, max_pacing_delay=HOLD, burst=10.0 * cost))
    )
    arrivals = [(k / 300.0, "busy") for k in range(10 * 300)]
    for i in range(50):
        arrivals += [(i * 2.0 / 50 + k * 2.0, f"light-{i}") for k in range(5)]
    times = sorted(_admissions(tenants, arrivals, cost))
    per_second = Counter(int(t) for t in times)
    assert min(per_second[s] for s in range(3)) >= 65
    assert _beyond(times, 100.0) <= 11.0  # (within rate·t + burst, as every table must be)


def _impatient(
    tenants: Tenants,
    clients: dict[str, int],
    seconds: float,
    starts: dict[str, float] | None = None,
    since: float = 0.0,
) -> Counter[str]:
    """Admissions per tenant over ``seconds`` of ``clients[tenant]`` clients each asking again 5 ms after a 200 and
    100 ms after a 429, ignoring Retry-After (``bench/fairness.py``'s weights scenario), on the table's defaults as
    the middleware decides (the replica's bucket while open, the tenant's fast path, then admit)."""
    root, seq, admitted = tenants.root, itertools.count(), Counter[str]()
    events: list[tuple[float, int, str, str, Decision | None]] = [
        ((starts or {}).get(name, 0.0) + i / 1000.0, next(seq), name, f"{name}-{i}", None)
        for name, n in clients.items()
        for i in range(n)
    ]
    heapq.heapify(events)
    while events:
        now, _, name, key, held = heapq.heappop(events)
        if now > seconds:
            break
        if held is not None:
            decision = tenants.end_hold(held, now)
            assert decision is not None
        elif (not tenants.closed and now < root.next_refresh and root.pacer.try_take(1.0, now)) or tenants.try_take(
            1.0, now, scope(name)
        ):
            decision = ADMITTED  # (the replica's bucket while the table is open, else the tenant's fast path)
        else:
            decision = tenants.admit(1.0, DEFAULT, now, lambda key=key: key, scope(name))  # type: ignore[misc]
        if decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), name, key, decision))
        elif decision.verdict is Verdict.ADMIT:
            admitted[name] += now >= since
            heapq.heappush(events, (now + 0.005, next(seq), name, key, None))
        else:
            heapq.heappush(events, (now + 0.1, next(seq), name, key, None))
    return admitted


@pytest.mark.parametrize("starts", [{}, {"gold": 2.0}, {"x": 2.0, "y": 2.0}])
def test_weighted_tenants_whose_clients_ignore_retry_after_are_admitted_by_their_weights(
    starts: dict[str, float],
) -> None:
    """Three tenants weighted 3:1:1, ten clients each asking again 100 ms after a 429 (``bench/fairness.py``'s
    weights scenario, on a virtual clock, the default settings), whichever comes first: over seconds 8-16, 3/5, 1/5
    and 1/5 of 100/s within 10 %, and no more than 100/s between them. (Their early returns are no demand, so what
    each is measured to ask follows what it is admitted: on a real server a newborn pool's first sample taken over
    an interval whatever it held left them at 0.46 / 0.28 / 0.28, which this model did not reproduce; see
    docs/fairness.md.)"""
    tenants = Tenants(Tenancy(weights={"gold": 3.0}), Gate(100.0, Settings()))
    admitted = _impatient(tenants, {"gold": 10, "x": 10, "y": 10}, 16.0, starts, since=8.0)
    total = sum(admitted.values())
    shares = {name: count / total for name, count in admitted.items()}
    assert total <= 100.0 * 8.0 + 11.0
    assert shares["gold"] == pytest.approx(0.6, rel=0.1)
    assert shares["x"] == pytest.approx(0.2, rel=0.1) and shares["y"] == pytest.approx(0.2, rel=0.1)


def test_a_greedy_tenant_takes_nothing_a_sheddable_tenant_beside_it_needs_within_its_share() -> None:
    """Tenant "greedy" asks 300/s of 100/s; "modest" asks 45/s, all of it sheddable (it leaves half of a burst).
    What a pool leaves unused in the replica's bucket goes to a pool asking (Gate.keep), but only above what a
    sheddable request needs there and two requests more: taken down to half of the burst, as it refilled, the greedy
    tenant's requests left the sheddable ones too little, and they were held and turned away (here 15 of 45/s; with one
    request's cost kept beyond the reserve, 43.6)."""
    from admitgate.core.priority import DEFAULT_CLASSES

    sheddable = DEFAULT_CLASSES["sheddable"]
    tenants = table(rate=100.0, establish=1)
    seq = itertools.count()
    events: list[tuple[float, int, str, Decision | None]] = [(k / 300.0, next(seq), "greedy", None) for k in
                                                             range(15 * 300)]  # fmt: skip
    events += [(0.005 + k / 45.0, next(seq), "modest", None) for k in range(15 * 45)]
    heapq.heapify(events)
    admitted: Counter[str] = Counter()
    while events:
        now, _, name, held = heapq.heappop(events)
        if held is not None:
            decision = tenants.end_hold(held, now)
            assert decision is not None
        elif name == "greedy" and tenants.closed and tenants.try_take(1.0, now, scope(name)):
            decision = ADMITTED
        else:
            priority = sheddable if name == "modest" else DEFAULT
            decision = tenants.admit(1.0, priority, now, lambda: None, scope(name))
        if decision.delay:
            heapq.heappush(events, (now + decision.delay, next(seq), name, decision))
        elif decision.verdict is Verdict.ADMIT and 5.0 <= now < 15.0:
            admitted[name] += 1
    assert admitted["modest"] >= 0.98 * 45 * 10 and admitted["greedy"] + admitted["modest"] >= 0.99 * 100 * 10


def test_what_a_request_on_the_replicas_bucket_alone_leaves_there_follows_the_classes_reserves() -> None:
    """Gate.keep: SPARE, or the largest reserve of the middleware's classes if more, in every pool."""
    SPARE = GATE.spare
    from admitgate.core.priority import Priority

    tenants = table(rate=100.0, establish=1)
    assert all(pool.gate.parent.keep == SPARE for pool in tenants.pools(0.0))

    async def ok(scope, receive, send):  # pragma: no cover (never called)
        pass

    app = AdmitGate(ok, rate=100, tenants=Tenancy(establish=1), classes={"bulk": Priority("bulk", reserve=0.8)},
                    default_class="bulk")  # fmt: skip
    assert app.tenants is not None
    assert app.tenants.pool_of("t", 0.0).gate.parent.keep == 0.8 and app.tenants.newcomers.gate.parent.keep == 0.8
