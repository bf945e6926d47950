"""The gate's knobs: one validated, immutable object that code and the config file build alike.

    from admitgate import AdmitGate, Settings
    app.add_middleware(AdmitGate, rate=200, settings=Settings(burst=20, max_pacing_delay=1.0))

Every field is checked when the object is made, so a bad value fails in the module that wrote it,
before any server starts. Upper bounds catch values that can only be mistakes (a pacing hold of an hour,
a Retry-After of a million years); they are listed in :data:`BOUNDS` and the README.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import choice, integer, number

#: The most requests/s a rate (or a burst, in tokens) may be: far beyond any one process, and small
#: enough that every quantity derived from it (waiters, debt, places) stays finite.
MAX_RATE = 1e9
#: The least: one request in 1000 s. A slower "rate" is a mistake, and 1/rate must stay finite.
MIN_RATE = 1e-3
#: Spreading policies: consecutive places in the retry schedule, or places drawn uniformly over it.
SPREADS = ("schedule", "jitter")

#: field -> (lowest, highest, lowest excluded, unit) for the numeric fields.
BOUNDS: dict[str, tuple[float, float, bool, str]] = {
    "burst": (1.0, MAX_RATE, False, "tokens"),  # a request costs 1 token unless its route says otherwise
    "max_pacing_delay": (0.0, 60.0, False, "seconds"),
    "max_waiters": (0, 10_000_000, False, "requests"),
    "spread_window": (0.0, 86_400.0, True, "seconds"),
    "max_retry_after": (1.0, 86_400.0, False, "seconds"),
    "max_keys": (1, 10_000_000, False, "keys"),
    "refresh_interval": (0.0, 10.0, True, "seconds"),
    "tarpit": (0.0, 60.0, False, "seconds"),
    "max_tarpitted": (0, 1_000_000, False, "requests"),
    "standing_queue": (0.0, 3600.0, False, "seconds"),
    "fresh_pacing_delay": (0.0, 60.0, False, "seconds"),
    "new_window": (1, 3600, False, "seconds"),
    "growth": (0.0, 10.0, False, "per second"),
}  # fmt: skip
_INTEGERS = frozenset({"max_waiters", "max_keys", "max_tarpitted", "new_window"})


@dataclass(frozen=True, slots=True)
class Settings:
    """How the gate admits, paces and rejects. Times in seconds, rates in requests/s.

    ``burst``: tokens admitted at once from idle, at least 1 (None: a tenth of the rate, at least 1).
    ``max_pacing_delay``: the longest a new request is held for its token (0 disables pacing): half a second,
    well within the timeout of a typical client, so that a hold never turns an admission into a timeout. A
    returning client is held for its place up to a second (it was told to come back up to a second early:
    Retry-After is in whole seconds), and a request waiting for room in flight up to a few of the service's latencies.
    ``max_waiters``: most requests held at once (None: two pacing windows at the initial rate, at least 1000).
    ``spread``: ``"schedule"`` (consecutive places) or ``"jitter"`` (uniform over the backlog, or over
    ``spread_window`` seconds of H). ``max_retry_after``: the longest Retry-After promised; places beyond
    it are told a value folded into it. ``max_keys``: bound on the clients the schedule remembers.
    ``refresh_interval``: how often the rate is read from its source. ``tarpit``: how long the 429 of a
    client back before its time is held, at most ``max_tarpitted`` at once. ``standing_queue``,
    ``fresh_pacing_delay``: once the pacing queue has not emptied for ``standing_queue`` under sustained
    overload, a new request is held at most ``fresh_pacing_delay``. ``new_window``: seconds over which the
    rate of new requests is a median. ``growth``: how fast H may rise per second in the forecast behind
    Retry-After (None: what the rate source reports; 0 for a static rate).
    """

    burst: float | None = None
    max_pacing_delay: float = 0.5
    max_waiters: int | None = None
    spread: str = "schedule"
    spread_window: float | None = None
    max_retry_after: float = 3600.0
    max_keys: int = 100_000
    refresh_interval: float = 0.1
    tarpit: float = 1.0
    max_tarpitted: int = 1000
    standing_queue: float = 0.5
    fresh_pacing_delay: float = 0.05
    new_window: int = 5
    growth: float | None = None

    def __post_init__(self) -> None:
        choice("spread", self.spread, SPREADS)
        for name, (low, high, above, unit) in BOUNDS.items():
            value = getattr(self, name)
            if value is None and name in ("burst", "max_waiters", "spread_window", "growth"):
                continue
            if name in _INTEGERS:
                integer(name, value, int(low) + above, int(high))
            else:  # stored as a float, so Settings(burst=20) == Settings(burst=20.0)
                object.__setattr__(self, name, number(name, value, low, high, above=above, unit=unit))
