"""A herd's records and figures: what every attempt of a herd got, and the herd figures drawn from them.

The simulator (:mod:`admitgate.sim.engine`) and the loopback herd driver of the source tree's lab record the
same :class:`Attempt` per request, so :func:`summarise` computes the same figures for simulated and real herds.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Attempt:
    client: int  # -1 for background traffic
    sent: float  # seconds since release
    done: float
    status: int  # 0: transport error
    retry_after: int | None


@dataclass(slots=True)
class HerdResult:
    clients: int
    attempts: list[Attempt] = field(default_factory=list)
    finished: dict[int, float] = field(default_factory=dict)  # client -> time of its 2xx


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarise(result: HerdResult, headroom: float, ramp: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """Herd figures. ``headroom``: H = μ − λ₀ in requests/s, for the bound M/H. ``ramp``: H(t) as
    ``(seconds after the release, H)`` points when capacity changes during the herd: the bound is then
    the least T with ∫H dt = M (:func:`admitgate.planning.planner.drain_time`), as ``bound_integral_s``.

    Edge peak-to-average is taken over the seconds in which the herd is coming back: whole
    seconds from second 1 (after the release itself) up to, not including, the second of the
    herd's last attempt (a partial second). The last moments of a drain, when every remaining
    client is already held by the gate and nobody arrives, are not part of it.
    """
    herd = [a for a in result.attempts if a.client >= 0]
    bg = [a for a in result.attempts if a.client < 0 and a.sent >= 0]
    drain = max(result.finished.values()) if len(result.finished) == result.clients else float("inf")
    per_second = Counter(int(a.sent) for a in herd)
    last = max(per_second, default=0)
    window = [per_second.get(s, 0) for s in range(1, max(2, last))]
    mean = statistics.fmean(window) if window else 0.0
    retry_afters = [a.retry_after for a in herd if a.retry_after is not None]
    ok_latency = [a.done - a.sent for a in herd if 200 <= a.status < 300]
    bg_ok = [a for a in bg if 200 <= a.status < 300]
    bound = result.clients / headroom
    integral = {}
    if ramp:
        from ..planning.planner import drain_time

        least = drain_time(result.clients, ramp)
        integral = {"bound_integral_s": round(least, 3), "drain_ratio_integral": round(drain / least, 3)}
    # New arrivals during the herd: served on their one try? (the herd's window: release to drain)
    during = [a for a in bg if a.sent <= drain]
    # Crowds: how many rejected herd clients were told to come back within the same whole second.
    promised = Counter(int(a.done + a.retry_after) for a in herd if a.retry_after is not None)
    return {
        "clients": result.clients,
        "finished": len(result.finished),
        "drain_s": round(drain, 3),
        "bound_s": round(bound, 3),
        "drain_ratio": round(drain / bound, 3),
        "attempts": len(herd),
        "new_attempts": len(bg),
        "edge_peak_to_avg": round(max(window) / mean, 3) if mean else None,
        "edge_per_s_mean": round(mean, 1),
        "status_counts": dict(sorted(Counter(a.status for a in herd + bg).items())),
        "server_5xx": sum(1 for a in herd + bg if a.status >= 500),
        "retry_after_min": min(retry_afters, default=None),
        "retry_after_p50": _percentile([float(r) for r in retry_afters], 0.5) if retry_afters else None,
        "retry_after_max": max(retry_afters, default=None),
        "herd_latency_p50_s": round(_percentile(ok_latency, 0.5), 3) if ok_latency else None,
        "herd_latency_p99_s": round(_percentile(ok_latency, 0.99), 3) if ok_latency else None,
        "background_success": round(len(bg_ok) / len(bg), 3) if bg else None,
        "new_served": round(sum(200 <= a.status < 300 for a in during) / len(during), 3) if during else None,
        "promised_peak_per_s": max(promised.values(), default=0),
        "background_p50_s": round(_percentile([a.done - a.sent for a in bg_ok], 0.5), 3) if bg_ok else None,
        "background_p99_s": round(_percentile([a.done - a.sent for a in bg_ok], 0.99), 3) if bg_ok else None,
        **integral,
    }
