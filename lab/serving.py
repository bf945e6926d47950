"""Start the demo service in a child process on loopback, pinned to its own core."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pin(cpu: int) -> None:
    """Pin this process to ``cpu`` when the machine has more than one core (no-op otherwise)."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(0, {cpu})


@contextlib.contextmanager
def demo_server(args: Sequence[str] = (), *, cpu: int = 0, ready_timeout: float = 20.0,
                program: Sequence[str] = ("-m", "admitgate", "demo")) -> Iterator[str]:  # fmt: skip
    """Run ``admitgate demo`` (serving only; or ``program``) on a free loopback port; yield its base URL."""
    with demo_process(args, cpu=cpu, ready_timeout=ready_timeout, program=program) as (base, _):
        yield base


@contextlib.contextmanager
def demo_process(args: Sequence[str] = (), *, cpu: int = 0, ready_timeout: float = 20.0,
                 program: Sequence[str] = ("-m", "admitgate", "demo")) -> Iterator[tuple[str, int]]:  # fmt: skip
    """:func:`demo_server`, yielding ``(base URL, process id)`` (to read the server's memory, say).

    ``program``: what the Python interpreter runs (a script taking ``admitgate demo``'s options, say)."""
    port = free_port()
    cmd = [sys.executable, *program, "--port", str(port), "--quiet", *args]
    proc = subprocess.Popen(cmd, preexec_fn=lambda: pin(cpu))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"demo server exited with {proc.returncode}")
            try:
                if httpx.get(base + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("demo server did not become ready")
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server ``proc``ess and wait for it; kill it if it has not ended within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
