"""A real-network thundering herd: N HTTP clients released at one instant, and the demo herd command.

Each client sends ``GET /work`` until it gets a 2xx, behaving as ``policy`` says on
429/503: ``"obey"`` sleeps exactly Retry-After (as urllib3 and httpx-retries do) or,
without one, a capped exponential backoff with full jitter; ``"urllib3"`` sleeps as urllib3's
``Retry`` does (:func:`urllib3_delay`) and keeps no cookies; ignorers retry
every ``ignore_interval`` s. Meanwhile *new arrivals* come at ``background_rate``
requests/s (Poisson) to the same ``/work``: ordinary clients, each on a new connection,
each making one attempt (served only if that attempt succeeds), as steady traffic does.
``steps`` change the service's capacity during the run. Every attempt is recorded as
:class:`~admitgate.sim.summary.Attempt`, and :func:`~admitgate.sim.summary.summarise` turns the records into the
herd figures. The run is bounded by ``deadline`` seconds and only ever targets the given (loopback) base URL.

:func:`demo_herd` is ``admitgate demo --herd N``: the demo server in a child process, and a herd against it.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence

from admitgate.core.backoff import backoff_delay
from admitgate.core.errors import ConfigError
from admitgate.sim.summary import Attempt, HerdResult, summarise

from .http1 import Http1Client
from .serving import demo_server, pin


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
    policy: str = "obey",
    ignorers_fresh: bool = False,
    addresses: Callable[[int], str] | None = None,
) -> HerdResult:
    """Release ``clients`` at once against ``base_url``; see the module docstring.

    ``recognisable=False`` makes each attempt a new connection without cookies, so the
    gate cannot tell a returning client from a new one. New arrivals start ``warmup``
    seconds before the release, as steady traffic would be (the gate measures λ_new over
    the last five whole seconds). ``steps``: ``(seconds after the release, workers)``, sent
    to the demo service's ``/stats?workers=``. Several base URLs (replicas) share the herd in the
    proportions ``split`` (default: evenly); each client keeps to its own. ``headers``: sent with every
    herd request (a tenant's key, say), or a function of the client's index giving them (a herd across many
    tenants); new arrivals send none. ``policy``: ``"obey"`` or ``"urllib3"`` (see the module docstring).
    ``ignorers_fresh``: each try of a client that ignores Retry-After is on a new connection without cookies.
    ``addresses``: the local address each connection is made from, by index: herd client ``i`` from ``addresses(i)``,
    the ``k``-th new arrival from ``addresses(clients + k)`` (None: the system's choice, 127.0.0.1 on loopback).
    """
    if policy not in ("obey", "urllib3"):
        raise ValueError(f"unknown policy {policy!r}")
    rng = random.Random(seed)
    result = HerdResult(clients)
    bases = [base_url] if isinstance(base_url, str) else list(base_url)
    targets = [(url.hostname or "127.0.0.1", url.port or 80) for url in map(urllib.parse.urlsplit, bases)]
    weights = list(split) or [1.0] * len(targets)
    edges = list(itertools.accumulate(w / sum(weights) * clients for w in weights))
    home = [targets[min(bisect.bisect_right(edges, i), len(targets) - 1)] for i in range(clients)]
    host, port = targets[0]
    ignorers = set(rng.sample(range(clients), round(clients * ignore_fraction)))
    kept = [recognisable and not (ignorers_fresh and i in ignorers) for i in range(clients)]
    pool = [Http1Client(*home[i], keep_alive=kept[i], cookies=kept[i] and policy == "obey",
                        headers=headers(i) if callable(headers) else headers,
                        local=None if addresses is None else addresses(i)) for i in range(clients)]  # fmt: skip
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
            elif policy == "urllib3":
                delay = urllib3_delay(attempt, retry_after)
            elif retry_after is not None:
                delay = float(retry_after)
            else:  # retry k (from 1) without a Retry-After: U(0, min(5, 0.1 * 2^k)), as the simulator models
                delay = backoff_delay(attempt, base=0.1, cap=5.0, uniform=rng.uniform)
            await asyncio.sleep(max(0.0, min(delay, stop_at - time.monotonic())))

    async def background(until: asyncio.Event) -> None:
        tasks: set[asyncio.Task[None]] = set()
        arrivals = itertools.count(clients)

        async def fire() -> None:
            sent = time.monotonic() - release
            target = rng.choices(targets, weights)[0]
            local = None if addresses is None else addresses(next(arrivals))
            status, _ = await Http1Client(*target, keep_alive=False, cookies=False, local=local).get(path)
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


def urllib3_delay(retries: int, retry_after: int | None, factor: float = 0.1, most: float = 120.0) -> float:
    """Seconds urllib3's ``Retry.sleep`` (urllib3 2.x, read in 2.7.0) waits before retry number ``retries`` + 1 of
    a request answered 429 or 503, with ``respect_retry_after_header=True`` and ``status_forcelist=(429, 503)``: a
    non-zero Retry-After as told; else ``get_backoff_time``: 0 after the first failure, then ``factor * 2 **
    (retries - 1)`` capped at ``most`` (``backoff_max``; no jitter, urllib3's default). ``factor``: 0.1, the
    example of urllib3's docs (its default, 0, retries at once). The herd's client never gives up, as with a
    ``total`` larger than any run's tries (``total=10_000``)."""
    if retry_after:
        return float(retry_after)
    return 0.0 if retries <= 1 else min(most, factor * 2 ** (retries - 1))


def _server_args(args: argparse.Namespace) -> list[str]:
    rate = [] if args.rate is None else ["--rate", str(args.rate)]
    return [
        "--gate", args.gate, "--spread", args.spread, "--workers", str(args.workers),
        "--service-time", str(args.service_time), "--queue-timeout", str(args.queue_timeout), *rate,
    ]  # fmt: skip


def _steps(raw: str | None) -> list[tuple[float, int]]:
    """``"5:10,20:20"`` -> [(5.0, 10), (20.0, 20)]: (seconds after the release, workers)."""
    if not raw:
        return []
    try:
        steps = [(float(t), int(w)) for t, w in (item.split(":") for item in raw.split(","))]
    except ValueError:
        raise ConfigError("step", "expected t:workers pairs like 5:10", raw) from None
    if any(t < 0 or w < 0 for t, w in steps):
        raise ConfigError("step", "times and workers must be >= 0", raw)
    return steps


def herd_ramp(workers: int, service_time: float, background: float, steps: list[tuple[float, int]]
              ) -> list[tuple[float, float]]:  # fmt: skip
    """H(t) = μ(t) − λ₀ as (t, H) points after the release, for the ∫H dt = M bound (H floored at 0)."""
    points = [(0.0, max(0.0, workers / service_time - background))]
    for t, count in steps:
        points += [(t, points[-1][1]), (t, max(0.0, count / service_time - background))]
    return points


def demo_herd(args: argparse.Namespace, capacity: float, to_json: Callable[[object], str]) -> int:
    """``admitgate demo --herd N``: serve the demo in a child process (core 0), release the herd from this one
    (core 1), print its summary (``to_json`` renders it with ``--json``); 0 if every client was served."""
    headroom = capacity - args.background
    steps = _steps(args.step)
    with demo_server(_server_args(args), cpu=0) as base:
        pin(1)
        try:  # the load generator must not be the bottleneck: uvloop where installed
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(
            run_herd(
                base,
                args.herd,
                ignore_fraction=args.ignore_fraction,
                recognisable=not args.unrecognisable,
                background_rate=args.background,
                deadline=args.deadline,
                steps=steps,
            )
        )
    ramp = herd_ramp(args.workers, args.service_time, args.background, steps) if steps else ()
    summary = summarise(result, headroom, ramp)
    summary["gate"] = args.gate
    if args.json:
        print(to_json(summary))
    else:
        _print_summary(summary, capacity, args.background)
    return 0 if summary["finished"] == summary["clients"] else 1


def _print_summary(s: dict[str, object], capacity: float, background: float) -> None:
    print(f"herd of {s['clients']} clients vs capacity {capacity:g} req/s with {background:g} req/s of new arrivals")
    print(f"  gate                  {s['gate']}")
    print(f"  finished              {s['finished']}/{s['clients']}")
    print(f"  drain time            {s['drain_s']} s   (M/H = {s['bound_s']} s, ratio {s['drain_ratio']})")
    if "bound_integral_s" in s:
        print(f"  with capacity steps   ∫H dt = M at {s['bound_integral_s']} s, ratio {s['drain_ratio_integral']}")
    print(f"  edge arrivals/s       mean {s['edge_per_s_mean']}, peak/avg {s['edge_peak_to_avg']}")
    attempts = s["attempts"] + s["new_attempts"]  # type: ignore[operator]  # (both ints)
    print(f"  attempts              {attempts} (herd {s['attempts']}, new arrivals {s['new_attempts']})   "
          f"status counts {s['status_counts']}")  # fmt: skip
    print(f"  5xx                   {s['server_5xx']}")
    ra = (s["retry_after_min"], s["retry_after_p50"], s["retry_after_max"])
    print(f"  Retry-After min/p50/max  {ra[0]} / {ra[1]} / {ra[2]} s")
    print(f"  herd latency p50/p99  {s['herd_latency_p50_s']} / {s['herd_latency_p99_s']} s")
    print(f"  new arrivals served   {s['new_served']} on their one try during the herd "
          f"({s['background_success']} over the run), p99 {s['background_p99_s']} s")  # fmt: skip
