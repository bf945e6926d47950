"""A real-network thundering herd: N HTTP clients released at one instant.

Each client sends ``GET /work`` until it gets a 2xx, behaving as ``policy`` says on
429/503: ``"obey"`` sleeps exactly Retry-After (as urllib3 and httpx-retries do) or,
without one, a capped exponential backoff with full jitter; ``"ignore"`` retries
every ``ignore_interval`` s. Meanwhile *new arrivals* come at ``background_rate``
requests/s (Poisson) to the same ``/work``: ordinary clients, each on a new connection,
each making one attempt (served only if that attempt succeeds), as steady traffic does.
``steps`` change the service's capacity during the run. Every attempt is recorded and
:func:`summarise` turns the records into the herd figures. The run is bounded by
``deadline`` seconds and only ever targets the given (loopback) base URL.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import random
import statistics
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.backoff import backoff_delay
from .http1 import Http1Client


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


async def run_herd(
    base_url: str | Sequence[str],
    clients: int = 2000,
    *,
    split: Sequence[float] = (),
    path: str = "/work",
    ignore_fraction: float = 0.0,
    ignore_interval: float = 0.1,
    recognisable: bool = True,
    background_rate: float = 20.0,
    deadline: float = 60.0,
    warmup: float = 6.0,
    steps: Sequence[tuple[float, int]] = (),
    seed: int = 1,
    headers: dict[str, str] | Callable[[int], dict[str, str]] | None = None,
) -> HerdResult:
    """Release ``clients`` at once against ``base_url``; see the module docstring.

    ``recognisable=False`` makes each attempt a new connection without cookies, so the
    gate cannot tell a returning client from a new one. New arrivals start ``warmup``
    seconds before the release, as steady traffic would be (the gate measures λ_new over
    the last five whole seconds). ``steps``: ``(seconds after the release, workers)``, sent
    to the demo service's ``/stats?workers=``. Several base URLs (replicas) share the herd in the
    proportions ``split`` (default: evenly); each client keeps to its own. ``headers``: sent with every
    herd request (a tenant's key, say), or a function of the client's index giving them (a herd across many
    tenants); new arrivals send none.
    """
    rng = random.Random(seed)
    result = HerdResult(clients)
    bases = [base_url] if isinstance(base_url, str) else list(base_url)
    targets = [(url.hostname or "127.0.0.1", url.port or 80) for url in map(urllib.parse.urlsplit, bases)]
    weights = list(split) or [1.0] * len(targets)
    edges = list(itertools.accumulate(w / sum(weights) * clients for w in weights))
    home = [targets[min(bisect.bisect_right(edges, i), len(targets) - 1)] for i in range(clients)]
    host, port = targets[0]
    pool = [Http1Client(*home[i], keep_alive=recognisable, cookies=recognisable,
                        headers=headers(i) if callable(headers) else headers) for i in range(clients)]  # fmt: skip
    ignorers = set(rng.sample(range(clients), round(clients * ignore_fraction)))
    release = time.monotonic() + warmup
    stop_at = release + deadline

    async def one(index: int, client: Http1Client) -> None:
        attempt = 0
        while time.monotonic() < stop_at:
            sent = time.monotonic() - release
            status, retry_after = await client.get(path)
            done = time.monotonic() - release
            result.attempts.append(Attempt(index, sent, done, status, retry_after))
            if 200 <= status < 300:
                result.finished[index] = done
                client.close()
                return
            attempt += 1
            if index in ignorers:
                delay = ignore_interval
            elif retry_after is not None:
                delay = float(retry_after)
            else:  # retry k (from 1) without a Retry-After: U(0, min(5, 0.1 * 2^k)), as the simulator models
                delay = backoff_delay(attempt, base=0.1, cap=5.0, uniform=rng.uniform)
            await asyncio.sleep(max(0.0, min(delay, stop_at - time.monotonic())))

    async def background(until: asyncio.Event) -> None:
        tasks: set[asyncio.Task[None]] = set()

        async def fire() -> None:
            sent = time.monotonic() - release
            target = rng.choices(targets, weights)[0]
            status, _ = await Http1Client(*target, keep_alive=False, cookies=False).get(path)
            result.attempts.append(Attempt(-1, sent, time.monotonic() - release, status, None))

        while not until.is_set() and background_rate > 0 and time.monotonic() < stop_at:
            task = asyncio.ensure_future(fire())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(rng.expovariate(background_rate))
        if tasks:
            await asyncio.wait(tasks)

    async def step(at: float, workers: int) -> None:
        await asyncio.sleep(max(0.0, release + at - time.monotonic()))
        await Http1Client(host, port, keep_alive=False).get(f"/stats?workers={workers}")

    herd_done = asyncio.Event()
    bg = asyncio.ensure_future(background(herd_done))
    changes = [asyncio.ensure_future(step(at, workers)) for at, workers in steps]
    await asyncio.sleep(max(0.0, release - time.monotonic()))
    try:
        await asyncio.gather(*(one(i, c) for i, c in enumerate(pool)))
    finally:
        herd_done.set()
        await bg
        for change in changes:
            change.cancel()
        for c in pool:
            c.close()
    return result


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
