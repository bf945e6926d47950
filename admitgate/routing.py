"""Route rules and priority classes.

Rules are keyed by *route template* (Starlette syntax: ``/items/{id}``,
``/files/{path:path}``), never by raw path, so ``/items/1`` and ``/items/2`` share
one rule and one metrics label. A rule sets the request's cost in tokens, its
priority class, or exempts it from the gate (health checks, ``/metrics``).

Priority classes make H = μ − λ_new concrete: a *critical* class is never shed and is
charged against capacity first (its rate is λ_new); other classes share what is
left, and a class with ``reserve`` > 0 must leave that fraction of the burst in the
bucket, so it is shed before the classes above it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from starlette.routing import compile_path

from .errors import ConfigError

_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Priority:
    """A priority class. ``reserve``: fraction of the burst this class must leave unused."""

    name: str
    critical: bool = False
    reserve: float = 0.0
    plain: bool = field(init=False, repr=False, compare=False)  #: neither critical nor reserving

    def __post_init__(self) -> None:
        if not 0.0 <= self.reserve < 1.0:
            raise ConfigError(f"classes[{self.name!r}].reserve", "must be in [0, 1)", self.reserve)
        if self.critical and self.reserve:
            raise ConfigError(f"classes[{self.name!r}].reserve", "a critical class cannot have a reserve", self.reserve)
        object.__setattr__(self, "plain", not self.critical and not self.reserve)


DEFAULT_CLASSES: dict[str, Priority] = {
    "critical": Priority("critical", critical=True),
    "default": Priority("default"),
    "sheddable": Priority("sheddable", reserve=0.5),
}


@dataclass(frozen=True, slots=True)
class Rule:
    """What the gate does with requests matching ``template``."""

    template: str
    cost: float = 1.0
    priority: Priority = DEFAULT_CLASSES["default"]
    exempt: bool = False
    fast: bool = field(init=False, repr=False, compare=False)  #: gated, plain class: the admit fast path

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast", not self.exempt and self.priority.plain)


class Router:
    """Resolves a request path to its :class:`Rule`.

    Templates without parameters match exactly and take precedence; parameterised
    templates are tried in the order given and the first match wins.

    ``routes``: template -> ``{"cost": float, "class": str}`` (or a :class:`Rule`).
    ``exempt``: templates the gate never touches. Resolution of a raw path is cached
    in a bounded dict, so an unbounded variety of paths costs bounded memory.
    """

    def __init__(
        self,
        routes: Mapping[str, Mapping[str, object] | Rule] | None = None,
        exempt: Iterable[str] = (),
        *,
        default_cost: float = 1.0,
        default_class: str = "default",
        classes: Mapping[str, Priority] | None = None,
    ) -> None:
        self.classes = dict(DEFAULT_CLASSES if classes is None else classes)
        self.default = Rule("*", self._cost("default_cost", default_cost), self._class("default_class", default_class))
        rules: list[Rule] = [Rule(t, 0.0, self.default.priority, exempt=True) for t in exempt]
        for template, spec in (routes or {}).items():
            if isinstance(spec, Rule):
                rules.append(spec)
                continue
            unknown = set(spec) - {"cost", "class", "exempt"}
            if unknown:
                raise ConfigError(f"routes[{template!r}]", f"unknown keys {sorted(unknown)}")
            cost = self._cost(f"routes[{template!r}].cost", spec.get("cost", self.default.cost))
            prio = self._class(f"routes[{template!r}].class", spec.get("class", default_class))
            rules.append(Rule(template, cost, prio, exempt=bool(spec.get("exempt", False))))
        self.rules = rules
        self.static_rules: dict[str, Rule] = {}  #: templates without parameters, matched exactly
        self._patterns: list[tuple[re.Pattern[str], Rule]] = []
        for rule in rules:
            if not rule.template.startswith("/"):
                raise ConfigError("routes", "templates must start with '/'", rule.template)
            regex, _, converters = compile_path(rule.template)
            if converters:
                self._patterns.append((regex, rule))
            else:
                self.static_rules.setdefault(rule.template, rule)
        self._cache: dict[str, Rule] = {}
        #: What ``static_rules.get(path, miss)`` returns for a path without an exact rule: the default
        #: rule when there are no parameterised templates (no further work), else None (call :meth:`resolve`).
        self.miss: Rule | None = None if self._patterns else self.default

    def _cost(self, field: str, cost: object) -> float:
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 < cost < float("inf"):
            raise ConfigError(field, "must be a finite number > 0", cost)
        return float(cost)

    def _class(self, field: str, name: object) -> Priority:
        if name not in self.classes:
            raise ConfigError(field, f"unknown class; known: {sorted(self.classes)}", name)
        return self.classes[name]

    def resolve(self, path: str) -> Rule:
        rule = self.static_rules.get(path)
        if rule is not None:
            return rule
        if not self._patterns:
            return self.default
        cache = self._cache
        rule = cache.get(path)
        if rule is None:
            rule = next((r for regex, r in self._patterns if regex.match(path)), self.default)
            if len(cache) >= _CACHE_SIZE:
                cache.clear()
            cache[path] = rule
        return rule
