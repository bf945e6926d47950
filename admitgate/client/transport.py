"""httpx transports that retry like a well-behaved client (the client the gate is designed for).

    import httpx
    from admitgate.client import AsyncRetryTransport, RetryPolicy

    transport = AsyncRetryTransport(httpx.AsyncHTTPTransport(), RetryPolicy(attempts=5, deadline=30))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get("https://api.example/items")

A request is retried only for retryable outcomes (429, 500, 502, 503, 504; timeouts, network
errors and a connection the server closed without answering, as httpx-retries and urllib3 do),
only for idempotent methods unless it carries an ``Idempotency-Key``, never earlier than the
server's Retry-After (or RateLimit ``t``) and a little later than it (bounded jitter), within a
retry budget, and only when the retry can still finish before the caller's deadline. Retries carry
the cookies the server set on the responses they follow. Skipped retries are counted. Randomness
and sleeping are injectable for tests.
"""

from __future__ import annotations

import asyncio
import re
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx
except ImportError as exc:  # the transports are httpx transports: the 'client' extra brings httpx
    raise ImportError("admitgate.client needs httpx: pip install 'admitgate[client]'", name=exc.name) from exc

from ..core.backoff import Uniform, backoff_delay, check_jitter, server_delay, server_delay_jitter
from ..core.clock import Clock
from ..core.errors import ConfigError, integer, non_negative, positive

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Transient transport failures, safe to retry for an idempotent request: every timeout (connect, read, write,
#: pool), every network error (connect, read, write, close) and a connection the server closed without an
#: answer, as when a keep-alive connection is reused at the moment the server's idle timeout closes it.
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class RetryBudget:
    """Token bucket limiting retries to a ratio of requests (gRPC / Finagle retry throttling).

    Each original request deposits ``ratio`` tokens; each retry withdraws one. ``min_per_second``
    retries are always allowed (so a quiet client can still retry); the balance is capped at
    ``ratio * window_requests`` so a long quiet spell cannot bank a storm.
    """

    def __init__(self, ratio: float = 0.2, *, min_per_second: float = 1.0, window_requests: int = 100,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.ratio = non_negative("budget.ratio", ratio)
        self.min_per_second = non_negative("budget.min_per_second", min_per_second)
        self.cap = max(1.0, self.ratio * window_requests)
        self.clock = clock
        self._balance = 0.0
        self._floor_tokens = self.min_per_second
        self._floor_at = clock()

    def deposit(self) -> None:
        self._balance = min(self.cap, self._balance + self.ratio)

    def try_withdraw(self) -> bool:
        now = self.clock()
        self._floor_tokens = min(self.min_per_second, self._floor_tokens + (now - self._floor_at) * self.min_per_second)
        self._floor_at = now
        if self._balance >= 1.0:
            self._balance -= 1.0
            return True
        if self._floor_tokens >= 1.0:
            self._floor_tokens -= 1.0
            return True
        return False


#: Upper bounds, seconds, of the buckets of :attr:`RetryStats.sleep_counts` (the last bucket is everything above).
SLEEP_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: How many of the latest delays :attr:`RetryStats.sleeps` keeps.
SLEEPS_KEPT = 100


@dataclass
class RetryStats:
    """What a transport has done, in bounded memory whatever its lifetime: counters, the seconds slept in
    total and per :data:`SLEEP_BOUNDS` bucket, and the latest :data:`SLEEPS_KEPT` delays (a ring)."""

    requests: int = 0
    retries: int = 0
    skipped_budget: int = 0
    skipped_deadline: int = 0
    exhausted: int = 0  # gave up after the last attempt
    slept: float = 0.0  # seconds slept before retries, in total
    sleep_counts: list[int] = field(default_factory=lambda: [0] * (len(SLEEP_BOUNDS) + 1))  # per bucket
    sleeps: deque[float] = field(default_factory=lambda: deque(maxlen=SLEEPS_KEPT))  # the latest delays, seconds

    def sleeping(self, delay: float) -> None:
        """Count a retry that sleeps ``delay`` seconds first."""
        self.retries += 1
        self.slept += delay
        self.sleep_counts[bisect_left(SLEEP_BOUNDS, delay)] += 1
        self.sleeps.append(delay)


@dataclass
class RetryPolicy:
    """How to retry. Times in seconds.

    ``attempts``: total tries including the first. ``base``/``cap``/``jitter``: the backoff.
    ``retry_after_jitter``/``retry_after_jitter_cap``: a server's Retry-After ``d`` is slept as
    ``d + U(0, min(cap, fraction·d))``, never earlier than ``d`` and at most 10 % or 1 s later by default,
    so clients told the same value do not come back together (0 sleeps exactly ``d``).
    ``deadline``: the whole call must finish within this many seconds of its start (None: no gate);
    a retry is skipped when its delay (jitter included) plus the last attempt's duration would cross it.
    ``max_retry_after``: a Retry-After longer than this ends the retries instead of sleeping.
    """

    attempts: int = 4
    base: float = 0.1
    cap: float = 20.0
    jitter: str = "full"
    retry_after_jitter: float = 0.1
    retry_after_jitter_cap: float = 1.0
    deadline: float | None = None
    max_retry_after: float = 300.0
    statuses: frozenset[int] = RETRY_STATUSES
    budget: RetryBudget | None = None

    def __post_init__(self) -> None:
        integer("attempts", self.attempts, 1)
        positive("base", self.base)
        positive("cap", self.cap)
        check_jitter(self.jitter)
        if not 0 <= non_negative("retry_after_jitter", self.retry_after_jitter) <= 1:
            raise ConfigError("retry_after_jitter", "must be a fraction of the server's delay, in [0, 1]",
                              self.retry_after_jitter)  # fmt: skip
        non_negative("retry_after_jitter_cap", self.retry_after_jitter_cap)
        if self.deadline is not None:
            positive("deadline", self.deadline)
        positive("max_retry_after", self.max_retry_after)


class _Retrier:
    """The decision logic shared by the sync and async transports."""

    def __init__(self, policy: RetryPolicy | None, uniform: Uniform | None, clock: Callable[[], float],
                 wall_clock: Callable[[], float]) -> None:  # fmt: skip
        import random

        self.policy = policy or RetryPolicy()
        self.uniform = uniform or random.uniform
        self.clock, self.wall_clock = clock, wall_clock
        self.stats = RetryStats()

    @staticmethod
    def retryable_request(request: httpx.Request) -> bool:
        if request.method not in IDEMPOTENT and "idempotency-key" not in request.headers:
            return False
        return isinstance(request.stream, httpx.ByteStream) or request.method in ("GET", "HEAD", "OPTIONS", "DELETE")

    def next_delay(self, attempt: int, previous: float | None, response: httpx.Response | None,
                   started: float, attempt_time: float) -> float | None:  # fmt: skip
        """Seconds to sleep before the next try, or None to stop."""
        p = self.policy
        if attempt + 1 >= p.attempts:
            self.stats.exhausted += 1
            return None
        delay = backoff_delay(attempt, base=p.base, cap=p.cap, jitter=p.jitter, previous=previous, uniform=self.uniform)
        if response is not None:
            told = server_delay(response.headers.get, self.wall_clock())
            if told is not None:
                if told > p.max_retry_after:
                    self.stats.exhausted += 1
                    return None
                told = server_delay_jitter(told, fraction=p.retry_after_jitter, cap=p.retry_after_jitter_cap,
                                           uniform=self.uniform)  # fmt: skip
                delay = max(delay, told)  # never earlier than the server said
        if p.deadline is not None and self.clock() - started + delay + attempt_time > p.deadline:
            self.stats.skipped_deadline += 1
            return None
        if p.budget is not None and not p.budget.try_withdraw():
            self.stats.skipped_budget += 1
            return None
        self.stats.sleeping(delay)
        return delay

    def begin(self) -> float:
        self.stats.requests += 1
        if self.policy.budget is not None:
            self.policy.budget.deposit()
        return self.clock()


# The retry loop, free of I/O: it yields what to do next and is sent what happened. Both transports
# drive this one generator, so the sync and async paths cannot drift apart.
_Send = ("send",)


def _retry_steps(r: _Retrier, request: httpx.Request) -> Generator[tuple, object, None]:
    """Yields ``("send",)`` (answered with a Response or a retryable exception), ``("sleep", s)``,
    ``("discard", response)`` before a retry, and finally ``("return", response)`` or ``("raise", exc)``."""
    started = r.begin()
    retryable = r.retryable_request(request)
    attempt, previous = 0, None
    jar: httpx.Cookies | None = None  # what the responses to this call set, for the retries
    while True:
        t0 = r.clock()
        outcome = yield _Send
        elapsed = r.clock() - t0
        if isinstance(outcome, BaseException):
            delay = r.next_delay(attempt, previous, None, started, elapsed) if retryable else None
            if delay is None:
                yield ("raise", outcome)
                return
        else:
            assert isinstance(outcome, httpx.Response)
            if not retryable or outcome.status_code not in r.policy.statuses:
                yield ("return", outcome)
                return
            delay = r.next_delay(attempt, previous, outcome, started, elapsed)
            if delay is None:
                yield ("return", outcome)
                return
            if "set-cookie" in outcome.headers:
                jar = jar if jar is not None else httpx.Cookies()
                _carry_cookies(request, outcome, jar)
            yield ("discard", outcome)
        yield ("sleep", delay)
        attempt, previous = attempt + 1, delay


def _carry_cookies(request: httpx.Request, response: httpx.Response, jar: httpx.Cookies) -> None:
    """Put the cookies ``response`` sets on ``request``, which is about to be retried.

    A transport sits below the client's cookie jar, which sees only the final response; a server that
    knows a returning client by a cookie (admitgate's ``admitgate_rt`` retry ticket) must see it on the
    retries. ``jar`` keeps what this call's responses set, with the usual domain, path and expiry rules;
    a cookie the request carries is replaced by a newer value of the same name, the others are kept.
    """
    response.request = request
    jar.extract_cookies(response)
    for cookie in list(jar.jar):  # only what RFC 6265 §4.1.1 allows can go on the wire again
        if cookie.value is None or not (_COOKIE_NAME.fullmatch(cookie.name) and _COOKIE_VALUE.fullmatch(cookie.value)):
            jar.jar.clear(cookie.domain, cookie.path, cookie.name)
    probe = httpx.Request(request.method, request.url)
    jar.set_cookie_header(probe)
    fresh = _cookie_pairs(probe.headers.get("cookie", ""))
    if fresh:
        names = {name for name, _ in fresh}
        kept = [pair for pair in _cookie_pairs(request.headers.get("cookie", "")) if pair[0] not in names]
        request.headers["cookie"] = "; ".join(f"{name}={value}" for name, value in kept + fresh)


_COOKIE_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token
_COOKIE_VALUE = re.compile(r'"?[\x21\x23-\x2B\x2D-\x3A\x3C-\x5B\x5D-\x7E]*"?')  # cookie-octets, maybe quoted


def _cookie_pairs(header: str) -> list[tuple[str, str]]:
    """``"a=1; b=2"`` -> ``[("a", "1"), ("b", "2")]`` (a Cookie header, RFC 6265 §4.2.1)."""
    pairs = (item.strip().partition("=") for item in header.split(";"))
    return [(name, value) for name, _, value in pairs if name]


class _Retrying:
    """What both transports hold: the inner transport, the policy's state, and the sleep function."""

    def __init__(self, inner: Any, policy: RetryPolicy | None, uniform: Uniform | None, sleep: Any,
                 clock: Clock, wall_clock: Clock) -> None:  # fmt: skip
        self.inner = inner
        self.sleep = sleep
        self._retrier = _Retrier(policy, uniform, clock, wall_clock)

    @property
    def stats(self) -> RetryStats:
        """Counters: requests, retries, skipped retries (budget, deadline), exhausted, and the delays slept
        (:class:`RetryStats`: bounded, however long the transport lives)."""
        return self._retrier.stats


class RetryTransport(_Retrying, httpx.BaseTransport):
    """Synchronous retrying transport wrapping ``inner``. ``sleep`` defaults to :func:`time.sleep`."""

    def __init__(self, inner: httpx.BaseTransport | None = None, policy: RetryPolicy | None = None, *,
                 uniform: Uniform | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Clock = time.monotonic, wall_clock: Clock = time.time) -> None:  # fmt: skip
        super().__init__(inner or httpx.HTTPTransport(), policy, uniform, sleep, clock, wall_clock)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        steps = _retry_steps(self._retrier, request)
        step = next(steps)
        while True:
            if step is _Send:
                try:
                    outcome: object = self.inner.handle_request(request)
                except RETRY_EXCEPTIONS as exc:
                    outcome = exc
                step = steps.send(outcome)
                continue
            kind, value = step
            if kind == "return":
                return value
            if kind == "raise":
                raise value
            if kind == "discard":
                value.read()
                value.close()
            else:
                self.sleep(value)
            step = next(steps)

    def close(self) -> None:
        self.inner.close()


class AsyncRetryTransport(_Retrying, httpx.AsyncBaseTransport):
    """Asynchronous retrying transport wrapping ``inner``. ``sleep`` defaults to :func:`asyncio.sleep`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None, policy: RetryPolicy | None = None, *,
                 uniform: Uniform | None = None, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Clock = time.monotonic, wall_clock: Clock = time.time) -> None:  # fmt: skip
        super().__init__(inner or httpx.AsyncHTTPTransport(), policy, uniform, sleep, clock, wall_clock)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        steps = _retry_steps(self._retrier, request)
        step = next(steps)
        while True:
            if step is _Send:
                try:
                    outcome: object = await self.inner.handle_async_request(request)
                except RETRY_EXCEPTIONS as exc:
                    outcome = exc
                step = steps.send(outcome)
                continue
            kind, value = step
            if kind == "return":
                return value
            if kind == "raise":
                raise value
            if kind == "discard":
                await value.aread()
                await value.aclose()
            else:
                await self.sleep(value)
            step = next(steps)

    async def aclose(self) -> None:
        await self.inner.aclose()
