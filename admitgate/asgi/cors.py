"""Browsers and CORS: the app's CORS policy on the gate's own responses, and preflights let through.

A browser reads a cross-origin response only if it carries ``Access-Control-Allow-Origin``, and reads a
field beyond the safelisted few (Retry-After and RateLimit are not among them) only if
``Access-Control-Expose-Headers`` names it. Starlette's ``CORSMiddleware`` adds both, but only to the
responses that pass through it, and it *replaces* an expose list already on a response with its own.

:class:`AppCors` finds the app's ``CORSMiddleware`` layers once, at the gate's first response that needs
them, through Starlette's public surface: ``scope["app"].user_middleware`` holds their
``Middleware(cls, *args, **kwargs)`` entries, and ``scope["app"].middleware_stack`` followed down its
``.app`` chain tells which of them sit outside the gate. Then:

* a layer *inside* the gate (the gate added last, so outermost) never sees a rejection, so rejections get
  what a ``CORSMiddleware`` built once from that layer's own options (its expose list merged with the
  gate's) adds to a response for the request's Origin, worked out once per Origin;
* a layer *outside* the gate adds ``Access-Control-Allow-Origin`` itself but would replace the gate's
  expose list, and nothing inside it can add to its list: its constructor is run again, once, with the
  app's own options and the merged list.

No allow-list is ever copied by hand: both come from the options the app gave its own layer.
A preflight (:func:`is_preflight`) is answered by the CORS layer without running a route, so the gate
lets it through untouched.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .headers import EXPOSE, Header, merge_names

log = logging.getLogger("admitgate")
MAX_ORIGINS = 1024  # distinct Origin values whose CORS fields are kept
_MAX_LAYERS = 256  # the walk down a middleware stack stops here (a chain of .app that never ends)


def is_preflight(scope: Scope) -> bool:
    """Whether a request (whose method the caller found to be ``OPTIONS``) is a CORS preflight.

    A preflight carries ``Origin`` and ``Access-Control-Request-Method`` (Fetch standard, "CORS-preflight
    request"); Starlette's ``CORSMiddleware`` answers exactly these itself.
    """
    names = {name for name, _ in scope["headers"]}
    return b"origin" in names and b"access-control-request-method" in names


class AppCors:
    """The app's CORS policy applied to the gate's own responses (see the module docstring).

    ``expose``: the fields the gate adds (``HeaderPolicy.exposed``); ``layer``: the gate's middleware, which the
    app's CORS layers are found around and inside. Nothing is looked up until :meth:`resolve`, which the gate calls
    once, at its first rejection or first response with rate-limit fields; :meth:`apply` then adds the CORS fields
    to each rejection.
    """

    def __init__(self, expose: Sequence[str], layer: object) -> None:
        self.expose = tuple(expose)
        self._layer = layer
        self.resolved = False
        self._through: ASGIApp | None = None  # layers like the app's CORS layers inside the gate, around a probe
        self._fields: dict[bytes | None, list[Header]] = {}  # Origin -> what those layers make of the probe

    def resolve(self, scope: Scope) -> None:
        """Find the app's CORS layers around and inside the gate's layer (from ``scope["app"]`` or its ``app``)."""
        self.resolved = True
        outer, inner = _locate(self._layer, scope)
        for layer, entry in outer:
            _merge_into(layer, entry, self.expose)
        probe = [(EXPOSE, ", ".join(self.expose).encode())]

        async def respond(_: Scope, receive: Receive, send: Send) -> None:  # a rejection's CORS-relevant part
            await send({"type": "http.response.start", "status": 429, "headers": list(probe)})
            await send({"type": "http.response.body", "body": b""})

        through: ASGIApp = respond
        for entry in reversed(inner):  # innermost first, as Starlette builds them
            bound = _options(entry, self.expose)
            if bound is not None:
                through = entry.cls(through, *bound.args[1:], **bound.kwargs)
        self._through = None if through is respond else through

    async def apply(self, scope: Scope, headers: list[Header]) -> list[Header]:
        """A rejection's ``headers`` with what the app's CORS layers inside the gate would add to it.

        Those fields depend on the request's Origin alone (Fetch standard; Starlette's ``CORSMiddleware``
        reads nothing else on a request that is not a preflight), so each Origin is run through the
        layers once and the result reused, as the rejections themselves are (at most 1,024 Origins).
        """
        if self._through is None:
            return headers
        origin = next((value for name, value in scope["headers"] if name == b"origin"), None)
        fields = self._fields.get(origin)
        if fields is None:
            shown: list[Message] = []

            async def keep(message: Message) -> None:
                shown.append(message)

            await self._through(dict(scope), _no_body, keep)
            if len(self._fields) >= MAX_ORIGINS:
                self._fields.clear()
            fields = self._fields[origin] = list(shown[0]["headers"])
        return [field for field in headers if field[0] != EXPOSE] + fields


async def _no_body() -> Message:
    return {"type": "http.disconnect"}  # the probe is sent whole: nothing below reads the request


def _cors_entries(app: object) -> list[Middleware]:
    entries = getattr(app, "user_middleware", None)
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, Middleware) and isinstance(e.cls, type)
            and issubclass(e.cls, CORSMiddleware)]  # fmt: skip


def _locate(gate: object, scope: Scope) -> tuple[list[tuple[Any, Middleware]], list[Middleware]]:
    """The app's CORS layers outside ``gate`` (each with its entry), and the entries of those inside it."""
    owner = scope.get("app")
    entries = _cors_entries(owner)
    if entries:
        outer: list[Any] = []
        layer = getattr(owner, "middleware_stack", None)
        for _ in range(_MAX_LAYERS):
            if layer is None or layer is gate:
                break
            if isinstance(layer, CORSMiddleware):
                outer.append(layer)
            layer = getattr(layer, "app", None)
        if layer is gate and len(outer) <= len(entries):
            pairs = list(zip(outer, entries[: len(outer)], strict=True))
            if all(type(lay) is e.cls for lay, e in pairs):
                return pairs, entries[len(outer) :]
    inner = _cors_entries(getattr(gate, "app", None))  # the gate wraps a Starlette app itself: all inside
    if inner or not entries:
        return [], inner
    log.warning("admitgate: the app has a CORSMiddleware, but the gate could not find itself in the app's "
                "middleware stack (a layer keeps its inner app other than as .app), so it cannot apply that "
                "CORS policy or expose list to its own responses")  # fmt: skip
    return [], []


