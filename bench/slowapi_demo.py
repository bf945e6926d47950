"""The demo service behind slowapi at a static limit equal to its capacity: the herd benchmark's comparison.

    python bench/slowapi_demo.py --port 8000 [--workers 20 --service-time 0.1 --queue-timeout 1.0 --quiet]
                                 [--per-key N]

Serves what ``admitgate demo --gate none`` serves (the same options), with slowapi's pure-ASGI middleware in
front. slowapi is a development dependency, so this lives beside the benchmarks, not in the package.
``--per-key N``: N requests/s for each ``x-api-key`` (slowapi's key; without one, the client's address), not the
capacity for all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import BaseRoute

from admitgate.cli import build_parser
from admitgate.demo import Upstream, demo_app


def tenant_key(request: Request) -> str:
    """slowapi's key for a request: its ``x-api-key``, or without one its client's address (slowapi skips a limit
    whose key is empty: a request without a key would go unlimited)."""
    from slowapi.util import get_remote_address

    return request.headers.get("x-api-key") or get_remote_address(request)


def slowapi_app(routes: list[BaseRoute], up: Upstream, per_key: int | None = None) -> Starlette:
    """The same app behind slowapi at a static limit equal to capacity (its pure-ASGI middleware), or at
    ``per_key`` requests/s for each ``x-api-key``."""
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware

    if per_key is None:
        limiter = Limiter(key_func=lambda request: "all", default_limits=[f"{int(up.capacity)}/second"],
                          headers_enabled=True)  # fmt: skip
    else:
        limiter = Limiter(key_func=tenant_key, default_limits=[f"{per_key}/second"], headers_enabled=True)
    app = Starlette(routes=routes)
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    app.add_middleware(SlowAPIASGIMiddleware)
    return app


def main(argv: Sequence[str]) -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--per-key", type=int)
    mine, rest = own.parse_known_args(argv)
    args = build_parser().parse_args(["demo", "--gate", "none", *rest])
    up = Upstream(args.workers, args.service_time, args.queue_timeout)
    app = slowapi_app(list(demo_app(up, gate="none").routes), up, mine.per_key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main(sys.argv[1:])
