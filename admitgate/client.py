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
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx
except ImportError as exc:  # the transports are httpx transports: the 'client' extra brings httpx
    raise ImportError("admitgate.client needs httpx: pip install 'admitgate[client]'", name=exc.name) from exc

from .backoff import Uniform, backoff_delay, check_jitter, server_delay
from .clock import Clock
from .errors import integer, non_negative, positive

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
        integer("attempts", self.attempts, 1)
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


# The retry loop, free of I/O: it yields what to do next and is sent what happened. Both transports
# drive this one generator, so the sync and async paths cannot drift apart.
_Send = ("send",)


def _retry_steps(r: _Retrier, request: httpx.Request) -> Generator[tuple, object, None]:
    """Yields ``("send",)`` (answered with a Response or a retryable exception), ``("sleep", s)``,
    ``("discard", response)`` before a retry, and finally ``("return", response)`` or ``("raise", exc)``."""
    started = r.begin()
    retryable = r.retryable_request(request)
    attempt, previous = 0, None
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
            yield ("discard", outcome)
        yield ("sleep", delay)
        attempt, previous = attempt + 1, delay


class _Retrying:
    """What both transports hold: the inner transport, the policy's state, and the sleep function."""

    def __init__(self, inner: Any, policy: RetryPolicy | None, uniform: Uniform | None, sleep: Any,
                 clock: Clock, wall_clock: Clock) -> None:  # fmt: skip
        self.inner = inner
        self.sleep = sleep
        self._retrier = _Retrier(policy, uniform, clock, wall_clock)

    @property
    def stats(self) -> RetryStats:
        """Counters: requests, retries, skipped retries (budget, deadline), exhausted, sleeps."""
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
