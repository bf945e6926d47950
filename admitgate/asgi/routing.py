"""Route matching: a request path to its :class:`~admitgate.core.priority.Rule`, with Starlette's path compiler.

Rules are keyed by *route template* (Starlette syntax: ``/items/{id}``,
``/files/{path:path}``), never by raw path, so ``/items/1`` and ``/items/2`` share
one rule and one metrics label. A rule sets the request's cost in tokens, its
priority class, a per-key quota on the route (``{"quota": "5/minute"}``), or exempts it from the gate
(health checks, ``/metrics``). An exempt
template covers everything mounted below it: ``/metrics`` also exempts ``/metrics/``
and ``/metrics/x``, never ``/metricsfoo``.

Paths no rule names get the default rule; with :class:`AppTemplates` their metrics label
is the app's own route template (``/users/{user_id}``), and ``*`` only for paths the app
does not route.

Priority classes and the rule type live in the framework-free core (:mod:`admitgate.core.priority`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from starlette.routing import BaseRoute, Mount, Route, compile_path

from ..core.errors import ConfigError, flag
from ..core.priority import DEFAULT_CLASSES, Priority, Rule
from ..metrics import MetricsApp
from .quota import Quota

_CACHE_SIZE = 4096
#: A path parameter in a template, as Starlette writes them: ``{name}`` or ``{name:convertor}``.
_PARAM = re.compile(r"{[a-zA-Z_][a-zA-Z0-9_]*(:[a-zA-Z_][a-zA-Z0-9_]*)?}")
#: Most distinct route labels the app's own templates may add; paths beyond them count as ``*``.
MAX_TEMPLATES = 500


class Router:
    """Resolves a request path to its :class:`Rule`.

    Templates without parameters match exactly and take precedence; then exempt templates
    match as prefixes on a path-segment boundary (``/metrics`` and ``/metrics/`` both cover
    ``/metrics``, ``/metrics/`` and ``/metrics/...``; ``/`` covers only itself); then
    parameterised templates are tried in the order given and the first match wins. Paths
    nothing matches get :attr:`default`, labelled with the app's route template when ``app``
    is given (see :class:`AppTemplates`; at most :data:`MAX_TEMPLATES` distinct labels).

    ``routes``: template -> ``{"cost": float, "class": str, "exempt": bool, "quota": ...}`` (or a :class:`Rule`);
    a ``quota`` is a limit (``"5/minute"``), a table of :class:`~admitgate.asgi.quota.Quota`'s fields or a Quota,
    kept in :attr:`quotas` by template. ``exempt``: templates the gate never touches. Resolution of a raw path is
    cached in :attr:`cache`, a bounded dict, so an unbounded variety of paths costs bounded memory.
    """

    def __init__(
        self,
        routes: Mapping[str, Mapping[str, object] | Rule] | None = None,
        exempt: Iterable[str] = (),
        *,
        default_cost: float = 1.0,
        default_class: str = "default",
        classes: Mapping[str, Priority] | None = None,
        app: Any = None,
    ) -> None:
        self.classes = _classes(classes)
        self.default = Rule("*", self._cost("default_cost", default_cost), self._class("default_class", default_class))
        if isinstance(exempt, (str, bytes)) or not isinstance(exempt, Iterable):
            raise ConfigError("exempt", "must be a list of route templates", exempt)
        rules: list[Rule] = []
        named: list[str] = []  # the field each rule came from, for errors
        self.quotas: dict[str, Quota] = {}  #: route template -> the route's quota
        for i, template in enumerate(exempt):
            rules.append(Rule(_template(f"exempt[{i}]", template), 0.0, self.default.priority, exempt=True))
            named.append(f"exempt[{i}]")
        if routes is not None and not isinstance(routes, Mapping):
            raise ConfigError("routes", "must be a mapping of route template -> {cost, class, exempt}", routes)
        for template, spec in (routes or {}).items():
            field = f"routes[{template!r}]"
            _template(field, template)
            named.append(field)
            rules.append(spec if isinstance(spec, Rule) else self._rule(field, template, spec, default_class))
        self.rules = rules
        self._fields = dict(zip(map(id, rules), named, strict=True))
        self.static_rules: dict[str, Rule] = {}  #: templates without parameters, matched exactly
        self._prefixes: list[tuple[str, Rule]] = []  # exempt templates without parameters: path prefixes
        self._patterns: list[tuple[re.Pattern[str], Rule]] = []
        for rule in rules:
            regex, _, converters = _compiled(self._fields[id(rule)], rule.template)
            if rule.exempt and rule.template != "/":  # the path, with or without a final "/", and all below it
                base = rule.template.rstrip("/")
                if converters:
                    self._patterns.append((compile_path(base)[0], rule))
                    self._patterns.append((compile_path(base + "/{_below:path}")[0], rule))
                else:
                    self.static_rules.setdefault(base, rule)
                    self._prefixes.append((base + "/", rule))
            elif converters:
                self._patterns.append((regex, rule))
            else:
                self.static_rules.setdefault(rule.template, rule)
        self.templates = None if app is None else AppTemplates(app)
        self._labelled: dict[str, Rule] = {}
        #: Resolved paths: exact templates, then every path resolved so far (cleared when full).
        #: ``cache.get(path)`` is the admit path's lookup; on None call :meth:`resolve`.
        self.cache: dict[str, Rule] = dict(self.static_rules)

    def _rule(self, field: str, template: str, spec: object, default_class: str) -> Rule:
        """The rule a ``routes`` entry's table declares (its quota, if any, in :attr:`quotas`)."""
        if not isinstance(spec, Mapping):
            raise ConfigError(field, "must be a table of cost, class and exempt (or a Rule)", spec)
        unknown = set(spec) - {"cost", "class", "exempt", "quota"}
        if unknown:
            raise ConfigError(field, f"unknown keys {sorted(map(str, unknown))}; known: cost, class, exempt, quota")
        cost = self._cost(f"{field}.cost", spec.get("cost", self.default.cost))
        prio = self._class(f"{field}.class", spec.get("class", default_class))
        rule = Rule(template, cost, prio, exempt=flag(f"{field}.exempt", spec.get("exempt", False)))
        if spec.get("quota") is not None:
            if rule.exempt:
                raise ConfigError(f"{field}.quota", "an exempt route is never limited: drop exempt or the quota")
            self.quotas[template] = route_quota(f"{field}.quota", spec["quota"])
        return rule

    def check_burst(self, burst: float) -> None:
        """ConfigError unless every gated rule's cost fits in ``burst`` tokens less its class's reserve (a
        request that can never find its tokens would be rejected forever)."""
        for rule in [*self.rules, self.default]:
            usable = burst * (1 - rule.priority.reserve)
            if not rule.exempt and not rule.priority.critical and rule.cost > usable:
                field = f"{self._fields[id(rule)]}.cost" if rule is not self.default else \
                    "default_class" if rule.priority.reserve else "burst"  # fmt: skip
                raise ConfigError(field, f"a burst of {burst:g} tokens (less the {rule.priority.name!r} class's "
                                         f"reserve) can never admit a request of cost {rule.cost:g}; raise the burst",
                                  rule.priority.name if field == "default_class" else rule.cost)  # fmt: skip

    def _cost(self, field: str, cost: object) -> float:
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 < cost < float("inf"):
            raise ConfigError(field, "must be a finite number > 0", cost)
        return float(cost)

    def _class(self, field: str, name: object) -> Priority:
        if not isinstance(name, str) or name not in self.classes:
            raise ConfigError(field, f"unknown class; known: {sorted(self.classes)}", name)
        return self.classes[name]

    def resolve(self, path: str, scope: Mapping[str, Any] | None = None) -> Rule:
        """The rule for ``path`` (``scope``, the request's, gives the app's ``root_path``)."""
        cache = self.cache
        rule = cache.get(path)
        if rule is None:
            rule = self._match(path, scope)
            if len(cache) >= _CACHE_SIZE + len(self.static_rules):
                cache.clear()
                cache.update(self.static_rules)
            cache[path] = rule
        return rule

    def _match(self, path: str, scope: Mapping[str, Any] | None) -> Rule:
        # exact templates are in the cache from the start, so resolve() never gets here for them
        for prefix, rule in self._prefixes:
            if path.startswith(prefix):
                return rule
        for regex, rule in self._patterns:
            if regex.match(path):
                return rule
        template = None if self.templates is None else self.templates.match(path, scope)
        if template is None:
            return self.default
        labelled = self._labelled.get(template)
        if labelled is None:
            if len(self._labelled) >= MAX_TEMPLATES:
                return self.default
            labelled = self._labelled[template] = Rule(template, self.default.cost, self.default.priority)
        return labelled


