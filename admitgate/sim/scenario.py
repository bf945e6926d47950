"""A herd scenario: what the simulator runs (its fields, their units and checks) and the embedded ones.

Times in seconds, rates in requests/s. A scenario is plain data: a TOML file or a dict gives its fields,
:func:`scenario_from` starts from an embedded one by name and :meth:`Scenario.validate` names the field
that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..core.errors import ConfigError, non_negative
from ..core.priority import DEFAULT_CLASSES
from ..core.tenants.policy import Tenancy

POLICIES = ("obey", "obey-jitter", "ignore", "full", "equal", "decorrelated")


@dataclass
class Scenario:
    """Everything a run needs; times in seconds, rates in requests/s."""

    name: str = "cache-expiry herd"
    clients: int = 2000
    release_at: float = 6.0  # new arrivals run alone before this (warm-up: λ_new is a median of 5 seconds)
    release_spread: float = 0.0  # clients released uniformly over this many seconds
    workers: int = 20
    service_time: float = 0.1  # mean
    service_dist: str = "fixed"  # fixed | exponential | lognormal
    queue_timeout: float = 1.0
    capacity: list[tuple[float, ...]] = field(default_factory=list)  # (time, workers[, service_time]) steps
    demand: list[tuple[float, float]] = field(default_factory=list)  # (time, rate) open-loop arrivals, no retries
    estimator: dict[str, Any] | None = None  # a [capacity] table: the gate's rate is estimated live
    capacity_known: bool = False  # a static gate is told the capacity as it changes (an external capacity probe)
    background_rate: float = 20.0  # new arrivals λ₀, requests/s, one attempt each
    background_class: str = "default"
    policy: str = "obey"
    ignore_fraction: float = 0.0
    ignore_interval: float = 0.1
    recognisable: bool = True
    gate: bool = True
    rate_fraction: float = 1.0  # the gate's static rate μ, as a fraction of the initial capacity
    burst: float | None = None  # default: workers
    spread: str = "schedule"
    max_pacing_delay: float = 1.5
    tarpit: float = 1.0
    network_delay: float = 0.0005  # one way, client <-> gate
    edge_cpu: float = 0.0  # CPU seconds per HTTP request on the server's one core (0: an ideal server)
    reject_cpu: float | None = None  # CPU seconds per 429 answered by the gate (None: edge_cpu)
    duration: float = 300.0  # hard bound on simulated time
    seed: int = 1
    # Tenants (admitgate.core.tenants): a [tenants] table of Tenancy settings but its key (here a request's
    # tenant is named by the scenario), the herd's clients as (tenant, clients) groups in the order they are
    # numbered (default: all in tenant "herd"), and the tenant of the new arrivals (None: no tenant name).
    tenants: dict[str, Any] | None = None
    herd_tenants: list[tuple[str, int]] = field(default_factory=list)
    background_tenant: str | None = None

    def validate(self) -> Scenario:
        if self.clients < (0 if self.demand else 1):
            raise ConfigError("clients", "must be >= 1 (or >= 0 with a demand schedule)", self.clients)
        if self.workers < 1:
            raise ConfigError("workers", "must be >= 1", self.workers)
        if self.policy not in POLICIES:
            raise ConfigError("policy", f"unknown; known: {', '.join(POLICIES)}", self.policy)
        if self.service_dist not in ("fixed", "exponential", "lognormal"):
            raise ConfigError("service_dist", "must be fixed, exponential or lognormal", self.service_dist)
        if self.background_class not in DEFAULT_CLASSES:
            known = ", ".join(DEFAULT_CLASSES)
            raise ConfigError("background_class", f"unknown; known: {known}", self.background_class)
        if not 0 <= self.ignore_fraction <= 1:
            raise ConfigError("ignore_fraction", "must be in [0, 1]", self.ignore_fraction)
        non_negative("edge_cpu", self.edge_cpu)
        for name in ("service_time", "queue_timeout", "duration", "rate_fraction"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be > 0", getattr(self, name))
        self.tenancy()
        if self.herd_tenants or self.background_tenant is not None:
            if self.tenants is None:
                raise ConfigError("herd_tenants", "names tenants, but there is no [tenants] table", self.herd_tenants)
            counts = [count for _, count in self.herd_tenants]
            if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) or (
                    counts and sum(counts) != self.clients):  # fmt: skip
                raise ConfigError("herd_tenants", f"must be (tenant, clients >= 1) groups adding up to clients "
                                  f"({self.clients})", self.herd_tenants)  # fmt: skip
        return self

    def tenancy(self) -> Tenancy | None:
        """The :class:`~admitgate.core.tenants.policy.Tenancy` of ``tenants`` (None: one pool). The scenario names
        each request's tenant itself, so the table has no key."""
        if self.tenants is None:
            return None
        if not isinstance(self.tenants, dict) or "key" in self.tenants:
            raise ConfigError("tenants", "must be a table of Tenancy settings without key (the scenario names "
                              "each request's tenant)", self.tenants)  # fmt: skip
        unknown = set(self.tenants) - {f.name for f in fields(Tenancy)}
        if unknown:
            raise ConfigError(f"tenants.{sorted(unknown)[0]}", "unknown Tenancy setting")
        return Tenancy(**self.tenants)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"unknown scenario field; known: {', '.join(sorted(known))}")
        data = dict(data)
        for key in ("capacity", "demand", "herd_tenants"):
            if key in data:
                data[key] = [tuple(step) for step in data[key]]
        return cls(**data).validate()