def _options(entry: Middleware, expose: Sequence[str]) -> inspect.BoundArguments | None:
    """The entry's own arguments (``app`` first, as None), ``expose`` merged into its ``expose_headers``."""
    signature = inspect.signature(entry.cls)
    try:
        bound = signature.bind(None, *entry.args, **entry.kwargs)
    except TypeError:  # not how this class is built: Starlette would have failed too
        return None
    if "expose_headers" in signature.parameters:
        bound.arguments["expose_headers"] = merge_names(bound.arguments.get("expose_headers", ()), expose)
    return bound


def _merge_into(layer: Any, entry: Middleware, expose: Sequence[str]) -> None:
    """Give a CORS ``layer`` outside the gate the merged expose list (it replaces whatever the gate sends)."""
    own, bound = _options(entry, ()), _options(entry, expose)
    if own is None or bound is None or not own.arguments.get("expose_headers"):
        return  # it sets no expose list, so the gate's own field reaches the browser as it is
    if bound.arguments["expose_headers"] == own.arguments["expose_headers"]:
        return
    entry.cls.__init__(layer, layer.app, *bound.args[1:], **bound.kwargs)  # type: ignore[misc]
    log.info("admitgate: the app's CORSMiddleware (outside the gate) now exposes %s",
             ", ".join(bound.arguments["expose_headers"]))  # fmt: skip
