"""Shared fixtures: an injected clock and a real uvicorn server on a free loopback port."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from admitgate import ManualClock
from admitgate.serving import free_port


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


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
