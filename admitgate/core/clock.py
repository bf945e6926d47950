"""Injected time.

Every time-dependent piece of admitgate reads time through a ``Clock``: a callable
returning seconds on a monotonic scale. The server uses :func:`time.monotonic`;
tests and the simulator use :class:`ManualClock`, so the same pacer and spreading
code runs on real and virtual time.
"""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]  # seconds, monotonic


class ManualClock:
    """A clock that only moves when told to: ``clock.advance(0.5)``, or ``await clock.sleep(0.5)``."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Sleep on this clock: advance it by ``seconds`` (if positive) and yield to the event loop once."""
        import anyio

        if seconds > 0:
            self.now += seconds
        await anyio.sleep(0)

    def __repr__(self) -> str:
        return f"ManualClock(now={self.now!r})"
