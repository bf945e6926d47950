"""What every capacity estimator is: probe windows in, the capacity μ (requests/s) out.

Every estimator implements :class:`Estimator`: :meth:`~Estimator.estimate` takes a
:class:`~admitgate.limit.window.Window` and returns the rate the gate should admit at, while
:attr:`~Estimator.mu` holds its belief about the capacity. The two differ only while an estimator drains a
queue it caused. The latency-reading estimators share :class:`Measured`: a :class:`Baseline`, a jittered
re-probe interval and a seeded random source.

The baseline latency (:class:`Baseline`) is the lowest *window average* seen over ``baseline_window``
seconds of unsaturated time, never a single sample; it is frozen while the service is saturated, so
sustained overload cannot drag it up.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Protocol, runtime_checkable

from ..core.errors import ConfigError, positive
from .window import Window


@runtime_checkable
class Estimator(Protocol):
    """Samples in, capacity out. ``mu`` is the belief (requests/s); ``baseline`` seconds or None."""

    name: str
    state: str
    mu: float | None
    #: True if μ is measured from this gate's own traffic (so it already excludes load the gate does not see)
    measured: bool

    @property
    def baseline(self) -> float | None:
        """The service's latency with no queue, seconds (None until measured)."""
        ...

    def estimate(self, window: Window) -> float:
        """The rate to admit at (requests/s, finite, > 0), given ``window``."""
        ...


class Baseline:
    """Lowest window-average latency over ``horizon`` seconds of *unfrozen* time (a sliding minimum).

    O(1) amortised per observation; memory bounded by the observations in one horizon.
    """

    __slots__ = ("_age", "_q", "horizon")

    def __init__(self, horizon: float = 30.0) -> None:
        self.horizon = positive("baseline_window", horizon)
        self._age = 0.0
        self._q: deque[tuple[float, float]] = deque()  # (age, latency), latencies increasing

    @property
    def value(self) -> float | None:
        return self._q[0][1] if self._q else None

    def observe(self, latency: float, dt: float) -> None:
        self._age += dt
        q = self._q
        while q and q[-1][1] >= latency:
            q.pop()
        q.append((self._age, latency))
        while q[0][0] < self._age - self.horizon:
            q.popleft()

    def reset(self, latency: float) -> None:
        """Forget the history: ``latency`` is the new baseline."""
        self._q.clear()
        self._q.append((self._age, latency))


def fraction(name: str, value: float, low: float = 0.0, high: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
        raise ConfigError(name, f"must be a number in ({low:g}, {high:g})", value)
    return float(value)


class Measured:
    """What the latency-reading estimators share: a baseline, a re-probe interval, seeded jitter."""

    name = ""
    measured = True

    def __init__(self, baseline_window: float, reprobe: float, seed: int | None) -> None:
        self._baseline = Baseline(positive(f"capacity.{self.name}.baseline_window", baseline_window))
        self.reprobe = positive(f"capacity.{self.name}.reprobe", reprobe)
        self._rng = random.Random(seed)
        self.mu: float | None = None
        self.state = "starting"

    @property
    def baseline(self) -> float | None:
        return self._baseline.value

    def _base(self, w: Window) -> float:
        """The baseline; the first window's latency if there is none yet."""
        base = self._baseline.value
        if base is None:
            self._baseline.observe(w.latency, w.dt)
            return w.latency
        return base

    def _reprobe_after(self, now: float) -> float:
        return now + self.reprobe * self._rng.uniform(0.85, 1.15)
