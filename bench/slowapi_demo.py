"""The demo service behind slowapi at a static limit equal to its capacity: the herd benchmark's comparison.

    python bench/slowapi_demo.py --port 8000 [--workers 20 --service-time 0.1 --queue-timeout 1.0 --quiet]

Serves what ``admitgate demo --gate none`` serves (the same options), with slowapi's pure-ASGI middleware in
front. slowapi is a development dependency, so this lives beside the benchmarks, not in the package.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from admitgate.cli import build_parser
from admitgate.sim.demo import Upstream, demo_app


def slowapi_app(routes: list[BaseRoute], up: Upstream) -> Starlette:
    """The same app behind slowapi at a static limit equal to capacity (its pure-ASGI middleware)."""
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware

    limiter = Limiter(
        key_func=lambda request: "all", default_limits=[f"{int(up.capacity)}/second"], headers_enabled=True
    )
    app = Starlette(routes=routes)
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    app.add_middleware(SlowAPIASGIMiddleware)
    return app


def main(argv: Sequence[str]) -> None:
    args = build_parser().parse_args(["demo", "--gate", "none", *argv])
    up = Upstream(args.workers, args.service_time, args.queue_timeout)
    app = slowapi_app(list(demo_app(up, gate="none").routes), up)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main(sys.argv[1:])
