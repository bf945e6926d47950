"""The ``"aimd"`` estimator: additive increase, multiplicative decrease."""

from __future__ import annotations

from ..core.errors import ConfigError, positive
from .estimator import Measured, fraction
from .window import Window


class AIMD(Measured):
    """Additive increase (``increase`` requests/s per second, while shedding and under target),
    multiplicative decrease (× ``backoff`` on a drop or a mean latency over target), at most once per
    observed latency so one overload is not punished twice. The target is ``latency_target``
    seconds, or ``target_ratio`` × the baseline when unset.
    """

    name = "aimd"

    def __init__(
        self,
        increase: float = 10.0,
        backoff: float = 0.9,
        latency_target: float | None = None,
        target_ratio: float = 2.0,
        baseline_window: float = 30.0,
        reprobe: float = 30.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(baseline_window, reprobe, seed)
        self.increase = positive("capacity.aimd.increase", increase)
        self.backoff = fraction("capacity.aimd.backoff", backoff)
        self.latency_target = (
            None if latency_target is None else positive("capacity.aimd.latency_target", latency_target)
        )
        self.target_ratio = positive("capacity.aimd.target_ratio", target_ratio)
        if self.target_ratio <= 1:
            raise ConfigError("capacity.aimd.target_ratio", "must be > 1", target_ratio)
        self._cool = 0.0
        self._over_since: float | None = None
        self._reprobe_at = 0.0

    def estimate(self, w: Window) -> float:
        mu = w.rate if self.mu is None else self.mu
        base = self._base(w)
        target = self.latency_target or base * self.target_ratio
        if w.drops or w.recent_latency > target:
            if self._over_since is None:
                self._over_since = w.now
                self._reprobe_at = self._reprobe_after(w.now)
            elif self.latency_target is None and w.now >= self._reprobe_at:
                self._baseline.reset(w.latency / self.target_ratio * 1.01)  # the slower service is the new normal
                self._over_since = None
            if w.now >= self._cool:
                mu *= self.backoff
                self._cool = w.now + max(w.latency, w.dt)
            self.state = "decreasing"
        else:
            self._over_since = None
            if self.latency_target is None and w.latency <= base * (1 + (self.target_ratio - 1) / 2):
                self._baseline.observe(w.latency, w.dt)
            if w.limiting:
                self.state = "increasing"
                mu = max(mu, w.rate) + self.increase * w.dt
            else:
                self.state = "app-limited"
        self.mu = mu
        return mu