def route_quota(field: str, spec: object) -> Quota:
    """A route's ``quota``: a limit such as ``"5/minute"``, a table of :class:`Quota`'s fields, or a Quota;
    ConfigError naming ``field`` and the Quota field at fault."""
    if isinstance(spec, Quota):
        return spec
    if isinstance(spec, str):
        spec = {"limit": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(field, "must be a limit such as '5/minute', a table of limit, key, burst, name, or a Quota",
                          spec)  # fmt: skip
    known = ("limit", "key", "burst", "name", "max_keys")
    unknown = set(spec) - set(known)
    if unknown or "limit" not in spec:
        problem = f"unknown keys {sorted(map(str, unknown))}" if unknown else "needs a limit"
        raise ConfigError(field, f"{problem}; known: {', '.join(known)}")
    try:
        return Quota(**spec)
    except ConfigError as error:
        raise error.renamed(f"{field}.{error.field}") from None


def _classes(classes: object) -> dict[str, Priority]:
    if classes is None:
        return dict(DEFAULT_CLASSES)
    if not isinstance(classes, Mapping) or not classes:
        raise ConfigError("classes", "must be a mapping of class name -> Priority", classes)
    for name, priority in classes.items():
        if not isinstance(name, str) or not isinstance(priority, Priority):
            raise ConfigError(f"classes[{name!r}]", "must be an admitgate.Priority", priority)
    return dict(classes)


def _template(field: str, template: object) -> str:
    """``template`` if it is a route template: a string that starts with ``/``, braces only around parameters."""
    if not isinstance(template, str) or not template.startswith("/"):
        raise ConfigError(field, "a route template must be a string starting with '/'", template)
    if "{" in _PARAM.sub("", template) or "}" in _PARAM.sub("", template):
        raise ConfigError(field, "a brace must enclose a parameter, {name} or {name:convertor}", template)
    return template


def _compiled(field: str, template: str) -> tuple[re.Pattern[str], str, dict[str, Any]]:
    """Starlette's compiled ``template``; ConfigError for an unknown convertor or a repeated parameter."""
    try:
        return compile_path(template)
    except (AssertionError, ValueError) as exc:  # Starlette asserts on an unknown convertor
        raise ConfigError(field, f"not a route template Starlette accepts ({exc})", template) from None


class AppTemplates:
    """The route templates of the app behind the gate, for metrics labels.

    The route table is the first ``routes`` list found on ``app`` or down its chain of ``.app``
    attributes (Starlette and FastAPI apps, their routers, and the middleware Starlette wraps
    around its router all keep one), else on the request's ``scope["app"]``. It is read at the
    first :meth:`match` and read again only when its length changes, then flattened: mounts are
    entered (a mount of a plain ASGI app is ``<prefix>/{path:path}``), websocket and host routes
    are left out. Matching is by path only, in the app's order, as Starlette's router does;
    :class:`Router` calls it once per distinct raw path, so its cost stays off the admit path.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._table: Sequence[BaseRoute] | None = None
        self._size = -1
        self._exact: dict[str, str] = {}
        self._patterns: list[tuple[re.Pattern[str], str | None]] = []

    def match(self, path: str, scope: Mapping[str, Any] | None = None) -> str | None:
        """The template of the app's route for ``path``, or None if the app routes it nowhere."""
        table = self._table if self._table is not None else route_table(self.app, scope)
        if table is None:
            return None
        if table is not self._table or len(table) != self._size:
            try:
                self._compile(table)
            except Exception:  # an odd route class must cost a label, never the request (a 500)
                self._table, self._size, self._exact, self._patterns = table, len(table), {}, []
        root = scope.get("root_path", "") if scope is not None else ""
        if root and path.startswith(root + "/"):  # as Starlette's get_route_path
            path = path[len(root) :]
        template = self._exact.get(path)
        if template is not None:
            return template
        for regex, found in self._patterns:
            if regex.match(path):
                return found
        return None

    def _compile(self, table: Sequence[BaseRoute]) -> None:
        self._table, self._size = table, len(table)
        self._exact, self._patterns = {}, []
        for template, label in _flatten(table, ""):
            try:
                regex, _, converters = compile_path(template)
            except ValueError:  # a mount and its route reuse a parameter name: no single template
                continue
            if converters:
                self._patterns.append((regex, label))
            elif label is not None and not any(r.match(template) for r, _ in self._patterns):
                self._exact.setdefault(template, label)  # an earlier parameterised route would win


def route_table(app: Any, scope: Mapping[str, Any] | None) -> Sequence[BaseRoute] | None:
    """The first ``routes`` list on ``app`` or down its ``.app`` chain, else on the request's ``scope["app"]``."""
    seen: set[int] = set()
    while app is not None and id(app) not in seen:
        routes = getattr(app, "routes", None)
        if isinstance(routes, list):
            return routes
        seen.add(id(app))
        app = getattr(app, "app", None)
    outer = scope.get("app") if scope is not None else None
    routes = getattr(outer, "routes", None)
    return routes if isinstance(routes, list) else None


def _flatten(routes: Iterable[BaseRoute], prefix: str) -> Iterator[tuple[str, str | None]]:
    """(template to match, label) in routing order; label None: routed into a mount, matched by no route there."""
    for route, path in _expand(routes):
        if isinstance(route, Mount):
            below = prefix + path + "/{path:path}"
            children = route.routes
            if children:
                yield from _flatten(children, prefix + path)
            yield below, None if children else below
        elif isinstance(route, Route):
            yield prefix + path, prefix + path


def _expand(routes: Iterable[BaseRoute]) -> list[tuple[BaseRoute, str]]:
    """Each route with its path. FastAPI (0.137 on) keeps an included router as one node of ``routes``;
    its public ``iter_route_contexts`` expands those into their routes, with the include prefix in the path."""
    # A FastAPI app has imported fastapi.routing already; any other app must not pay for importing it.
    expand = getattr(sys.modules.get("fastapi.routing"), "iter_route_contexts", None)
    if expand is None:  # plain Starlette, or a FastAPI that still copies included routes into ``routes``
        return [(route, route.path) for route in routes if isinstance(route, (Mount, Route))]
    return [(c.original_route, c.path) for c in expand(list(routes)) if c.path is not None]


def metrics_mounts(app: Any, scope: Mapping[str, Any] | None) -> frozenset[str]:
    """The paths of the app's top-level mounts of a metrics app (:func:`admitgate.metrics_app`, or
    prometheus-client's ``make_asgi_app()``): ``app.mount("/metrics", ...)`` gives ``"/metrics"``."""
    table = route_table(app, scope) or ()
    return frozenset(
        route.path
        for route in table
        if isinstance(route, Mount)
        and route.path
        and (isinstance(route.app, MetricsApp) or getattr(route.app, "__module__", None) == "prometheus_client.asgi")
    )