#: Embedded scenarios. Each is a dict of Scenario fields; a TOML file may name one as ``base``.
SCENARIOS: dict[str, dict[str, Any]] = {
    "cache-expiry": {"name": "cache-expiry herd"},
    # bench/herd.py's setup with the demo server's measured CPU on its one core: ~200 µs per request
    # or queue timeout, 108 µs per 429 (wrk against an all-rejecting gate)
    "loopback-demo": {"name": "cache-expiry herd on the loopback demo server", "edge_cpu": 0.0002,
                      "reject_cpu": 0.000108},
    "outage-recovery": {"name": "outage, then recovery with a backlog", "release_spread": 10.0,
                        "capacity": [(6.0, 0), (16.0, 20)]},
    "window-reopening": {"name": "rate-limit window reopening (synchronised reset)", "clients": 4000},
    "step-down": {"name": "capacity halves 5 s into the herd", "capacity": [(11.0, 10)]},
    "step-up": {"name": "capacity doubles 2 s into the herd", "capacity": [(8.0, 40)]},
    # bench/tenant_herd.py's setup: a herd in one tenant, a small tenant beside it (10 requests/s, one try each)
    "tenant-herd": {"name": "a herd in one tenant beside a small tenant", "tenants": {}, "background_tenant": "small",
                    "background_rate": 10.0},
    "ramp": {"name": "capacity ramps from 5 to 20 workers over 10 s (warming)", "workers": 5,
             "capacity": [(6.0 + i, 5 + i * 1.5) for i in range(11)]},
}  # fmt: skip


def scenario_from(name_or_data: str | dict[str, Any] | None = None, **overrides: Any) -> Scenario:
    """An embedded scenario by name, or a dict of fields (``base`` naming one to start from)."""
    data: dict[str, Any] = {}
    if isinstance(name_or_data, str):
        if name_or_data not in SCENARIOS:
            raise ConfigError("scenario", f"unknown; known: {', '.join(SCENARIOS)}", name_or_data)
        data.update(SCENARIOS[name_or_data])
    elif isinstance(name_or_data, dict):
        base = name_or_data.get("base")
        if base is not None:
            data.update(scenario_from(base).__dict__)
        data.update({k: v for k, v in name_or_data.items() if k != "base"})
    data.update({k: v for k, v in overrides.items() if v is not None})
    return Scenario.from_dict(data)
