"""Who the tenants are and how the capacity is divided among them: :class:`Tenancy`.

The engine keys tenants by *name* (a string; None for a request with none). How a request is named is the shell's
business (:mod:`admitgate.asgi.keys` reads ``Tenancy.key`` from the request, once per request); here the key is
only checked to be one the shell can read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, function, header_name, integer, number

#: The pool of keys not established yet (and of requests with no tenant name). Not a string: no name collides.
NEWCOMERS = ("newcomers",)
#: Tenant names longer than this (characters) are known by a digest of them, and metrics' labels are cut to it.
MAX_NAME = 128
#: A weight is a number in (0, MAX_WEIGHT].
MAX_WEIGHT = 1e6


def _check_key(spec: object) -> None:
    """``spec`` is a tenant key the shell reads: ``"header:<name>"``, ``"address"`` or a function of a request."""
    if callable(spec):
        function("tenant", spec, {}, kind="a function scope -> tenant name")
    elif isinstance(spec, str) and spec.startswith("header:"):
        header_name("key", spec[len("header:") :])
    elif spec != "address":
        raise ConfigError("key", "must be 'address', 'header:<name>' or a function scope -> tenant name", spec)


@dataclass(frozen=True, slots=True)
class Tenancy:
    """Who the tenants are and how the capacity is divided among them. Times in seconds.

    ``key``: ``"header:<name>"`` (such as an API key), ``"address"`` or a function ``scope -> name``.
    ``weights``: tenant name or class name -> weight (default 1). ``classify``: a function ``name -> class
    name`` (or None) whose class's weight applies when the name itself has none. ``max_tenants``: most pools
    at once. ``establish``: requests within ``window`` that make a key a tenant (until then it is a
    newcomer). ``newcomer_weight``: the weight of the newcomers' pool. ``newcomer_share``: under overload the
    newcomers' demand up to this share of the capacity is met, however many tenants there are (its one weighted
    share may be less): their pool is given it with the room any pool's ask is given (``FairTuning.slack``, a quarter
    more), and the tenants share the rest. ``interval``: how often the shares
    are recomputed. ``idle``: a pool that asks nothing for this long expires. ``label``: a function ``name ->
    label`` naming a tenant in metrics (the most rejected ones are exported); by default a digest of the name,
    since a tenant key is often a secret (an API key): ``label=str`` shows names as they are.
    ``open_below``: while the tenants together ask for less than this share of the capacity (for
    ``FairTuning.span`` intervals, nobody turned away, held or holding a place), the table is *open*: a request is
    admitted from the replica's bucket without looking its tenant up (there is nothing to share out), until one
    finds that bucket empty. 0 keeps the table closed: every request is decided in its tenant's pool.

        Tenancy(key="header:x-api-key", weights={"premium": 3}, classify=lambda name: plans.get(name))
    """

    key: str | Callable[[Any], str | None] = "header:x-api-key"
    weights: Mapping[str, float] = field(default_factory=dict)
    classify: Callable[[str], str | None] | None = None
    max_tenants: int = 10_000
    establish: int = 3
    window: float = 5.0
    newcomer_weight: float = 1.0
    newcomer_share: float = 0.1
    interval: float = 0.5
    idle: float = 30.0
    label: Callable[[str], str] | None = None
    open_below: float = 0.5

    def __post_init__(self) -> None:
        _check_key(self.key)
        if not isinstance(self.weights, Mapping):
            raise ConfigError("weights", "must be a mapping of tenant or class name -> weight", self.weights)
        for name, weight in self.weights.items():
            if not isinstance(name, str):
                raise ConfigError("weights", "names must be strings", name)
            number(f"weights[{name!r}]", weight, 0.0, MAX_WEIGHT, above=True)
        object.__setattr__(self, "weights", dict(self.weights))
        if self.classify is not None:
            function("classify", self.classify, "", kind="a function tenant name -> class name")
        if self.label is not None:
            function("label", self.label, "", kind="a function tenant name -> label")
        integer("max_tenants", self.max_tenants, 1, 10_000_000)
        integer("establish", self.establish, 1, 1_000_000)
        number("window", self.window, 0.0, 3600.0, above=True, unit="seconds")
        number("newcomer_weight", self.newcomer_weight, 0.0, MAX_WEIGHT, above=True)
        number("newcomer_share", self.newcomer_share, 0.0, 0.9)
        number("interval", self.interval, 0.0, 60.0, above=True, unit="seconds")
        number("idle", self.idle, 0.0, 86_400.0, above=True, unit="seconds")
        number("open_below", self.open_below, 0.0, 1.0)

    def weight(self, name: str) -> float:
        """The weight of tenant ``name``: its own, else its class's, else 1."""
        weight = self.weights.get(name)
        if weight is None and self.classify is not None:
            try:
                kind = self.classify(name)
            except Exception:  # a user function must not fail a request: the tenant weighs 1
                kind = None
            weight = self.weights.get(kind) if isinstance(kind, str) else None
        return 1.0 if weight is None else weight
