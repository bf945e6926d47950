"""A bad configuration must stop the server from starting, also under ``app.add_middleware``.

Starlette builds its middleware stack lazily, at the first call it gets, which is the lifespan
start-up; an exception there escapes the application, and uvicorn's default ``--lifespan auto`` takes
it to mean "lifespan not supported", logs that at info level and serves anyway: every request then
fails with a 500. The ASGI lifespan protocol has a way to refuse start-up: answer
``lifespan.startup`` with ``lifespan.startup.failed`` and a message, which every lifespan mode of
uvicorn turns into "Application startup failed. Exiting." (exit status 3), as hypercorn and granian do.

So a middleware whose configuration fails while Starlette builds its stack does not raise from there:
it becomes an app that fails the start-up with the error's message, and raises the error on any
request that reaches it anyway (a server run with ``--lifespan off``). Built anywhere else (``app =
AdmitGate(app, ...)``), it raises at once, as a constructor should.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, MutableMapping
from types import FrameType
from typing import Any

from ..core.errors import ConfigError

Message = MutableMapping[str, Any]

#: Frames looked at above the constructor: the caller, and the ``__init__`` of a subclass or two.
_DEPTH = 4


def built_by_starlette() -> bool:
    """Whether the constructor running now was called by a Starlette (or FastAPI) app building its
    middleware stack (its public ``build_middleware_stack``), where an exception would go unnoticed."""
    applications = sys.modules.get("starlette.applications")
    if applications is None:  # no Starlette app exists in this process
        return False
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_name == "build_middleware_stack" and isinstance(
            frame.f_locals.get("self"), applications.Starlette
        ):
            return True
        frame = frame.f_back
    return False


async def fail_startup(
    error: ConfigError, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:  # fmt: skip
    """Serve one ASGI call of a middleware whose configuration failed: refuse the lifespan start-up with
    the error's message, raise the error for anything else."""
    if scope["type"] != "lifespan":
        raise error.renamed(error.field)  # a fresh exception: the stored one would collect tracebacks
    message = await receive()
    if message["type"] == "lifespan.startup":
        await send({"type": "lifespan.startup.failed", "message": str(error)})
