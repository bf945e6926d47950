import logging
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admitgate import AdmitGate, ConfigError, Identity
from admitgate.asgi.identity import (
    Recogniser,
    client_address,
    connection_key,
    forwarded_client,
    header_key,
    key_from_config,
)
from admitgate.asgi.ticket import RetryTicket
from admitgate.config import load


def scope(client=("10.0.0.1", 5000), headers=()):
    return {"type": "http", "client": client, "headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_connection_key_keeps_clients_behind_one_address_apart() -> None:
    key = connection_key()
    assert key(scope(("10.0.0.1", 5000))) != key(scope(("10.0.0.1", 5001)))
    assert key(scope(("10.0.0.1", 5000))) == key(scope(("10.0.0.1", 5000)))
    assert key({"type": "http", "headers": []}) is None


def test_a_port_of_zero_is_not_a_connection() -> None:
    # uvicorn's --proxy-headers writes (forwarded address, 0): every connection from it would share one key
    assert connection_key()(scope(("203.0.113.7", 0))) is None
    assert connection_key(1)(scope(("127.0.0.1", 0), [("x-forwarded-for", "203.0.113.7")])) is None


@pytest.mark.parametrize(("version", "connection", "kept"), [
    ("1.1", None, True), ("1.1", "keep-alive", True), ("1.1", "close", False), ("1.1", "Upgrade, Close", False),
    ("1.0", None, False), ("1.0", "keep-alive", True), ("2", None, True),
])  # fmt: skip
def test_a_connection_the_request_closes_is_not_its_clients_identity(version, connection, kept) -> None:
    # a new connection from the same port after it closed is another client, not this one back early
    headers = [] if connection is None else [("connection", connection)]
    request = {**scope(("127.0.0.1", 41000), headers), "http_version": version}
    assert (connection_key()(request) is not None) is kept


def test_behind_a_proxy_the_hop_it_closes_is_not_the_clients_connection() -> None:
    # nginx talks HTTP/1.0 with Connection: close to the app; the client's own connection is the forwarded one
    request = {**scope(("127.0.0.1", 41000), [("connection", "close"), ("forwarded", 'for="192.0.2.7:4711"')]),
               "http_version": "1.0"}  # fmt: skip
    assert connection_key(1, "forwarded")(request) == connection_key(1, "forwarded")({**request, "http_version": "1.1"})
    assert connection_key(1, "forwarded")(request) is not None


def test_a_connection_carrying_another_users_request_is_another_client() -> None:
    key = connection_key()
    alice = [("authorization", "Bearer a"), ("user-agent", "app/1")]
    assert key(scope(headers=alice)) == key(scope(headers=list(alice)))
    for extra in ([("authorization", "Bearer b")], [("user-agent", "app/2")], [("cookie", "session=2")],
                  [("x-forwarded-for", "198.51.100.2")], [("forwarded", "for=198.51.100.2")]):  # fmt: skip
        assert key(scope(headers=alice + extra)) != key(scope(headers=alice)), extra


def test_the_retry_ticket_does_not_change_who_is_on_a_connection() -> None:
    key = connection_key()
    plain = key(scope(headers=[("cookie", "a=1; b=2")]))
    for cookies in ("a=1; admitgate_rt=x.1.y; b=2", "admitgate_rt=x.1.y; a=1; b=2", "a=1; b=2; admitgate_rt=z.2.w"):
        assert key(scope(headers=[("cookie", cookies)])) == plain, cookies
    assert key(scope(headers=[("cookie", "a=1; admitgate_rt=x.1.y; b=3")])) != plain


def test_behind_proxies_that_forward_the_port_the_clients_own_connection_is_the_key() -> None:
    key = connection_key(1, "forwarded")
    a = scope(("10.0.0.2", 7000), [("forwarded", 'for="198.51.100.9:4711"')])
    b = scope(("10.0.0.2", 7001), [("forwarded", 'for="198.51.100.9:4711"')])  # another proxy connection
    assert key(a) == key(b)
    assert key(scope(("10.0.0.2", 7000), [("forwarded", "for=198.51.100.9:4712")])) != key(a)
    assert forwarded_client(a, 1, "forwarded") == ("198.51.100.9", 4711)


def test_forwarding_headers_are_ignored_without_trusted_hops() -> None:
    s = scope(headers=[("x-forwarded-for", "6.6.6.6")])
    assert client_address(s) == "10.0.0.1"


def test_x_forwarded_for_is_read_through_the_trusted_hops_only() -> None:
    s = scope(headers=[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.1.1.1")])
    assert client_address(s, 1) == "10.1.1.1"
    assert client_address(s, 2) == "1.2.3.4"  # the forged leftmost entry is never reached
    assert client_address(scope(headers=[("x-forwarded-for", "1.2.3.4")]), 3) == "1.2.3.4"


def test_every_line_of_the_field_counts_from_the_right() -> None:
    # HAProxy's `option forwardfor` adds its own line after the one the client sent
    s = scope(headers=[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "1.2.3.4")])
    assert client_address(s, 1) == "1.2.3.4"
    s = scope(headers=[("x-forwarded-for", "6.6.6.6, 7.7.7.7"), ("x-forwarded-for", "1.2.3.4, 10.1.1.1")])
    assert client_address(s, 2) == "1.2.3.4"
    assert client_address(s, 3) == "7.7.7.7"
    s = scope(headers=[("forwarded", "for=6.6.6.6"), ("forwarded", "for=1.2.3.4;proto=https")])
    assert client_address(s, 1, "forwarded") == "1.2.3.4"


def test_one_source_of_truth_never_whichever_is_present() -> None:
    both = scope(headers=[("forwarded", "for=6.6.6.6"), ("x-forwarded-for", "1.2.3.4")])
    assert client_address(both, 1) == "1.2.3.4"  # the client's own Forwarded is not believed
    assert client_address(both, 1, "forwarded") == "6.6.6.6"
    assert client_address(scope(headers=[("x-forwarded-for", "1.2.3.4")]), 1, "forwarded") == "10.0.0.1"
    assert client_address(scope(headers=[("forwarded", "for=1.2.3.4")]), 1) == "10.0.0.1"


def test_forwarded_header() -> None:
    value = 'for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=192.0.2.60:80;by=203.0.113.43'
    s = scope(headers=[("forwarded", value)])
    assert client_address(s, 1, "forwarded") == "192.0.2.60"
    assert client_address(s, 2, "forwarded") == "2001:db8::1"
    assert client_address(scope(headers=[("forwarded", "proto=https;For=198.51.100.1")]), 1, "forwarded") == (
        "198.51.100.1"
    )


def test_a_clients_quotes_cannot_swallow_a_trusted_element() -> None:
    s = scope(headers=[("forwarded", 'for="6.6.6.6, for=7.7.7.7'), ("forwarded", "for=1.2.3.4")])
    assert client_address(s, 1, "forwarded") == "1.2.3.4"


def test_an_empty_trusted_element_falls_back_to_the_peer() -> None:
    assert client_address(scope(headers=[("x-forwarded-for", "1.2.3.4, ")]), 1) == "10.0.0.1"
    assert client_address(scope(headers=[("forwarded", "by=1.2.3.4")]), 1, "forwarded") == "10.0.0.1"


def test_header_key() -> None:
    key = header_key("X-API-Key")
    assert key(scope(headers=[("x-api-key", "abc")])) == key(scope(headers=[("x-api-key", "abc")]))
    assert key(scope(headers=[("x-api-key", "abc")])) != key(scope(headers=[("x-api-key", "abd")]))
    assert key(scope(headers=[("x-api-key", "a"), ("x-api-key", "b")])) == key(scope(headers=[("x-api-key", "a, b")]))
    assert key(scope()) is None
    assert key_from_config("header:x-api-key")(scope(headers=[("x-api-key", "k")])) is not None


def test_the_forwarding_source_and_secure_cookie_come_from_the_environment() -> None:
    options = load(env={"ADMITGATE_FORWARDED": "forwarded", "ADMITGATE_TRUSTED_HOPS": "1",
                        "ADMITGATE_SECURE_COOKIE": "true"})  # fmt: skip
    assert options == {"identity": Identity(forwarded="forwarded", trusted_hops=1, secure_cookie=True)}
    gate = AdmitGate(lambda scope, receive, send: None, **options)
    assert gate.ticket is not None and gate.ticket.always_secure
    assert gate.key_func(scope(headers=[("forwarded", "for=192.0.2.1:80")])) != gate.key_func(scope())


@pytest.mark.parametrize(("kwargs", "field"), [({"forwarded": "x-real-ip"}, "forwarded"),
                                               ({"trusted_hops": 33}, "trusted_hops"),
                                               ({"trusted_hops": -1, "spec": "header:x"}, "trusted_hops"),
                                               ({"trusted_hops": True}, "trusted_hops")])  # fmt: skip
def test_bad_forwarding_configuration_names_the_field(kwargs, field) -> None:
    with pytest.raises(ConfigError) as info:
        key_from_config(**{"spec": "connection", **kwargs})
    assert info.value.field == field


def test_ids_are_keyed_with_the_ticket_secret() -> None:
    s = scope(headers=[("authorization", "Bearer secret-token")])
    one = Recogniser(header_key("authorization"), RetryTicket(b"one"), lambda: 0.0)
    assert one(s) == Recogniser(header_key("authorization"), RetryTicket(b"one"), lambda: 0.0)(s)  # replicas agree
    assert one(s) != Recogniser(header_key("authorization"), RetryTicket(b"two"), lambda: 0.0)(s)
    assert one(s) != Recogniser(header_key("authorization"), None, lambda: 0.0)(s)


def test_nothing_identifies_a_request_then_a_fresh_id_for_the_ticket() -> None:
    anonymous = {"type": "http", "client": None, "headers": []}  # a Unix socket
    with_tickets = Recogniser(connection_key(), RetryTicket(b"k"), lambda: 0.0)
    first, second = with_tickets(anonymous), with_tickets(anonymous)
    assert isinstance(first, str) and first != second
    assert Recogniser(connection_key(), None, lambda: 0.0)(anonymous) is None


def test_a_valid_ticket_in_any_cookie_line_wins() -> None:
    ticket = RetryTicket(b"k")
    value = ticket.issue("abc", 100.0)
    recognise = Recogniser(connection_key(), ticket, lambda: 50.0)
    for cookies in ([("cookie", "a=1"), ("cookie", f"admitgate_rt={value}")],
                    [("cookie", f'a=1; admitgate_rt="{value}"')],
                    [("cookie", "admitgate_rt=stale.1.x"), ("cookie", f"admitgate_rt={value}")]):  # fmt: skip
        assert recognise(scope(headers=cookies)) == "abc", cookies


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_failing_key_function_is_anonymous_and_warned_about_once(caplog) -> None:
    for bad in (lambda s: Unprintable(), lambda s: s["no such key"]):
        recognise = Recogniser(bad, RetryTicket(b"k"), lambda: 0.0)
        with caplog.at_level(logging.WARNING, logger="admitgate"):
            caplog.clear()
            ids = {recognise(scope()) for _ in range(3)}
        assert len(ids) == 3 and all(isinstance(i, str) for i in ids)  # anonymous: a fresh id each time
        assert len(caplog.records) == 1 and "key function" in caplog.records[0].getMessage()


HOSTILE = {"x-forwarded-for": b"," * 1_000_000, "forwarded": b";" * 1_000_000, "cookie": b"xadmitgate_rt=" * 70_000,
           "user-agent": b"a" * 1_000_000}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_fields_cost_no_more_memory_than_a_copy_of_themselves(name: str) -> None:
    value = HOSTILE[name]
    s = {"type": "http", "client": ("10.0.0.1", 5000), "headers": [(name.encode(), value)]}
    recognise = Recogniser(connection_key(1, "forwarded" if name == "forwarded" else "x-forwarded-for"),
                           RetryTicket(b"k"), lambda: 0.0)  # fmt: skip
    tracemalloc.start()
    try:
        client_address(s, 1, "forwarded" if name == "forwarded" else "x-forwarded-for")
        recognise(s)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * len(value), peak  # no per-element Python objects (a split list is 8 bytes an element)


@given(st.lists(st.tuples(st.sampled_from(["x-forwarded-for", "forwarded", "cookie", "authorization"]),
                          st.binary(max_size=200)), max_size=6),
       st.integers(0, 5), st.sampled_from(["x-forwarded-for", "forwarded"]))  # fmt: skip
def test_garbage_forwarding_headers_never_raise(headers, hops: int, source: str) -> None:
    s = {"type": "http", "client": ("1.1.1.1", 1), "headers": [(n.encode(), v) for n, v in headers]}
    result = client_address(s, hops, source)
    assert result is None or isinstance(result, str)
    assert connection_key(hops, source)(s) is not None
    assert isinstance(Recogniser(connection_key(hops, source), RetryTicket(b"k"), lambda: 0.0)(s), str)
