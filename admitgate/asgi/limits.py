"""Which quotas apply to a request, and their answer: the app's, a route's from the gate's ``routes``, and
those declared on the app's own routes (a FastAPI ``Depends(Quota(...))``, or :func:`~admitgate.asgi.quota.limited`).

The declared ones are found in the app's route table (as :class:`~admitgate.asgi.routing.AppTemplates` finds
it: mounts entered, FastAPI's included routers through ``iter_route_contexts``), once, at the lifespan start-up
or the first request. A request's path and method are matched to the route the app would serve them with, in the
app's order, once per distinct path and method (a bounded cache); its quotas are checked together, the route's
first: a request is allowed only if all of them allow it, and refused by the window that waits longest.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.routing import BaseRoute, Mount, Route, compile_path

from ..backends.quota import Cell, RedisQuota
from ..backends.shared import RedisBudget
from ..core.clock import Clock
from ..core.errors import ConfigError
from ..core.priority import Rule
from ..core.quota import Answer, Tally, check_cells, digest, spread
from .keys import TenantFunc
from .quota import CHECKED, DECLARED, Quota, QuotaGuard, Window, key_of, quota_key
from .routing import route_table

Scope = Any  # an ASGI scope
_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request over a quota: its Retry-After (whole seconds, spread) and the window that refused it."""

    retry_after: int
    window: Window


@dataclass(frozen=True, slots=True)
class Allowance:
    """A request every quota allowed: each window it was counted in, with what is left of it."""

    counted: tuple[tuple[Window, int, int], ...]  # (window, remaining at once, its effective window in s)


class Limits:
    """Every quota of one gate. ``await answer(scope, rule)`` is None (no quota counts this request), a
    :class:`Refusal` or an :class:`Allowance`. ``quota``: the app's; ``routes``: the ``routes`` table's, by
    template; the app's own routes are read by :meth:`scan`. ``backend``: the shared budget, whose Redis then
    counts every quota for the fleet."""

    def __init__(self, quota: Quota | None, routes: Mapping[str, Quota], clock: Clock, *, trusted_hops: int = 0,
                 forwarded: str = "x-forwarded-for", tenant_of: TenantFunc | None = None,
                 backend: RedisBudget | None = None) -> None:  # fmt: skip
        self.clock = clock
        self._keys = (trusted_hops, forwarded, tenant_of)
        self.everywhere = () if quota is None else (self._guard(quota, ""),)
        self.by_rule = {template: (self._guard(q, template, f"routes[{template!r}].quota"),)
                        for template, q in routes.items()}  # fmt: skip
        self.declared: list[tuple[re.Pattern[str], frozenset[str] | None, tuple[QuotaGuard, ...]]] = []
        self.scanned = False
        self._plans: dict[tuple[str, str], tuple[tuple[QuotaGuard, ...], frozenset[Quota]]] = {}
        self._base = None if backend is None else f"{backend.name}:quota"
        self.shared = None if backend is None else RedisQuota(backend.client, clock, timeout=backend.timeout,
                                                               cooldown=backend.cooldown)  # fmt: skip

    def _guard(self, quota: Quota, where: str, field: str = "quota") -> QuotaGuard:
        """``quota`` at work on the route ``where`` (``""``: every route); ConfigError naming ``field``."""
        try:
            key = quota_key(quota, *self._keys)
        except ConfigError as error:
            raise error.renamed(f"{field}.key") from None
        return QuotaGuard(quota, key, self.clock, where)

    @property
    def guards(self) -> list[QuotaGuard]:
        """Every guard, the app's first."""
        routed = [g for guards in self.by_rule.values() for g in guards]
        return [*self.everywhere, *routed, *(g for _, _, guards in self.declared for g in guards)]

    @property
    def refused(self) -> int:
        """Requests refused over a quota so far (for metrics)."""
        return sum(guard.refused for guard in self.guards)

    @property
    def idle(self) -> bool:
        """No quota anywhere (once the app's routes are read at a request): nothing to check, ever."""
        return self.scanned and not self.everywhere and not self.by_rule and not self.declared

    # -- the app's own routes ----------------------------------------------------------------------------
    def scan(self, app: Any, scope: Mapping[str, Any] | None = None) -> None:
        """Read the quotas declared on ``app``'s routes: once as the gate is made (a quota that cannot work is a
        ConfigError then, at start-up), and again at the first request, when the app has every route. A quota read
        before keeps its counts."""
        table = route_table(app, scope)
        routes = [] if table is None else list(_declared(table, ""))
        if self.declared or any(quotas for _, _, quotas in routes):
            known = {(guard.quota, guard.where): guard for _, _, guards in self.declared for guard in guards}
            self.declared = [(compile_path(template)[0], methods,
                              tuple(known.get((q, template)) or self._guard(q, template, f"quota on {template}")
                                    for q in quotas))
                             for template, methods, quotas in routes]  # fmt: skip
        self._plans.clear()
        self.scanned = scope is not None

    def _plan(self, scope: Scope, rule: Rule) -> tuple[tuple[QuotaGuard, ...], frozenset[Quota]]:
        """The guards of the request's route (declared, then the table's), then the app's; cached per path."""
        path, method = scope["path"], scope.get("method", "GET")
        plan = self._plans.get((path, method))
        if plan is None:
            guards = (*self._route_guards(path, method, scope), *self.by_rule.get(rule.template, ()),
                      *self.everywhere)  # fmt: skip
            plan = guards, frozenset(guard.quota for guard in guards)
            if len(self._plans) >= _CACHE_SIZE:
                self._plans.clear()
            self._plans[path, method] = plan
        return plan

    def _route_guards(self, path: str, method: str, scope: Scope) -> tuple[QuotaGuard, ...]:
        root = scope.get("root_path", "")
        if root and path.startswith(root + "/"):  # as Starlette's get_route_path
            path = path[len(root) :]
        allowed = {method, "GET"} if method == "HEAD" else {method}  # (Starlette's routes answer HEAD with GET)
        for regex, methods, guards in self.declared:
            if regex.match(path) and (methods is None or allowed & methods):
                return guards
        return ()

    # -- a request ---------------------------------------------------------------------------------------
    async def answer(self, scope: Scope, rule: Rule) -> Refusal | Allowance | None:
        """The quotas' answer for a request that ``rule`` gates (see the class)."""
        guards, quotas = self._plan(scope, rule) if self.by_rule or self.declared else (self.everywhere, None)
        if quotas:
            scope[CHECKED] = quotas  # what a route's dependency looks for
        counted: list[tuple[QuotaGuard, Window, Any]] = []
        for guard in guards:
            key = key_of(guard.key, scope)
            if key is not None:
                counted += [(guard, window, key) for window in guard.windows]
        if not counted:
            return None
        tally = await self._tally(counted)
        if tally.refused >= 0:
            guard, window, key = counted[tally.refused]
            guard.refused += 1
            return Refusal(max(1, math.ceil(spread(tally.wait, window.rate, digest(key)))), window)
        windows = [window for _, window, _ in counted]
        answers = [(window, Answer(0.0, backlog)) for window, backlog in zip(windows, tally.backlogs, strict=True)]
        return Allowance(tuple((window, a.remaining(window.rate), a.window(window.rate)) for window, a in answers))

    async def _tally(self, counted: Sequence[tuple[QuotaGuard, Window, Any]]) -> Tally:
        if self.shared is None:
            return check_cells([(window.limiter, key) for _, window, key in counted], self.clock())
        cells = []
        for _, window, key in counted:
            tag = digest(key).hex()
            cells.append(Cell(window.limiter, key, f"{self._base}:{{{tag}}}:{window.tail}", tag, window.args))
        return await self.shared.check(cells)


