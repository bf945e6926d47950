"""A stranger back at the time it was told takes a place its source's strangers were told and did not come back for,
not a new one at the tail: the schedule holds one place per client waiting, recognised or not."""

from __future__ import annotations

import heapq
import itertools
import random

from admitgate import Settings
from admitgate.core.decision import ClientKey, ConnectionKey, Stranger, Verdict
from admitgate.core.gate import Gate
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.core.schedule import SLOT_GRACE
from admitgate.core.strays import Strays
from tests.test_new_rate import CAPACITY, HERD, NEW, RELEASE, herd

DEFAULT = DEFAULT_CLASSES["default"]
SOURCE = "192.0.2"
fresh = (Stranger(f"s{n}", SOURCE) for n in itertools.count())


def gate(first: Stranger) -> tuple[Gate, float]:
    """A gate that told ``first`` to come back, then 400 clients from elsewhere; when ``first`` was told."""
    g = Gate(CAPACITY, Settings(burst=1, max_pacing_delay=0.0, tarpit=0.0, growth=0.0), now=0.0)
    g.admit(1.0, DEFAULT, 0.0, lambda: None)  # (its one token taken)
    back = g.admit(1.0, DEFAULT, 0.0, lambda: first).retry_after
    for n in range(400):
        g.admit(1.0, DEFAULT, 0.0, lambda n=n: ClientKey(f"c{n}", "203.0.113"))
    return g, float(back)


def rejected(g: Gate, key: ClientKey, now: float) -> float:
    """Reject ``key`` at ``now`` with the bucket empty; how much the schedule grew by, tokens."""
    g.pacer.charge(max(0.0, g.pacer.tokens(now)), now)
    before = g.schedule.backlog(now)
    d = g.admit(1.0, DEFAULT, now, lambda: key)
    assert d.verdict is Verdict.REJECT, d
    return g.schedule.backlog(now) - before


class Book(dict):
    """Places by key, as the schedule's book holds them: ``place_of`` gives each one's; a place's position names it."""

    def told(self, strays: Strays, name: str, told: float, now: float = 0.0, source: str = SOURCE) -> None:
        key = Stranger(name, source)
        self[key] = (float(len(self)), 1.0, told)
        strays.add(key, told, now)

    def claim(self, strays: Strays, now: float, source: str = SOURCE) -> str | None:
        """The name of the place a stranger from ``source`` takes at ``now``, or None."""
        place = strays.claim(Stranger("claimer", source), now, lambda key, now: self.get(key))
        return None if place is None else next(k for k, p in self.items() if p == place)


def test_strays_are_claimed_earliest_told_first_once_told_and_by_their_source_only() -> None:
    strays, book = Strays(), Book()
    book.told(strays, "b", 3.0)
    book.told(strays, "a", 2.0)
    book.told(strays, "c", 1.0, source="198.51.100")
    assert book.claim(strays, 1.9) is None  # nobody was told to be back yet
    assert book.claim(strays, 5.0) == "a" and book.claim(strays, 5.0) == "b"
    assert book.claim(strays, 5.0) is None  # each place once; the other source's is its own
    assert book.claim(strays, 5.0, source="198.51.100") == "c"


def test_a_stray_come_back_for_told_again_or_forgotten_is_not_claimed() -> None:
    strays, book = Strays(), Book()
    book.told(strays, "gone", 1.0)
    book.told(strays, "back", 2.0)
    book.told(strays, "again", 2.0)
    book.told(strays, "evicted", 2.0)
    strays.drop(Stranger("back", SOURCE))  # its client came back for its place
    del book[Stranger("evicted", SOURCE)]  # the book dropped it (full)
    strays.add(Stranger("again", SOURCE), 9.0, 2.0)  # told again: claimable from then on
    assert book.claim(strays, 1.0 + SLOT_GRACE + 0.5) is None  # the first forgotten by the book by then
    assert book.claim(strays, 9.0) == "again" and len(strays) == 0


def test_strays_are_bounded_and_make_room_by_dropping_what_the_book_forgot() -> None:
    strays, book = Strays(max_keys=2), Book()
    for n in range(2):
        book.told(strays, f"old{n}", 1.0)
    book.told(strays, "over", 2.0, now=1.0)  # full: left out
    assert len(strays) == 2
    book.told(strays, "later", 20.0, now=10.0)  # the old ones forgotten by then: room made
    assert len(strays) == 1 and book.claim(strays, 20.0) == "later"


def test_a_stranger_back_at_its_time_takes_a_stray_place_not_a_new_one() -> None:
    g, back = gate(next(fresh))
    assert rejected(g, next(fresh), back - 0.5) == 1.0  # nobody told to be back yet: a new place
    assert rejected(g, Stranger("s-other", "198.51.100"), back + 0.01) == 1.0  # nobody from its source was told
    assert rejected(g, next(fresh), back + 0.01) == 0.0  # the first's place, not come back for: taken
    assert rejected(g, next(fresh), back + 0.02) == 1.0  # each stray place once


def test_a_client_returning_its_ticket_after_its_place_was_taken_still_finds_it() -> None:
    owner = next(fresh)
    g, back = gate(owner)
    place = g.schedule.place_of(owner, 0.0)
    rejected(g, next(fresh), back + 0.01)  # takes the owner's place
    assert g.schedule.place_of(owner, back + 0.02)[:2] == place[:2]  # type: ignore[index]
    returning = g.stats.returning
    rejected(g, owner, back + 0.02)
    assert g.stats.returning == returning + 1  # known by its ticket, at its place


