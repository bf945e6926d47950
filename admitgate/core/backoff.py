"""Retry delays: capped exponential backoff with jitter, and reading what the server said.

Pure functions with an injectable random source, shared by the httpx transports in
:mod:`admitgate.client` and usable by callers of any other HTTP library.
"""

from __future__ import annotations

import email.utils
import random
import re
from collections.abc import Callable

from ..core.errors import ConfigError

Uniform = Callable[[float, float], float]
JITTERS = ("full", "equal", "decorrelated", "none")


def backoff_delay(
    attempt: int,
    *,
    base: float = 0.1,
    cap: float = 20.0,
    jitter: str = "full",
    previous: float | None = None,
    uniform: Uniform = random.uniform,
) -> float:
    """Delay in seconds before retry number ``attempt`` (0 for the first retry), within [0, cap].

    * ``full``: U(0, min(cap, base·2^attempt)) — the default; the lowest total load;
    * ``equal``: half the exponential delay plus U(0, half) — a guaranteed minimum wait;
    * ``decorrelated``: min(cap, U(base, 3·previous)), ``previous`` starting at ``base`` (a
      previous of 0 would make every delay 0, a slip in some published snippets);
    * ``none``: min(cap, base·2^attempt), no randomness (synchronises a fleet: avoid).
    """
    if attempt < 0:
        raise ConfigError("attempt", "must be >= 0", attempt)
    exp = min(cap, base * 2.0 ** min(attempt, 1024))
    if jitter == "full":
        return uniform(0.0, exp)
    if jitter == "equal":
        return exp / 2 + uniform(0.0, exp / 2)
    if jitter == "decorrelated":
        prev = base if previous is None or previous < base else previous
        return min(cap, uniform(base, prev * 3))
    if jitter == "none":
        return exp
    raise ConfigError("jitter", f"unknown; known: {', '.join(JITTERS)}", jitter)


def jittered_delay(
    attempt: int,
    cohort_size: int | None = None,
    headroom: float | None = None,
    *,
    base: float = 1.0,
    max_delay: float = 60.0,
    uniform: Uniform = random.uniform,
) -> float:
    """The design manual's client delay, made complete: U(0, W) with W the exponential window,
    widened to the cohort's minimum safe window M/H when both are known, and never above ``max_delay``
    (the manual's version lets M/H exceed its own cap)."""
    window = min(base * 2.0 ** min(attempt, 1024), max_delay)
    if cohort_size and headroom and headroom > 0:
        window = min(max(window, cohort_size / headroom), max_delay)
    return uniform(0.0, window)


def server_delay_jitter(
    told: float, *, fraction: float = 0.1, cap: float = 1.0, uniform: Uniform = random.uniform
) -> float:
    """A server's delay ``told`` (seconds) plus U(0, min(cap, fraction·told)): never earlier than told.

    Clients told the same Retry-After must not come back together. The jitter is bounded so that it
    cannot defeat the server's schedule or the caller's deadline: a fraction of the delay, and at most
    ``cap`` (1 s by default, the resolution of Retry-After itself, so a client stays within the second
    it was told).
    """
    return told + uniform(0.0, min(cap, fraction * told))


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """Seconds to wait from a Retry-After value: delay-seconds or an HTTP-date; None if malformed.

    Never raises. A date in the past means 0. Delay-seconds are ASCII digits only (RFC 9110 §10.2.3):
    ``"³"`` or ``"٣"`` are digits to :meth:`str.isdigit` but no hint here. A delay too long for a float
    is infinite (the caller gives up rather than retrying at once).
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    return max(0.0, parsed.timestamp() - now_wall)


_T_PARAM = re.compile(r";\s*t\s*=\s*([0-9]{1,15})(?=\s*(?:;|,|$))", re.ASCII)


def parse_ratelimit_reset(value: str | None) -> float | None:
    """The largest ``t`` (an effective window: seconds within which no more than ``r`` may be used) in an IETF
    ``RateLimit`` field; None if absent.

    Malformed fields are ignored (draft §7), never raised on.
    """
    if not value:
        return None
    found = [int(m.group(1)) for m in _T_PARAM.finditer(value)]
    return float(max(found)) if found else None


def server_delay(headers: Callable[[str], str | None], now_wall: float) -> float | None:
    """What the server asked for: Retry-After, else the RateLimit field's ``t`` (Retry-After takes precedence)."""
    retry_after = parse_retry_after(headers("retry-after"), now_wall)
    if retry_after is not None:
        return retry_after
    return parse_ratelimit_reset(headers("ratelimit"))


def check_jitter(jitter: str) -> str:
    if jitter not in JITTERS:
        raise ConfigError("jitter", f"unknown; known: {', '.join(JITTERS)}", jitter)
    return jitter
