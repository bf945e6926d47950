from hypothesis import given
from hypothesis import strategies as st

from admitgate import RetryTicket
from admitgate.ticket import COOKIE, cookie_ticket


def test_issue_and_verify() -> None:
    t = RetryTicket(b"secret")
    value = t.issue("abc", 1000.0)
    assert t.verify(value, 999.0) == "abc"
    assert t.verify(value, 1001.0) is None  # expired
    assert RetryTicket(b"other").verify(value, 999.0) is None  # another secret


def test_tampering_is_detected() -> None:
    t = RetryTicket(b"secret")
    ticket_id, expires, sig = t.issue("abc", 1000.0).split(".")
    assert t.verify(f"abd.{expires}.{sig}", 0) is None
    assert t.verify(f"{ticket_id}.9999999999.{sig}", 0) is None


def test_cookie_parsing() -> None:
    assert cookie_ticket(b"a=1; admitgate_rt=x.1.y; b=2") == "x.1.y"
    assert cookie_ticket(b"admitgate_rt=x.1.y") == "x.1.y"
    assert cookie_ticket(b"notadmitgate_rt=x; c=3") is None
    assert cookie_ticket(b"other=1") is None


def test_set_cookie_is_short_lived_and_http_only() -> None:
    header = RetryTicket(b"s").set_cookie("id1", 100.0, max_age=12).decode()
    assert header.startswith(f"{COOKIE}=id1.112.")
    assert "Max-Age=12" in header and "HttpOnly" in header and "Path=/" in header


@given(st.binary(max_size=300))
def test_garbage_cookies_never_raise(raw: bytes) -> None:
    value = cookie_ticket(raw)
    if value is not None:
        assert RetryTicket(b"k").verify(value, 0.0) is None or len(value) <= 128


@given(st.text(max_size=200))
def test_garbage_tickets_never_verify(value: str) -> None:
    assert RetryTicket(b"k").verify(value, 0.0) is None
