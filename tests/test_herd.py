"""The herd driver's arithmetic, and a small real herd through the demo server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from admitgate.demo import Upstream
from admitgate.sim.summary import Attempt, HerdResult, summarise


def test_summary_arithmetic() -> None:
    r = HerdResult(clients=3)
    r.attempts = [
        Attempt(0, 0.0, 0.1, 429, 2), Attempt(1, 0.0, 0.1, 429, 3), Attempt(2, 0.0, 0.1, 200, None),
        Attempt(0, 1.2, 1.3, 200, None), Attempt(1, 2.1, 2.2, 503, None), Attempt(1, 3.5, 4.0, 200, None),
        Attempt(-1, 0.5, 0.6, 200, None), Attempt(-1, -1.0, -0.9, 200, None),  # warm-up traffic is left out
    ]  # fmt: skip
    r.finished = {2: 0.1, 0: 1.3, 1: 4.0}
    s = summarise(r, headroom=1.5)
    assert s["drain_s"] == 4.0 and s["bound_s"] == 2.0 and s["drain_ratio"] == 2.0
    assert s["edge_per_s_mean"] == 1.0 and s["edge_peak_to_avg"] == 1.0  # seconds 1, 2, 3: one try each
    assert s["server_5xx"] == 1 and s["status_counts"] == {200: 4, 429: 2, 503: 1}
    assert (s["retry_after_min"], s["retry_after_max"]) == (2, 3)
    assert s["background_success"] == 1.0


def test_unfinished_herd_has_infinite_drain() -> None:
    r = HerdResult(clients=2)
    r.attempts = [Attempt(0, 0.0, 0.1, 200, None), Attempt(1, 0.0, 0.1, 429, 5)]
    r.finished = {0: 0.1}
    assert summarise(r, 10.0)["drain_s"] == float("inf")


@pytest.mark.integration
def test_the_demo_herd_on_a_real_server_finishes_and_is_spread() -> None:
    """The demo command end to end: every client of the herd is served, and the herd overflowed the pacing window
    and was told to come back. Whether the demo service times a request out (its 503) depends on how fast this
    machine runs it at the herd's onset; the herd's 5xx on virtual time are pinned in tests/test_sim.py, and on a
    quiet machine measured by bench/herd.py."""
    out = subprocess.run(
        [sys.executable, "-m", "admitgate", "demo", "--herd", "800", "--json", "--deadline", "60"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["finished"] == 800
    assert summary["retry_after_min"] >= 1  # the herd overflowed the pacing window and was spread
    assert {"200", "429"} <= set(summary["status_counts"]) <= {"200", "429", "503"}


def test_a_herd_across_tenants_sends_each_client_its_own_key(serve) -> None:
    """``headers`` as a function of the client's index: each herd client sends its own tenant's key on every
    attempt, and the new arrivals none (bench/tenant_herd.py --tenants)."""
    import asyncio

    from lab.herd import run_herd

    seen: list[tuple[str, str | None]] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        key = dict(scope["headers"]).get(b"x-api-key")
        seen.append((scope["path"], key.decode() if key else None))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with serve(app) as base:
        result = asyncio.run(run_herd(base, 30, background_rate=20.0, warmup=0.5, deadline=10.0,
                                      headers=lambda i: {"x-api-key": f"big-{i % 3}"}))  # fmt: skip
    assert len(result.finished) == 30
    herd = [key for path, key in seen if key is not None]
    assert sorted(set(herd)) == ["big-0", "big-1", "big-2"] and len(herd) == 30
    assert sum(key is None for _, key in seen) >= 3  # new arrivals, keyless


def test_a_shrink_takes_workers_ahead_of_the_requests_waiting_for_one() -> None:
    """Workers 4 -> 2 while 4 are busy and 8 wait: once the 4 finish, never more than 2 are busy, and everyone is
    served (a shrink used to queue behind the waiting requests, so a cut took effect a queue timeout late)."""

    async def scenario() -> tuple[int, int]:
        up = Upstream(workers=4, service_time=0.01, queue_timeout=30.0)
        tasks = [asyncio.ensure_future(up.serve()) for _ in range(12)]
        while up.busy < 4:
            await asyncio.sleep(0)
        await up.resize(2)
        most = 0
        while not all(t.done() for t in tasks):
            if up.served >= 4:
                most = max(most, up.busy)
            await asyncio.sleep(0)
        return most, sum(t.result() for t in tasks)

    assert asyncio.run(scenario()) == (2, 12)
