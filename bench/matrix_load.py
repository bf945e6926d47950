"""The scenario matrix's server and load generators: a fresh uvicorn server per run (core 0), wrk for the closed
loop, a Python open-loop Poisson generator and the herd driver (:func:`lab.herd.run_herd`) on core 1.

Only 127.0.0.1 is targeted; every run is bounded (wrk by its duration, the open loop by its duration and the
client timeout, a herd by its deadline) and its server is terminated whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from overhead import ready  # noqa: E402

from admitgate.sim.summary import HerdResult  # noqa: E402
from lab.herd import run_herd  # noqa: E402
from lab.http1 import Http1Client  # noqa: E402
from lab.matrix_cells import TIMED_OUT  # noqa: E402
from lab.serving import free_port, pin, stop  # noqa: E402

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1  # (linux/prctl.h)


def _child() -> None:
    """In the server's process before it starts: pinned to core 0, and ended if the matrix's process dies."""
    pin(0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def own_autogroup() -> dict[str, Any]:
    """Go on in a scheduler autogroup of its own, at this process's nice value (the servers it starts inherit
    it); returns what was done. With ``kernel.sched_autogroup_enabled`` the kernel shares a core between
    sessions first, and a nice value only ranks processes within one session: ``nice -n -15`` alone leaves a
    benchmark an equal share beside another session's busy process. Unless it already leads a session, the
    process forks: the child starts a session and goes on (ended if the parent dies), the parent stays where
    it was, passes SIGINT, SIGTERM and SIGHUP on to the child and exits with its status."""
    switch = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not switch.exists() or switch.read_text().strip() != "1":
        return {"autogroup": False}
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if os.getsid(0) != os.getpid():
        _session_in_a_child()
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError as error:
        return {"autogroup": True, "nice": nice, "applied": False, "error": str(error)}
    return {"autogroup": True, "nice": nice, "applied": True}


def _session_in_a_child() -> None:
    """Fork; in the child start a new session and return; in the parent wait for the child, passing signals
    on, and exit as it did."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        os.setsid()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # (the parent died before the line above could tie the child to it)
            os._exit(1)
        return
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(child, number))
    while True:
        try:
            _, status = os.waitpid(child, 0)
        except InterruptedError:
            continue
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)  # (a signal's number as a shell reports it)


def cpu_and_wait(pid: int) -> tuple[float, float] | None:
    """Seconds the main thread of process ``pid`` has run on a core and has waited, runnable, for one
    (``/proc/<pid>/schedstat``); None where that cannot be read."""
    try:
        ran, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(ran) / 1e9, int(waited) / 1e9


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection while a load runs (one collection after it): with thousands of requests
    pending, a full collection stalls the generator's event loop for about 0.1 s, and its sends and reads
    with it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.collect()


def run_async(coroutine: Coroutine[Any, Any, Any], bound: float) -> Any:
    """Run ``coroutine`` on a fresh event loop (uvloop where installed), cancelled after ``bound`` seconds, with
    the cyclic garbage collector paused (:func:`paused_gc`)."""
    bounded = asyncio.wait_for(coroutine, bound)
    with paused_gc():
        try:
            import uvloop
        except ImportError:
            return asyncio.run(bounded)
        return uvloop.run(bounded)


