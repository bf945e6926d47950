"""λ_new is the rate of new arrivals, whether or not the gate recognises the clients that come back."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Hashable

import pytest

from admitgate import Settings
from admitgate.core.decision import Stranger, Verdict
from admitgate.core.gate import Gate
from admitgate.core.newrate import NewRate
from admitgate.core.priority import DEFAULT_CLASSES

DEFAULT = DEFAULT_CLASSES["default"]
CAPACITY, NEW, HERD, RELEASE = 200.0, 20.0, 2000, 6.0
fresh = (Stranger(f"u{n}") for n in itertools.count())


def herd(key: Callable[[int], Hashable | None], until: float = 16.0, admitted: list[float] | None = None,
         idle: float = math.inf, connections: dict[int, int] | None = None) -> tuple[list[float], int]:  # fmt: skip
    """A herd of HERD clients released at once beside NEW/s new arrivals (one try each), every client sleeping
    exactly its Retry-After, on injected time. ``key(client)``: what identifies a herd request. Returns λ_new as
    read at each whole second after the release, and how many new arrivals were admitted (per cent) of those that
    came; ``admitted`` gets the time each herd client was let in. A client told to wait ``idle`` s or more comes back
    on a new connection: ``connections[client]`` counts its connections before the one it is on."""
    g = Gate(CAPACITY, Settings(burst=20, max_pacing_delay=0.5, tarpit=0.0), now=0.0)
    rng = random.Random(7)
    events: list[tuple[float, int, int, object]] = []  # (time, order, client (-1: a new arrival), a hold)
    order = itertools.count()
    at = 0.0
    while at < until:
        heapq.heappush(events, (at, next(order), -1, None))
        at += rng.expovariate(NEW)
    for client in range(HERD):
        heapq.heappush(events, (RELEASE + client / (10 * HERD), next(order), client, None))
    read: list[float] = []
    new_in = new_seen = 0
    second = 0
    while events:
        now, _, client, held = heapq.heappop(events)
        if now > until:
            break
        while second < int(now):
            second += 1
            g.refresh(float(second))
            if second > RELEASE:
                read.append(g.new_rate())
        if held is None:
            who = key(client) if client >= 0 else next(fresh)
            d = g.admit(1.0, DEFAULT, now, lambda who=who: who)
            new_seen += client < 0 and now > RELEASE
        else:
            d = g.end_hold(held, now)
        if d.verdict is Verdict.PACE:
            heapq.heappush(events, (now + d.delay, next(order), client, d))
        elif d.verdict is Verdict.REJECT and client >= 0:
            if d.retry_after >= idle and connections is not None:
                connections[client] = connections.get(client, 0) + 1
            heapq.heappush(events, (now + d.retry_after, next(order), client, None))
        elif d.verdict is Verdict.ADMIT and client < 0 and now > RELEASE:
            new_in += 1
        elif d.verdict is Verdict.ADMIT and client >= 0 and admitted is not None:
            admitted.append(now)
    return read, new_in * 100 // max(1, new_seen)


def test_returning_clients_the_gate_cannot_recognise_do_not_inflate_lambda_new() -> None:
    # behind a proxy that forwards no port, clients that keep no cookie: every try is a stranger
    read, served = herd(lambda client: next(fresh))
    assert max(read[2:]) <= 1.5 * NEW  # (the herd's own first wave is out of the median)
    assert served >= 95


def test_recognised_returning_clients_read_as_they_did() -> None:
    read, served = herd(lambda client: ("conn", client))
    assert max(read[2:]) <= 1.5 * NEW and served >= 95


def test_strangers_whose_tickets_come_back_are_claimed_and_new_arrivals_still_count() -> None:
    # a client known only by its ticket, which it keeps: the places told to it are claimed, not taken off λ_new
    ids = [Stranger(f"u-herd-{client}") for client in range(HERD)]
    read, served = herd(lambda client: ids[client])
    assert min(read[2:]) >= NEW / 2 and max(read[2:]) <= 1.5 * NEW and served >= 95


def test_the_returns_left_out_are_those_told_up_to_the_count_and_not_claimed() -> None:
    rate = NewRate(seconds=1, now=0.0)
    for _ in range(30):
        rate.told(1.5)
    rate.told(2.2)
    rate.claimed(1.7)  # (told for another moment: none to claim there)
    rate.claimed(1.5)
    rate.update(0.0, 1.0)
    rate.update(50.0, 2.0)  # 50 in the second [1, 2): 29 of them unrecognised returns
    assert rate.rate == 21
    rate.update(50.0, 3.0)  # nobody in [2, 3): the return told for it does not make the count negative
    assert rate.rate == 0
    rate.update(60.0, 4.0)
    assert rate.rate == 10


def test_nothing_is_left_out_for_a_gap_longer_than_the_book() -> None:
    rate = NewRate(seconds=1, now=0.0)
    rate.told(5.0)
    rate.told(10_000.0)
    rate.update(7.0, 20_000.0)  # (a long idle spell: the told seconds are read from the book, not counted through)
    assert rate.rate == 5


@pytest.mark.parametrize("key", [None, "client"])
def test_only_clients_nothing_tied_are_expected_back_unrecognised(key) -> None:
    g = Gate(CAPACITY, Settings(burst=1, max_pacing_delay=0.0, tarpit=0.0), now=0.0)
    g.admit(1.0, DEFAULT, 0.0, lambda: None)
    d = g.admit(1.0, DEFAULT, 0.0, lambda: key)
    assert d.verdict is Verdict.REJECT
    assert bool(g._new._told) is (key is None)
