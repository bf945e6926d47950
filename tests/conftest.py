"""Shared fixtures: an injected clock and a real uvicorn server on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
import uvicorn
from hypothesis import HealthCheck, settings

from admitgate import ManualClock
from lab.redis import wait_for_redis
from lab.serving import free_port

# Hypothesis: CI (``CI`` set, as `.ci/run` runs there) draws the same examples on every run, a fixed set per
# test, with no example database; a developer's run explores, new examples each time. Neither has a deadline
# nor the too-slow health check: a test checks behaviour, and a loaded machine must not fail it. (Both start
# from Hypothesis' defaults: with CI in the environment it has loaded its own "ci" profile by now.)
PATIENT = {"parent": settings.get_profile("default"), "deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, database=None, max_examples=50, print_blob=True, **PATIENT)
settings.register_profile("dev", **PATIENT)
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
settings.load_profile("ci" if IN_CI else "dev")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def sleep(clock: ManualClock) -> Callable[[float], Awaitable[None]]:
    """A sleep on the injected clock: it moves the clock on and yields once, taking no real time."""

    async def virtual_sleep(seconds: float) -> None:
        clock.advance(max(0.0, seconds))
        await anyio.sleep(0)

    return virtual_sleep


@contextlib.contextmanager
def live_server(app: Any, **config: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on 127.0.0.1; yield the base URL."""
    port = free_port()
    options = {"log_level": "warning", "access_log": False, "lifespan": "on", **config}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture
def serve() -> Callable[..., contextlib.AbstractContextManager[str]]:
    return live_server


class RedisServer:
    """A throwaway redis-server on a free loopback port (or the one at REDIS_URL), restartable."""

    def __init__(self, tmp: str) -> None:
        import os
        import shutil
        import subprocess

        self.external = os.environ.get("REDIS_URL")
        self.proc: subprocess.Popen | None = None
        if self.external:
            self.url = self.external
            return
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is required (Debian package 'redis-server'; .ci/run installs it)")
        self.binary, self.tmp, self.port = binary, tmp, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self) -> None:
        import subprocess

        if self.external:
            return
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.tmp], stdout=subprocess.DEVNULL)  # fmt: skip
        wait_for_redis(self.url)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def flush(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushdb()
        client.close()


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(str(tmp_path))
    server.flush()
    try:
        yield server
    finally:
        server.kill()


#: Fixtures that start a real server: a test that uses one is an integration test whether marked or not.
SERVER_FIXTURES = frozenset({"serve", "redis_server", "redis_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
