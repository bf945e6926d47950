from hypothesis import given
from hypothesis import strategies as st

from admitgate import client_address, connection_key, header_key
from admitgate.identity import key_from_config


def scope(client=("10.0.0.1", 5000), headers=()):
    return {"type": "http", "client": client, "headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_connection_key_keeps_clients_behind_one_address_apart() -> None:
    key = connection_key()
    assert key(scope(("10.0.0.1", 5000))) != key(scope(("10.0.0.1", 5001)))
    assert key(scope(("10.0.0.1", 5000))) == key(scope(("10.0.0.1", 5000)))
    assert key({"type": "http", "headers": []}) is None


def test_forwarding_headers_are_ignored_without_trusted_hops() -> None:
    s = scope(headers=[("x-forwarded-for", "6.6.6.6")])
    assert client_address(s) == "10.0.0.1"


def test_x_forwarded_for_is_read_through_the_trusted_hops_only() -> None:
    s = scope(headers=[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.1.1.1")])
    assert client_address(s, 1) == "10.1.1.1"
    assert client_address(s, 2) == "1.2.3.4"  # the forged leftmost entry is never reached
    assert client_address(scope(headers=[("x-forwarded-for", "1.2.3.4")]), 3) == "1.2.3.4"


def test_forwarded_header() -> None:
    value = 'for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=192.0.2.60:80;by=203.0.113.43'
    s = scope(headers=[("forwarded", value)])
    assert client_address(s, 1) == "192.0.2.60"
    assert client_address(s, 2) == "2001:db8::1"


def test_header_key() -> None:
    key = header_key("X-API-Key")
    assert key(scope(headers=[("x-api-key", "abc")])) == ("hdr", b"abc")
    assert key(scope()) is None
    assert key_from_config("header:x-api-key")(scope(headers=[("x-api-key", "k")])) == ("hdr", b"k")


@given(st.text(max_size=200), st.integers(0, 5), st.sampled_from(["x-forwarded-for", "forwarded"]))
def test_garbage_forwarding_headers_never_raise(value: str, hops: int, name: str) -> None:
    s = {"type": "http", "client": ("1.1.1.1", 1), "headers": [(name.encode(), value.encode("utf-8", "replace"))]}
    result = client_address(s, hops)
    assert result is None or isinstance(result, str)
    assert connection_key(hops)(s) is not None
