import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import ConfigError
from admitgate.core.backoff import (
    backoff_delay,
    jittered_delay,
    parse_ratelimit_reset,
    parse_retry_after,
    server_delay,
    server_delay_jitter,
)


def top(a: float, b: float) -> float:
    return b


def bottom(a: float, b: float) -> float:
    return a


def test_full_equal_none() -> None:
    assert [backoff_delay(i, base=0.1, cap=1.0, uniform=top) for i in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff_delay(3, base=0.1, cap=10, jitter="full", uniform=bottom) == 0.0
    assert backoff_delay(3, base=0.1, cap=10, jitter="equal", uniform=bottom) == pytest.approx(0.4)
    assert backoff_delay(3, base=0.1, cap=10, jitter="none") == pytest.approx(0.8)


def test_decorrelated_starts_from_base_not_zero() -> None:
    assert backoff_delay(0, base=0.5, cap=10, jitter="decorrelated", previous=0.0, uniform=top) == 1.5
    assert backoff_delay(1, base=0.5, cap=10, jitter="decorrelated", previous=2.0, uniform=top) == 6.0
    assert backoff_delay(9, base=0.5, cap=10, jitter="decorrelated", previous=8.0, uniform=top) == 10.0


def test_unknown_jitter() -> None:
    with pytest.raises(ConfigError, match="jitter"):
        backoff_delay(0, jitter="gaussian")


def test_manuals_jittered_delay_respects_the_safe_window_and_the_cap() -> None:
    assert jittered_delay(0, 50_000, 2_000, uniform=top) == 25.0
    assert jittered_delay(0, 500_000, 2_000, uniform=top) == 60.0  # M/H = 250 s, capped
    assert jittered_delay(3, uniform=top) == 8.0


def test_retry_after_forms() -> None:
    assert parse_retry_after("120", 0) == 120.0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777.0 - 10) == pytest.approx(10.0)
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777.0 + 10) == 0.0
    for bad in ("1.5", "-3", "soon", "", None, "Sun, 99 Nov 1994 08:49:37 GMT"):
        assert parse_retry_after(bad, 0) is None


def test_ratelimit_t() -> None:
    assert parse_ratelimit_reset('"admitgate";r=0;t=7') == 7.0
    assert parse_ratelimit_reset('"a";r=1;t=3, "b";r=0;t=30') == 30.0
    assert parse_ratelimit_reset('"a";r=5') is None
    assert parse_ratelimit_reset('"a";t=1.5') is None


def test_retry_after_takes_precedence_over_t() -> None:
    headers = {"retry-after": "9", "ratelimit": '"a";r=0;t=4'}
    assert server_delay(headers.get, 0) == 9.0
    assert server_delay({"ratelimit": '"a";r=0;t=4'}.get, 0) == 4.0


@settings(deadline=None)  # about behaviour, not speed: a loaded machine must not fail it
@given(st.text(max_size=80))
def test_parsers_never_raise_on_garbage(value: str) -> None:
    r = parse_retry_after(value, 1e9)
    assert r is None or r >= 0
    t = parse_ratelimit_reset(value)
    assert t is None or t >= 0


JITTERED = st.sampled_from(["full", "equal", "decorrelated"])


@given(st.integers(0, 60), st.floats(0.001, 5), st.floats(0.01, 100), JITTERED, st.floats(0, 1))
def test_delays_are_within_zero_and_cap(attempt, base, cap, jitter, u) -> None:
    delay = backoff_delay(attempt, base=base, cap=cap, jitter=jitter, previous=base * 2,
                          uniform=lambda a, b: a + (b - a) * u)  # fmt: skip
    assert 0.0 <= delay <= cap


@pytest.mark.parametrize("value", ["³", "٣", "１２", "²⁰", "1e3", "0x10", "+5", "\x00", "Sun, 06 Nov 1994 ³"])
def test_non_ascii_or_malformed_retry_after_is_no_hint(value: str) -> None:
    assert parse_retry_after(value, 0) is None  # "³".isdigit() is True, and int("³") raised ValueError
    assert parse_ratelimit_reset(f'"a";r=0;t={value}') is None


def test_a_retry_after_too_long_for_an_int_is_infinite_not_an_error() -> None:
    assert parse_retry_after("9" * 5000, 0) == float("inf")  # int() refuses 5,000 digits
    assert parse_retry_after("12345678901234567890", 0) == 12345678901234567890.0


def test_server_delay_jitter_is_bounded_and_never_early() -> None:
    assert server_delay_jitter(7.0, uniform=top) == pytest.approx(7.7)
    assert server_delay_jitter(30.0, uniform=top) == 31.0
    assert server_delay_jitter(30.0, uniform=bottom) == 30.0
    assert server_delay_jitter(0.0, uniform=top) == 0.0
    assert server_delay_jitter(5.0, fraction=0.0, uniform=top) == 5.0


@given(st.text(max_size=40), st.floats(0, 1))
def test_server_delay_never_raises_on_any_header_text(value: str, u: float) -> None:
    for headers in ({"retry-after": value}, {"ratelimit": value}, {"ratelimit": f'"a";r=0;t={value}'}):
        told = server_delay(headers.get, 1e9)
        assert told is None or told >= 0