def test_a_stranger_let_in_at_once_accounts_for_a_stray_place() -> None:
    g, back = gate(next(fresh))
    assert g.admit(1.0, DEFAULT, back + 0.01, lambda: next(fresh)).verdict is Verdict.ADMIT  # (the bucket refilled)
    assert g.stats.returning == 1 and rejected(g, next(fresh), back + 0.02) == 1.0  # that place is not taken again


def test_a_herd_of_cookie_less_clients_nothing_recognises_drains_as_a_recognised_one() -> None:
    bound = HERD / (CAPACITY - NEW)
    drains = []
    for key in (lambda client: next(fresh), lambda client: ("conn", client)):
        admitted: list[float] = []
        _, served = herd(key, until=RELEASE + 3 * bound, admitted=admitted)
        assert len(admitted) == HERD and served >= 95
        drains.append((max(admitted) - RELEASE) / bound)
    assert drains[0] <= 1.05 * drains[1]  # (each try a stranger, their own places left: 1.45 of the bound)


#: Seconds uvicorn keeps an idle connection open (its default): a client told longer comes back on a new one.
IDLE = 5.0


def test_direct_cookie_less_herd_back_on_new_connections_after_uvicorn_closed_the_idle_ones_drains_as_recognised(
) -> None:  # fmt: skip
    bound = HERD / (CAPACITY - NEW)
    connections: dict[int, int] = {}
    drains = []
    for idle in (IDLE, float("inf")):
        admitted: list[float] = []
        key = lambda client: ConnectionKey(f"{client}:{connections.get(client, 0)}", SOURCE)  # noqa: E731
        _, served = herd(key, until=RELEASE + 3 * bound, admitted=admitted, idle=idle, connections=connections)
        assert len(admitted) == HERD and served >= 95
        drains.append((max(admitted) - RELEASE) / bound)
    assert sum(connections.values()) > HERD / 4  # (a quarter of the herd and more was told longer than IDLE)
    assert drains[0] <= 1.05 * drains[1]  # (each new connection a new place at the tail: 1.73 of the bound)


def test_a_client_back_on_a_new_connection_takes_a_connection_place_told_due_and_a_stranger_does_not() -> None:
    g, back = gate(ConnectionKey("c-first", SOURCE))
    assert rejected(g, next(fresh), back + 0.01) == 1.0  # a stranger (a request that closes its connection): its own
    assert rejected(g, ConnectionKey("c-other", "198.51.100"), back + 0.01) == 1.0  # another source's
    assert rejected(g, ConnectionKey("c-new", SOURCE), back + 0.01) == 0.0  # the first's place, on a new connection
    g, back = gate(next(fresh))
    assert rejected(g, ConnectionKey("c-new", SOURCE), back + 0.01) == 1.0  # nor a connection a stranger's place


def test_a_connection_back_with_its_ticket_leaves_no_place_to_claim() -> None:
    owner = ConnectionKey("c-owner", SOURCE)
    g, back = gate(owner)
    rejected(g, ClientKey(str(owner), SOURCE), back)  # known by its ticket: back for its place (told again or not)
    assert rejected(g, ConnectionKey("c-new", SOURCE), back + 0.01) == 1.0


def ignore20_decisions(first: type[ClientKey]) -> list[tuple[float, int, str, int]]:
    """Every decision on the matrix's herd-ignore20 clients on injected time: 400 of 2,000 ask every 0.1 s as
    strangers (a connection each, closed), the others obey, known by a ``first`` key and then by their ticket."""
    g = Gate(CAPACITY, Settings(), now=0.0)
    rng, ids, order = random.Random(3), itertools.count(), itertools.count()
    ignorers = set(rng.sample(range(HERD), HERD // 5))
    events = [(RELEASE + c / (10 * HERD), next(order), c, 0, None) for c in range(HERD)]
    at = 0.0
    while at < 40.0:
        events.append((at, next(order), -1, 0, None))
        at += rng.expovariate(NEW)
    heapq.heapify(events)
    decisions = []
    while events:
        now, _, client, tries, held = heapq.heappop(events)
        if held is not None:
            d = g.end_hold(held, now)
        else:
            kind = Stranger if client < 0 or client in ignorers else ClientKey if tries else first
            key = kind(f"s{next(ids)}" if kind is Stranger else f"c{client}", SOURCE)
            d = g.admit(1.0, DEFAULT, now, lambda key=key: key)
        decisions.append((now, client, d.verdict.value, d.retry_after))
        if d.verdict is Verdict.PACE:
            heapq.heappush(events, (now + d.delay, next(order), client, tries, d))
        elif d.verdict is Verdict.REJECT and client >= 0 and now < 40.0:
            wait = 0.1 if client in ignorers else d.retry_after
            heapq.heappush(events, (now + wait, next(order), client, tries + 1, None))
    return decisions


def test_a_herd_whose_clients_come_back_with_their_ticket_is_decided_as_if_connections_did_not_lapse() -> None:
    assert ignore20_decisions(ConnectionKey) == ignore20_decisions(ClientKey)
