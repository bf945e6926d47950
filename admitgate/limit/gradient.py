"""The ``"gradient"`` estimator, after Gradient2 and Envoy's adaptive concurrency."""

from __future__ import annotations

from ..core.errors import positive
from .estimator import Measured, fraction
from .window import Window


class Gradient(Measured):
    """Rate scaled by ``clamp((1 + tolerance) · baseline / latency, min_gradient, 1)`` per window.

    Decreases are smoothed (``smoothing``: the share of the new value per window); while the
    gradient is 1 and the gate is shedding, the rate grows by ``probe_gain`` per second. The
    baseline is frozen while the gradient is below 1, and re-probed (reset to the current latency)
    if it stays frozen for ``reprobe`` seconds ±15 %, so a slower service cannot pin the rate low.
    """

    name = "gradient"

    def __init__(
        self,
        tolerance: float = 0.5,
        min_gradient: float = 0.5,
        smoothing: float = 0.2,
        probe_gain: float = 0.2,
        baseline_window: float = 30.0,
        reprobe: float = 30.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(baseline_window, reprobe, seed)
        self.tolerance = positive("capacity.gradient.tolerance", tolerance)
        self.min_gradient = fraction("capacity.gradient.min_gradient", min_gradient)
        self.smoothing = fraction("capacity.gradient.smoothing", smoothing, high=1.0 + 1e-9)
        self.probe_gain = positive("capacity.gradient.probe_gain", probe_gain)
        self._frozen_since: float | None = None
        self._reprobe_at = 0.0

    def estimate(self, w: Window) -> float:
        mu = w.rate if self.mu is None else self.mu
        base = self._base(w)
        gradient = min(1.0, max(self.min_gradient, (1 + self.tolerance) * base / w.recent_latency))
        if w.drops:
            gradient = min(gradient, 1 - self.smoothing / 2)
        if gradient < 1:
            if self._frozen_since is None:
                self._frozen_since = w.now
                self._reprobe_at = self._reprobe_after(w.now)
            elif w.now >= self._reprobe_at:  # frozen too long: take the present latency as the new normal
                self._baseline.reset(w.latency)
                self._frozen_since = None
            self.state = "decreasing"
            mu = mu * (1 - self.smoothing * (1 - gradient))
        else:
            self._frozen_since = None
            self._baseline.observe(w.latency, w.dt)
            if w.limiting:
                self.state = "increasing"
                mu = max(mu, w.rate) * (1 + self.probe_gain) ** w.dt
            else:
                self.state = "app-limited"
        self.mu = mu
        return mu
