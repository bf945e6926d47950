"""httpx transports that retry like a well-behaved client (the client the gate is designed for).

    import httpx
    from admitgate.client import AsyncRetryTransport, RetryPolicy

    transport = AsyncRetryTransport(httpx.AsyncHTTPTransport(), RetryPolicy(attempts=5, deadline=30))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get("https://api.example/items")

A request is retried only for retryable outcomes (429, 500, 502, 503, 504; connect and read
timeouts; connection failures, DNS included), only for idempotent methods unless it carries an
``Idempotency-Key``, never earlier than the server's Retry-After (or RateLimit ``t``), within a
retry budget, and only when the retry can still finish before the caller's deadline. Skipped
retries are counted. Randomness and sleeping are injectable for tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from .backoff import Uniform, backoff_delay, check_jitter, server_delay
from .clock import Clock
from .errors import ConfigError, non_negative, positive

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout)


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


@dataclass
class RetryStats:
    requests: int = 0
    retries: int = 0
    skipped_budget: int = 0
    skipped_deadline: int = 0
    exhausted: int = 0  # gave up after the last attempt
    sleeps: list[float] = field(default_factory=list)  # every delay slept, seconds


@dataclass
class RetryPolicy:
    """How to retry. Times in seconds.

    ``attempts``: total tries including the first. ``base``/``cap``/``jitter``: the backoff.
    ``deadline``: the whole call must finish within this many seconds of its start (None: no gate);
    a retry is skipped when its delay plus the last attempt's duration would cross it.
    ``max_retry_after``: a Retry-After longer than this ends the retries instead of sleeping.
    """

    attempts: int = 4
    base: float = 0.1
    cap: float = 20.0
    jitter: str = "full"
    deadline: float | None = None
    max_retry_after: float = 300.0
    statuses: frozenset[int] = RETRY_STATUSES
    budget: RetryBudget | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError("attempts", "must be an integer >= 1", self.attempts)
        positive("base", self.base)
        positive("cap", self.cap)
        check_jitter(self.jitter)
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
                delay = max(delay, told)  # never earlier than the server said
        if p.deadline is not None and self.clock() - started + delay + attempt_time > p.deadline:
            self.stats.skipped_deadline += 1
            return None
        if p.budget is not None and not p.budget.try_withdraw():
            self.stats.skipped_budget += 1
            return None
        self.stats.retries += 1
        self.stats.sleeps.append(delay)
        return delay

    def begin(self) -> float:
        self.stats.requests += 1
        if self.policy.budget is not None:
            self.policy.budget.deposit()
        return self.clock()


class RetryTransport(httpx.BaseTransport):
    """Synchronous retrying transport wrapping ``inner``. ``sleep`` defaults to :func:`time.sleep`."""

    def __init__(self, inner: httpx.BaseTransport | None = None, policy: RetryPolicy | None = None, *,
                 uniform: Uniform | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Clock = time.monotonic, wall_clock: Clock = time.time) -> None:  # fmt: skip
        self.inner = inner or httpx.HTTPTransport()
        self._retrier = _Retrier(policy, uniform, clock, wall_clock)
        self.sleep = sleep

    @property
    def stats(self) -> RetryStats:
        return self._retrier.stats

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self._retrier
        started = r.begin()
        retryable = r.retryable_request(request)
        attempt, previous = 0, None
        while True:
            t0 = r.clock()
            try:
                response = self.inner.handle_request(request)
            except RETRY_EXCEPTIONS:
                if not retryable or (delay := r.next_delay(attempt, previous, None, started, r.clock() - t0)) is None:
                    raise
            else:
                if not retryable or response.status_code not in r.policy.statuses:
                    return response
                delay = r.next_delay(attempt, previous, response, started, r.clock() - t0)
                if delay is None:
                    return response
                response.read()
                response.close()
            self.sleep(delay)
            attempt, previous = attempt + 1, delay

    def close(self) -> None:
        self.inner.close()


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    """Asynchronous retrying transport wrapping ``inner``. ``sleep`` defaults to :func:`asyncio.sleep`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None, policy: RetryPolicy | None = None, *,
                 uniform: Uniform | None = None, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Clock = time.monotonic, wall_clock: Clock = time.time) -> None:  # fmt: skip
        self.inner = inner or httpx.AsyncHTTPTransport()
        self._retrier = _Retrier(policy, uniform, clock, wall_clock)
        self.sleep = sleep

    @property
    def stats(self) -> RetryStats:
        return self._retrier.stats

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        r = self._retrier
        started = r.begin()
        retryable = r.retryable_request(request)
        attempt, previous = 0, None
        while True:
            t0 = r.clock()
            try:
                response = await self.inner.handle_async_request(request)
            except RETRY_EXCEPTIONS:
                if not retryable or (delay := r.next_delay(attempt, previous, None, started, r.clock() - t0)) is None:
                    raise
            else:
                if not retryable or response.status_code not in r.policy.statuses:
                    return response
                delay = r.next_delay(attempt, previous, response, started, r.clock() - t0)
                if delay is None:
                    return response
                await response.aread()
                await response.aclose()
            await self.sleep(delay)
            attempt, previous = attempt + 1, delay

    async def aclose(self) -> None:
        await self.inner.aclose()
