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
    """A Redis for one test: a throwaway redis-server on a free loopback port, restartable (``owned``), or the
    one at ``REDIS_URL``, which the tests never flush, kill or restart: there each test's keys live under names
    of its own (:meth:`name`), and only those are deleted after it."""

    def __init__(self, tmp: str, external: str | None = None) -> None:
        import shutil
        import subprocess
        import uuid

        self.proc: subprocess.Popen | None = None
        self.owned = not external
        if external:
            self.url, self.namespace = external, f"admitgate-test-{uuid.uuid4().hex[:12]}-"
            return
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is required (Debian package 'redis-server'; .ci/run installs it)")
        self.binary, self.tmp, self.port, self.namespace = binary, tmp, free_port(), ""
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def name(self, base: str) -> str:
        """``base`` as a budget's name (the prefix of its keys) for this test alone."""
        return self.namespace + base

    def start(self) -> None:
        import subprocess

        self._own("start")
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.tmp], stdout=subprocess.DEVNULL)  # fmt: skip
        wait_for_redis(self.url)

    def kill(self) -> None:
        self._own("kill")
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def _own(self, what: str) -> None:
        if not self.owned:
            pytest.fail(f"a test may {what} only a redis-server it started (the own_redis_server fixture)")

    def close(self) -> None:
        """Stop the server the test started, or delete the keys this test made at ``REDIS_URL``."""
        if self.owned:
            self.kill()
            return
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            keys = list(client.scan_iter(match=f"*{self.namespace}*", count=1000))
            if keys:
                client.unlink(*keys)
        finally:
            client.close()


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """The Redis at ``REDIS_URL`` if it is set (this test's keys under names of its own), else one of its own."""
    server = RedisServer(str(tmp_path), os.environ.get("REDIS_URL"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def own_redis_server(tmp_path) -> Iterator[RedisServer]:
    """A redis-server this test started, whatever ``REDIS_URL`` says: for tests that kill, restart or flush it."""
    server = RedisServer(str(tmp_path))
    try:
        yield server
    finally:
        server.close()


#: Fixtures that start a real server: a test that uses one is an integration test whether marked or not.
SERVER_FIXTURES = frozenset({"serve", "redis_server", "own_redis_server", "redis_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
