import pytest
from hypothesis import given
from hypothesis import strategies as st

from admitgate import ConfigError, Identity
from admitgate.asgi.ticket import (
    COOKIE,
    MAX_TICKETS,
    RetryTicket,
    cookie_string,
    cookie_tickets,
    strip_ticket,
    ticket_secret,
)


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
    assert cookie_tickets(b"a=1; admitgate_rt=x.1.y; b=2") == ["x.1.y"]
    assert cookie_tickets(b"admitgate_rt=x.1.y") == ["x.1.y"]
    assert cookie_tickets(b"notadmitgate_rt=x; c=3") == []
    assert cookie_tickets(b"other=1") == []


def test_cookies_split_over_several_lines_and_quoted_values_are_read() -> None:
    # HTTP/2 sends one cookie per field line (RFC 9113 §8.2.3); RFC 6265 allows a DQUOTEd cookie-value
    assert cookie_string([b"a=1", b"b=2", b"admitgate_rt=x.1.y"]) == b"a=1; b=2; admitgate_rt=x.1.y"
    assert cookie_tickets(cookie_string([b"a=1", b"b=2", b"admitgate_rt=x.1.y"])) == ["x.1.y"]
    assert cookie_tickets(b'a=1; admitgate_rt="x.1.y"') == ["x.1.y"]
    assert cookie_tickets(cookie_string([b"admitgate_rt=old.1.z", b"admitgate_rt=x.1.y"])) == ["old.1.z", "x.1.y"]
    assert len(cookie_tickets(cookie_string([b"admitgate_rt=a.1.b"] * 100))) == MAX_TICKETS


def test_strip_ticket() -> None:
    for cookies in (b"a=1; admitgate_rt=x.1.y; b=2", b"admitgate_rt=x.1.y; a=1; b=2", b"a=1; b=2; admitgate_rt=x"):
        assert strip_ticket(cookies) == b"a=1; b=2", cookies
    assert strip_ticket(b"admitgate_rt=x; admitgate_rt=y") == strip_ticket(b"admitgate_rt=x") == b""
    assert strip_ticket(b"a=1") == b"a=1"


def test_set_cookie_is_short_lived_and_http_only() -> None:
    header = RetryTicket(b"s").set_cookie("id1", 100.0, max_age=12).decode()
    assert header.startswith(f"{COOKIE}=id1.112.")
    assert "Max-Age=12" in header and "HttpOnly" in header and "Path=/" in header and "SameSite=Lax" in header
    assert "Secure" not in header


def test_the_cookie_is_secure_over_https_or_when_forced() -> None:
    assert "; Secure" in RetryTicket(b"s").set_cookie("id", 0.0, 5, "https").decode()
    assert "; Secure" in RetryTicket(b"s").set_cookie("id", 0.0, 5, "wss").decode()
    forced = RetryTicket(b"s", always_secure=True).set_cookie("id", 0.0, 5, "http").decode()
    assert "; Secure" in forced and "HttpOnly" in forced and "SameSite=Lax" in forced


def test_key_ids_reveal_nothing_without_the_secret() -> None:
    material = b"('hdr', b'Bearer guessable')"
    assert RetryTicket(b"one").key_id(material) == RetryTicket(b"one").key_id(material)
    assert RetryTicket(b"one").key_id(material) != RetryTicket(b"two").key_id(material)
    assert len(RetryTicket(b"one").key_id(material)) == len(RetryTicket.new_id()) == 32


@pytest.mark.parametrize(("ticket", "secure", "field"), [(b"", False, "ticket"), ("", False, "ticket"),
                                                         (None, False, "ticket"), (1, False, "ticket"),
                                                         (True, "yes", "secure_cookie")])  # fmt: skip
def test_bad_ticket_configuration_names_the_field(ticket, secure, field) -> None:
    with pytest.raises(ConfigError) as info:
        Identity(ticket=ticket, secure_cookie=secure)
    assert info.value.field == field


def test_a_secret_is_bytes_or_a_string_and_true_or_false_carry_none() -> None:
    assert ticket_secret(True) is None and ticket_secret(False) is None
    assert ticket_secret(b"shared") == b"shared"
    assert ticket_secret("s3cret é") == "s3cret é".encode()  # a string from a file or the environment is the secret
    assert Identity(ticket="s3cret").secret == b"s3cret"


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=5))
def test_garbage_cookies_never_raise(lines: list[bytes]) -> None:
    values = cookie_tickets(cookie_string(lines))
    assert len(values) <= MAX_TICKETS
    for value in values:
        assert RetryTicket(b"k").verify(value, 0.0) is None
    for line in lines:
        assert len(strip_ticket(line)) <= len(line)


@given(st.text(max_size=200))
def test_garbage_tickets_never_verify(value: str) -> None:
    assert RetryTicket(b"k").verify(value, 0.0) is None
