"""Priority classes and route rules: what the gate needs to know about a request, free of any framework.

Priority classes make H = μ − λ_new concrete: a *critical* class is never shed and is
charged against capacity first (its rate is λ_new); other classes share what is
left, and a class with ``reserve`` > 0 must leave that fraction of the burst in the
bucket, so it is shed before the classes above it. Matching a path to its :class:`Rule`
is the ASGI shell's job (:mod:`admitgate.asgi.routing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError, flag


@dataclass(frozen=True, slots=True)
class Priority:
    """A priority class. ``reserve``: fraction of the burst this class must leave unused."""

    name: str
    critical: bool = False
    reserve: float = 0.0
    plain: bool = field(init=False, repr=False, compare=False)  #: neither critical nor reserving

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("classes", "a class name must be a non-empty string", self.name)
        flag(f"classes[{self.name!r}].critical", self.critical)
        reserve = self.reserve
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0.0 <= reserve < 1.0:
            raise ConfigError(f"classes[{self.name!r}].reserve", "must be a number in [0, 1)", reserve)
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
