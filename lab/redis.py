"""Waiting for a Redis server just started (the shared-budget tests and benchmarks start their own)."""

from __future__ import annotations

import time


def wait_for_redis(url: str, timeout: float = 10.0) -> None:
    """Block until the Redis at ``url`` answers PING (a server just started); raise if it never does."""
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    finally:
        client.close()