def _declared(routes: Iterable[BaseRoute], prefix: str) -> Iterator[tuple[str, frozenset[str] | None, list[Quota]]]:
    """(template, methods, declared quotas) of every route in routing order, mounts entered."""
    # A FastAPI app has imported fastapi.routing already; any other app must not pay for importing it.
    expand = getattr(sys.modules.get("fastapi.routing"), "iter_route_contexts", None)
    if expand is None:
        views = [(route, route.path, route) for route in routes if isinstance(route, (Mount, Route))]
    else:  # a context carries an included router's prefix and dependencies
        views = [(c.original_route, c.path, c) for c in expand(list(routes)) if c.path is not None]
    for route, path, view in views:
        if isinstance(route, Mount):
            yield from _declared(route.routes or (), prefix + path)
        elif isinstance(route, Route):
            methods = getattr(view, "methods", None)
            yield prefix + path, None if methods is None else frozenset(methods), _quotas_of(view)


def _quotas_of(view: Any) -> list[Quota]:
    """The quotas declared on a route: on its endpoint (:func:`~admitgate.asgi.quota.limited`) and among its
    FastAPI dependencies, however deep; each once."""
    found: list[Quota] = list(getattr(getattr(view, "endpoint", None), DECLARED, ()))
    stack = [getattr(view, "dependant", None)]
    while stack:
        dependant = stack.pop()
        if dependant is None:
            continue
        if isinstance(dependant.call, Quota):
            found.append(dependant.call)
        stack.extend(reversed(dependant.dependencies))
    unique: list[Quota] = []
    for quota in found:
        if not any(quota is seen for seen in unique):
            unique.append(quota)
    return unique