@contextlib.contextmanager
def server(config: dict[str, Any], ready_timeout: float = 30.0) -> Iterator[tuple[str, int, int]]:
    """Serve ``bench/matrix_app.py`` as ``config`` says, under uvicorn's defaults (one worker, its default loop
    and HTTP implementation; no access log) on a free loopback port, pinned to core 0; yield (base URL, port,
    the server's process id)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMITGATE_")}
    env["MATRIX_SERVER"] = json.dumps(config)
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "matrix_app:build", "--app-dir", str(HERE), "--host", HOST,
           "--port", str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_child)
    base = f"http://{HOST}:{port}"
    try:
        ready(proc, base + "/stats", time.monotonic() + ready_timeout)
        yield base, port, proc.pid
    finally:
        stop(proc)


def stats(base: str, timeout: float = 30.0) -> dict[str, Any] | None:
    """The server's counters (``/stats``), or None if it did not answer within ``timeout`` s (still busy with
    what a load left it: the run's figures stand without them)."""
    try:
        return httpx.get(base + "/stats", timeout=timeout).json()
    except httpx.HTTPError:
        return None


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def closed_loop(url: str, duration: float, connections: int = 32) -> dict[str, Any]:
    """One bounded wrk run (``-t1 -c{connections} --latency``, on core 1): requests/s, p50 and p99 (ms),
    requests, non-2xx answers and socket errors."""
    cores = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    cmd = [*cores, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30, check=True).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    p50, p99 = (re.search(rf"^\s+{q}%\s+(\S+)", out, re.M) for q in (50, 99))
    if not (rate and total and p50 and p99):
        raise RuntimeError(f"wrk output not understood:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"req_per_s": float(rate.group(1)), "requests": int(total.group(1)), "p50_ms": round(_ms(p50.group(1)), 3),
            "p99_ms": round(_ms(p99.group(1)), 3), "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sum(map(int, errors.groups())) if errors else 0}  # fmt: skip


@dataclass(slots=True)
class Shot:
    """One open-loop request: when it was due, sent (issued) and answered (seconds from the start), its status
    (:data:`~lab.matrix_cells.TIMED_OUT` if the client gave up, 0 on a transport error), whether a Retry-After
    came with it, whether it opened a connection of its own (``fresh``) and when its request was written to
    the connection (after any connect; None if no connection was established before it gave up)."""

    due: float
    sent: float
    done: float
    status: int
    retry_after: bool
    fresh: bool
    written: float | None


async def _changes(port: int, start: float, steps: Sequence[tuple[float, int]]) -> None:
    """Set the upstream's workers at each (seconds after ``start`` (loop time), workers) step."""
    loop = asyncio.get_running_loop()
    for at, workers in steps:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        await Http1Client(HOST, port, keep_alive=False).get(f"/stats?workers={workers}")


async def open_loop(port: int, path: str, rate: float, duration: float, *, timeout: float = 1.0,
                    steps: Sequence[tuple[float, int]] = (), seed: int = 1,
                    lags: list[float] | None = None) -> list[Shot]:  # fmt: skip
    """Poisson arrivals at ``rate``/s for ``duration`` s, each sent when it is due (never queued by the client) on
    an idle keep-alive connection or a new one, abandoned (its connection closed, as HTTP clients do) after
    ``timeout`` s. ``lags``, if given, receives how late a 10 ms timer of the generator fired, again and again
    while it ran (seconds: its own event loop's lag)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    idle: list[Http1Client] = []
    shots: list[Shot] = []
    pending: set[asyncio.Task[None]] = set()
    start = loop.time() + 0.05

    async def fire(due: float) -> None:
        sent = loop.time() - start
        client = idle.pop() if idle else Http1Client(HOST, port, cookies=False)
        fresh, client.written = not client.connected, None
        status, retry_after = await client.get(path, timeout, timed_out=TIMED_OUT)
        written = None if client.written is None else client.written - start
        shots.append(Shot(due, sent, loop.time() - start, status, retry_after is not None, fresh, written))
        if client.connected:  # (one that gave up closed its connection: the next arrival opens its own)
            idle.append(client)

    changes = asyncio.ensure_future(_changes(port, start, steps))
    monitor = asyncio.ensure_future(_lag(lags if lags is not None else []))
    due = rng.expovariate(rate)
    try:
        while due < duration:
            await asyncio.sleep(max(0.0, start + due - loop.time()))
            task = asyncio.ensure_future(fire(due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            due += rng.expovariate(rate)
        if pending:
            await asyncio.wait(pending, timeout=timeout + 5)
    finally:
        changes.cancel()
        monitor.cancel()
        for task in pending:
            task.cancel()
        for client in idle:
            client.close()
    return shots


async def herd(base: str, path: str, *, policy: str, new_rate: float, steps: Sequence[tuple[float, int]] = (),
               clients: int = 2000, deadline: float = 60.0,
               seed: int = 1) -> tuple[HerdResult, list[float]]:  # fmt: skip
    """2,000 clients released at once after a 6 s warm-up of new arrivals at ``new_rate``/s (one try each, a new
    connection, no cookie). ``policy``: ``obey`` (Retry-After exactly; own keep-alive connection and cookies),
    ``urllib3`` (urllib3's ``Retry``; keep-alive, no cookies) or ``ignore20`` (``obey``, but 20 % retry every
    100 ms on fresh connections without cookies). Returns the herd's records and how late a 10 ms timer of the
    generator fired, again and again while it ran (seconds: its own event loop's lag)."""
    ignore = policy == "ignore20"
    lags: list[float] = []
    monitor = asyncio.ensure_future(_lag(lags))
    try:
        result = await run_herd(base, clients, path=path, policy="obey" if ignore else policy,
                                background_rate=new_rate, ignore_fraction=0.2 if ignore else 0.0,
                                ignorers_fresh=ignore, ignore_interval=0.1, steps=steps, deadline=deadline,
                                seed=seed)  # fmt: skip
    finally:
        monitor.cancel()
    return result, lags


async def _lag(samples: list[float], period: float = 0.01) -> None:
    """Append how late each of a series of ``period`` s timers fired (seconds) until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(period)
        samples.append(loop.time() - before - period)
