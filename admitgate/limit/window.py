"""The probe window an estimator reads: a summary of the last second or so of probes.

:class:`~admitgate.limit.capacity.LiveCapacity` computes one from the gate's probes on the gate's refresh cadence
and hands it to its estimator. Time comes in the window, so an estimator reads no clock and the herd simulator
runs it on virtual time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    """Probe summary handed to an estimator. Rates in requests/s, times in seconds."""

    now: float
    dt: float  # since the previous window
    samples: int  # completions in the window (at least the configured minimum, else no estimate is asked)
    completion_rate: float  # completions per second: what the service delivered
    latency: float  # mean latency of those completions
    drops: int  # 502/503/504 in the newest 0.5 s: the service shed or timed out
    inflight: int  # requests in flight now
    busy: float  # time-average in flight over the newest 0.2 s (no lag: a queue shows here first)
    recent_latency: float  # mean latency over the newest 0.3 s at most (as few buckets as give 10 samples)
    admit_rate: float  # admissions per second over the newest 0.2 s (with busy: Little's latency, no lag)
    limiting: bool  # the gate paced or rejected requests: demand is above the rate
    rate: float  # the rate in force (what the gate admits at now)
    delivered: float | None = None  # completions per second over the newest 0.5 s (None: completion_rate)
    current: float | None = None  # completions per second over the newest 0.2 s (None: completion_rate)
    drop_rate: float | None = None  # drops per second over the delivered rate's span (None: drops / 0.5 s)
    lag: float = 0.0  # the longest the event loop ran late over the newest 0.2 s, seconds (0: not measured)
    stalled: bool = False  # requests are in flight and none answered for twice the slowest recent latency
