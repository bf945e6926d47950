"""The static estimator: a capacity typed in, as configured (requests/s)."""

from __future__ import annotations

from ..core.errors import positive
from .window import Window


class Static:
    """A fixed capacity (requests/s), as configured."""

    name = "static"
    measured = False
    baseline: float | None = None

    def __init__(self, capacity: float) -> None:
        self.mu: float | None = positive("capacity.static.capacity", capacity)
        self.state = "static"

    def estimate(self, window: Window) -> float:
        return self.mu  # type: ignore[return-value]
