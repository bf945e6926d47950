"""The event loop's lag monitor: how late its timer runs is reported into the probes."""

from __future__ import annotations

import asyncio
import time

import pytest

from admitgate.asgi.lag import PERIOD, LagMonitor
from admitgate.core.probes import Probes


class FakeLoop:
    """A loop whose time is set by hand; call_at records the timer."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, object]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback):  # type: ignore[no-untyped-def]
        self.timers.append((when, callback))
        return self


def test_each_run_reports_how_late_it_ran_and_when_it_is_next_due() -> None:
    clock = [10.0]
    probes = Probes(now=10.0)
    monitor = LagMonitor(probes, lambda: clock[0])
    loop = FakeLoop()
    monitor._loop = loop  # (as start() does on a running loop)
    monitor._arm()
    assert probes.lag_due == pytest.approx(10.0 + PERIOD)
    due, tick = loop.timers[-1]
    assert due == pytest.approx(100.0 + PERIOD)
    loop.now, clock[0] = due + 0.3, 10.0 + PERIOD + 0.3  # the loop was busy: the timer ran 0.3 s late
    tick()  # type: ignore[operator]
    assert probes._lag == pytest.approx(0.3)
    assert probes.lag_due == pytest.approx(clock[0] + PERIOD)


def test_a_bucket_that_closes_past_a_timer_that_never_ran_reads_the_time_since_it_was_due() -> None:
    probes = Probes(now=0.0)
    probes.lag_due = 0.05
    probes.roll(0.35)  # three buckets closed; the timer never ran
    assert [round(b.lag, 3) for b in probes.ring] == [0.05, 0.15, 0.25]


def test_on_a_real_loop_a_blocked_loop_reads_as_lag() -> None:
    async def scenario() -> float:
        probes = Probes(now=time.monotonic())
        monitor = LagMonitor(probes, time.monotonic)
        monitor.start()
        assert monitor.running
        await asyncio.sleep(2 * PERIOD)
        time.sleep(0.2)  # the loop is blocked: the timer runs late
        while (probes._lag == 0.0 and not probes.ring) or max([b.lag for b in probes.ring] + [probes._lag]) == 0.0:
            await asyncio.sleep(PERIOD)
        monitor.stop()
        assert not monitor.running and probes.lag_due == float("inf")
        return max([b.lag for b in probes.ring] + [probes._lag])

    assert asyncio.run(scenario()) > 0.0


def test_without_a_running_asyncio_loop_nothing_runs() -> None:
    monitor = LagMonitor(Probes(), time.monotonic)
    monitor.start()
    assert not monitor.running
