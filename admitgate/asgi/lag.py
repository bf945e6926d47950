"""The event loop's lag: how late a timer runs is how long ready work waits for the loop.

For a CPU-bound app the loop *is* the queue: requests wait to be read, parsed and run while the loop is busy with
others, before any middleware sees them. A timer armed every :data:`PERIOD` seconds reports how late it ran into
the probes (:meth:`~admitgate.core.probes.Probes.lag`), and says when it is next due
(:attr:`~admitgate.core.probes.Probes.lag_due`), so a loop too busy to run it at all still reads as late. It is
one callback every 25 ms: nothing on the request path.
"""

from __future__ import annotations

import asyncio

from ..core.clock import Clock
from ..core.gate import Gate
from ..core.probes import Probes

#: Seconds between the timer's runs.
PERIOD = 0.025


class LagMonitor:
    """Reports the running asyncio loop's lag into ``probes`` (seconds; times on ``clock``)."""

    __slots__ = ("_due", "_handle", "_loop", "clock", "period", "probes")

    def __init__(self, probes: Probes, clock: Clock, period: float = PERIOD) -> None:
        self.probes, self.clock, self.period = probes, clock, period
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Arm the timer on the running asyncio loop (idempotent; without one, as under trio, nothing runs)."""
        if self._handle is not None:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._arm()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.probes.lag_due = float("inf")

    def _arm(self) -> None:
        assert self._loop is not None
        self._due = self._loop.time() + self.period
        self.probes.lag_due = self.clock() + self.period
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        late = self._loop.time() - self._due
        self.probes.lag(late if late > 0 else 0.0, self.clock())
        self._arm()


def lag_monitor(gate: Gate, clock: Clock) -> LagMonitor | None:
    """The event loop's lag monitor for ``gate``, if its rate source's estimator reads the lag (else None)."""
    reads_lag = getattr(gate.capacity_source, "reads_lag", False)  # (a LiveCapacity's estimator's say)
    return LagMonitor(gate.probes, clock) if reads_lag and gate.probes is not None else None
