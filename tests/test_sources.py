"""One source takes at most its share of the schedule's places; places nobody claims push nobody back."""

from __future__ import annotations

import pytest

from admitgate import Settings
from admitgate.asgi.identity import Identity, Recogniser, connection_key, source_of
from admitgate.asgi.ticket import RetryTicket
from admitgate.core.decision import ClientKey, ConnectionKey, Verdict
from admitgate.core.gate import Gate
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.core.schedule import Schedule
from admitgate.core.tuning import GATE

DEFAULT = DEFAULT_CLASSES["default"]
RATE = 200.0


def gate() -> Gate:
    return Gate(RATE, Settings(burst=20, max_pacing_delay=0.0, tarpit=0.0, growth=0.0), now=0.0)


def told(g: Gate, key: ClientKey, now: float) -> int:
    """The Retry-After told to ``key`` at ``now``, the bucket empty (the service busy with others)."""
    g.pacer.charge(max(0.0, g.pacer.tokens(now)), now)
    d = g.admit(1.0, DEFAULT, now, lambda: key)
    assert d.verdict is Verdict.REJECT, d
    return d.retry_after


def flood(g: Gate, sources, identities: int = 2000) -> None:
    """``identities`` first tries within a second, each a new identity of the source ``sources(i)`` gives."""
    for i in range(identities):
        g.admit(1.0, DEFAULT, i / (2 * identities), lambda i=i: ClientKey(f"forged-{i}", sources(i)))


def test_one_source_rotating_identities_keeps_an_honest_newcomer_waiting_its_share_at_most() -> None:
    g = gate()
    flood(g, lambda i: "198.51.100")
    share = GATE.source_share  # seconds of H
    assert told(g, ClientKey("honest", "203.0.113"), 0.6) <= share + 1


def test_identities_from_as_many_sources_queue_as_before() -> None:
    # the rule is per source: 2,000 sources holding a place each are 2,000 clients, and a newcomer waits behind them
    g = gate()
    flood(g, lambda i: f"10.{i // 256}.{i % 256}")
    assert told(g, ClientKey("honest", "203.0.113"), 0.6) >= 2000 / RATE - 2


def test_places_never_claimed_do_not_push_later_newcomers_back() -> None:
    g = gate()
    flood(g, lambda i: "198.51.100")
    waits = [told(g, ClientKey(f"honest-{n}", f"203.0.{n}"), 0.6 + n / 20) for n in range(100)]  # 20/s for 5 s
    assert max(waits) <= GATE.source_share + 1  # (nobody claims the flood's places; nobody waits behind them)


def test_a_lone_source_is_placed_as_without_sources() -> None:
    plain, sourced = gate(), gate()
    a = [plain.admit(1.0, DEFAULT, i / 4000, lambda i=i: f"c{i}") for i in range(2000)]
    b = [sourced.admit(1.0, DEFAULT, i / 4000, lambda i=i: ClientKey(f"c{i}", "127.0.0")) for i in range(2000)]
    assert [(d.verdict, d.retry_after) for d in a] == [(d.verdict, d.retry_after) for d in b]
    assert sourced.schedule.backlog(0.5) == pytest.approx(plain.schedule.backlog(0.5))


def test_a_source_whose_clients_are_let_in_gets_its_share_back() -> None:
    g = gate()
    share = int(GATE.source_share * RATE)
    keys = [ClientKey(f"c{i}", "198.51.100") for i in range(share)]
    for key in keys:
        g.schedule.hold(key, (g.schedule.take(1.0, 0.0, 0.0, "198.51.100", share), 1.0, 1.0), 0.0)
    for key in keys[:10]:
        assert g.schedule.forget(key, 0.5) is not None
    first = g.schedule.take(1.0, 0.5, 0.0, "203.0.113", share)
    assert g.schedule.take(1.0, 0.5, 0.0, "198.51.100", share) == first + 1  # within its share again: the queue


def test_a_lone_source_never_places_a_client_over_its_own_places() -> None:
    # a herd from one address: past its share, then within it again near the end of its drain
    schedule = Schedule(RATE)
    positions = []
    for i in range(1000):
        positions.append(schedule.take(1.0, 0.0, 0.0, "127.0.0", 100.0))
        schedule.hold(ClientKey(f"c{i}", "127.0.0"), (positions[-1], 1.0, 1.0), 0.0)
    assert positions == [float(i) for i in range(1000)]  # in order, as without the rule
    for i in range(950):
        schedule.forget(ClientKey(f"c{i}", "127.0.0"), 1.0)
    assert schedule.take(1.0, 1.0, 0.0, "127.0.0", 100.0) == 1000.0  # behind its own, not over them


@pytest.mark.parametrize(("address", "source"), [
    ("192.0.2.7", "192.0.2"), ("192.0.2.200", "192.0.2"), ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("2001:db8:1:2::9%eth0", "2001:db8:1:2::/64"), ("unix-peer", "unix-peer"), (None, None), ("", None),
])  # fmt: skip
def test_a_source_is_an_ipv4_24_an_ipv6_64_or_the_name(address, source) -> None:
    assert source_of(address) == source


def test_the_recogniser_keys_a_client_with_the_source_of_its_address_through_the_trusted_hops() -> None:
    recognise = Recogniser(connection_key(1), RetryTicket(b"k" * 16), lambda: 0.0, forwarding=(1, "x-forwarded-for"))
    scope = {"type": "http", "client": ("127.0.0.1", 0), "headers": [(b"x-forwarded-for", b"198.51.100.23")]}
    key = recognise(scope)
    assert isinstance(key, ClientKey) and key.source == "198.51.100"
    assert recognise({**scope, "client": ("127.0.0.1", 4000)}).source == "198.51.100"


def test_a_key_that_is_the_connection_lapses_and_a_ticket_or_a_header_does_not() -> None:
    ticket = RetryTicket(b"k" * 16)
    by_connection = Recogniser.of(Identity(), ticket, lambda: 0.0)
    scope = {"type": "http", "client": ("198.51.100.23", 4000), "headers": [(b"x-api-key", b"a")]}
    key = by_connection(scope)
    assert isinstance(key, ConnectionKey) and key.lapses and key.source == "198.51.100"
    cookie = ticket.set_cookie(key, 0.0, 60, "http").split(b";")[0]
    back = by_connection({**scope, "client": ("198.51.100.23", 4001), "headers": [(b"cookie", cookie)]})
    assert back == key and not back.lapses  # known by its ticket on a new connection
    assert not Recogniser.of(Identity(key="header:x-api-key"), ticket, lambda: 0.0)(scope).lapses
