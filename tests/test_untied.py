"""Requests the gate cannot tie to a client: counted, exported, and said once with what to configure."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from admitgate import AdmitGate, ManualClock, Settings
from admitgate import metrics as m
from admitgate.asgi.identity import Recogniser, connection_key
from admitgate.asgi.ticket import RetryTicket
from admitgate.asgi.untied import UNRETURNED, Untied
from tests.test_metrics import ok_app, samples
from tests.test_middleware import call, http_scope

FORWARDED = [(b"x-forwarded-for", b"203.0.113.7")]


def gated(clock: ManualClock, registry: CollectorRegistry | None = None) -> AdmitGate:
    """One token on a frozen clock: every request after the first is refused."""
    settings = Settings(burst=1, max_pacing_delay=0, tarpit=0)
    return AdmitGate(ok_app, rate=1, settings=settings, clock=clock, wall_clock=clock, metrics=registry)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.anyio
async def test_a_peer_port_of_zero_is_counted_exported_and_said_once_with_what_to_configure(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    gate = gated(clock, registry)
    proxied = http_scope(client=("203.0.113.7", 0), headers=FORWARDED)  # uvicorn's proxy headers, no port
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        assert (await call(gate, http_scope()))[0] == 200
        for _ in range(3):
            assert (await call(gate, proxied))[0] == 429
    said = [text for text in warnings(caplog) if "port of 0" in text]
    assert len(said) == 1 and "Forwarded" in said[0] and "trusted_hops=1" in said[0] and "header:" in said[0]
    got = samples(registry)
    assert got[f"{m.UNTIED}_total", ()] == 3
    assert got[f"{m.UNTIED_ISSUED}_total", ()] == 3 and got[f"{m.UNTIED_RETURNED}_total", ()] == 0


@pytest.mark.anyio
async def test_a_client_on_its_own_connection_is_tied_and_nothing_is_said(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    gate = gated(clock, registry)
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        for port in range(4000, 4004):
            await call(gate, http_scope(client=("127.0.0.1", port)))
    assert not warnings(caplog)
    assert samples(registry)[f"{m.UNTIED}_total", ()] == 0


@pytest.mark.anyio
async def test_a_returned_ticket_of_an_untied_client_is_counted(clock: ManualClock) -> None:
    gate = gated(clock)
    await call(gate, http_scope())
    status, headers, _ = await call(gate, http_scope(client=("203.0.113.7", 0), headers=FORWARDED))
    assert status == 429
    cookie = headers["set-cookie"].split(";", 1)[0].encode()
    await call(gate, http_scope(client=("203.0.113.7", 0), headers=[*FORWARDED, (b"cookie", cookie)]))
    assert gate.untied_counts == (1, 2, 1)  # one untied request; two tickets handed out, the first came back


def test_tickets_that_never_come_back_are_said_once_after_the_first_has_expired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    untied = Untied()
    untied.untied(None)  # (a client on a Unix socket, whose connection stays open)
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        for i in range(UNRETURNED + 10):
            untied.ticket_issued(float(i) / 10, float(i) / 10 + 8.0)  # 10 a second, each valid for 8 s
    said = [r.getMessage() for r in caplog.records if "came back" in r.getMessage()]
    assert not said  # the first ticket has not expired yet: its client may still come back
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        for _ in range(2):
            untied.ticket_issued(9.0, 17.0)
    said = [r.getMessage() for r in caplog.records if "came back" in r.getMessage()]
    assert len(said) == 1 and "keep no cookies" in said[0] and "trusted_hops=1" in said[0]


def test_tickets_that_come_back_are_not_said_to_be_lost(caplog: pytest.LogCaptureFixture) -> None:
    untied = Untied()
    untied.ticket_returned()
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        for i in range(2 * UNRETURNED):
            untied.ticket_issued(float(i), float(i) + 1.0)
    assert not caplog.records


def test_fresh_ids_are_told_apart_from_keyed_ones_by_the_recogniser() -> None:
    recognise = Recogniser(connection_key(), RetryTicket(b"k" * 16), lambda: 0.0)
    keyed = recognise(http_scope(client=("127.0.0.1", 4000)))
    fresh = recognise(http_scope(client=("127.0.0.1", 0)))
    assert recognise.untied.counts == (1, 0, 0) and recognise.untied.portless == 1
    assert not keyed.startswith("u") and fresh.startswith("u")


def test_one_shot_clients_whose_tickets_never_come_back_are_not_said_to_keep_no_cookies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # new arrivals on a connection each (Connection: close) make one try: their tickets never come back
    untied = Untied()
    with caplog.at_level(logging.WARNING, logger="admitgate"):
        for i in range(2 * UNRETURNED):
            untied.untied(41000 + i, closing=True)
            untied.ticket_issued(float(i), float(i) + 1.0)
    assert not caplog.records and untied.requests == 2 * UNRETURNED
