"""The capacity estimators by name, and a live capacity built from a ``[capacity]`` table.

* :class:`~admitgate.limit.static.Static` (``"static"``): a configured capacity.
* :class:`~admitgate.limit.delay.QueueDelay` (``"delay"``, the default): the admission rate that holds the
  queueing delay (the event loop's lag, an upstream's queue) at a target once a queue stands; open until one does.
* :class:`~admitgate.limit.bdp.BandwidthDelay` (``"bdp"``): a rate-based BBR.
* :class:`~admitgate.limit.gradient.Gradient` (``"gradient"``): Gradient2/Envoy style; the rate scales by the
  clamped ratio ``(1 + tolerance) · baseline / latency``, smoothed on the way down, growing on the way up.
* :class:`~admitgate.limit.aimd.AIMD` (``"aimd"``): additive increase while latency is under target,
  multiplicative decrease on a drop or a latency over target, at most once per latency period.

Gradient and AIMD re-probe their baseline after a jittered ``reprobe`` interval.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from ..core.errors import ConfigError, imported
from ..core.probes import Probes
from .aimd import AIMD
from .bdp import BandwidthDelay
from .capacity import LiveCapacity
from .delay import QueueDelay
from .estimator import Estimator
from .gradient import Gradient
from .static import Static

#: ``[capacity]`` keys (LiveCapacity keyword arguments) besides ``estimator`` and the estimator tables.
CAPACITY_KEYS = ("initial", "floor", "ceiling", "max_step", "window", "min_samples", "probe_bucket",
                 "probe_buckets", "background", "capacity_probes", "probe_mode", "growth",
                 "inflight_floor")  # fmt: skip
#: The default estimator (see the README's estimator table for why).
DEFAULT_ESTIMATOR = "delay"
ESTIMATORS: dict[str, type] = {"static": Static, "delay": QueueDelay, "bdp": BandwidthDelay, "gradient": Gradient,
                               "aimd": AIMD}  # fmt: skip


def estimator_from_config(name: str, params: Mapping[str, Any] | None = None) -> Estimator:
    """Build an estimator by name with keyword ``params``; errors name the offending field."""
    if name not in ESTIMATORS:
        raise ConfigError("capacity.estimator", f"unknown; known: {', '.join(ESTIMATORS)}", name)
    cls = ESTIMATORS[name]
    params = dict(params or {})
    accepted = set(inspect.signature(cls).parameters)
    for key in params:
        if key not in accepted:
            raise ConfigError(f"capacity.{name}.{key}", f"unknown parameter; known: {', '.join(sorted(accepted))}")
    if name == "static" and "capacity" not in params:
        raise ConfigError("capacity.static.capacity", "is required for the static estimator")
    for key, value in params.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"capacity.{name}.{key}", "must be a number", value)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"capacity.{name}.{key}", "must be finite", value)
    estimator: Estimator = cls(**params)
    return estimator


def capacity_from_config(section: Mapping[str, Any], now: float = 0.0) -> LiveCapacity:
    """Build a :class:`~admitgate.limit.capacity.LiveCapacity` from a ``[capacity]`` mapping."""
    data = dict(section)
    name = data.pop("estimator", DEFAULT_ESTIMATOR)
    if not isinstance(name, str):
        raise ConfigError("capacity.estimator", "must be a string", name)
    params: dict[str, Any] = {}
    for key in list(data):
        if key in ESTIMATORS:
            table = data.pop(key)
            if not isinstance(table, Mapping):
                raise ConfigError(f"capacity.{key}", "must be a table", table)
            if key == name:
                params = dict(table)
    unknown = set(data) - set(CAPACITY_KEYS)
    if unknown:
        field = sorted(unknown)[0]
        raise ConfigError(f"capacity.{field}", f"unknown key; known: estimator, {', '.join(CAPACITY_KEYS)}")
    estimator = estimator_from_config(name, params)
    probes = Probes(data.pop("probe_bucket", 0.1), data.pop("probe_buckets", 50), now=now)
    background = data.pop("background", 0.0)
    if isinstance(background, str):
        background = imported("capacity.background", background)
    capacity = data.pop("capacity_probes", [])
    if not isinstance(capacity, list):
        raise ConfigError("capacity.capacity_probes", "must be a list of import strings", capacity)
    probes_list: list[Any] = [imported(f"capacity.capacity_probes[{i}]", spec) if isinstance(spec, str) else spec
                   for i, spec in enumerate(capacity)]  # fmt: skip
    if name == "static" and "initial" not in data:
        data["initial"] = params["capacity"]
    for key, value in data.items():
        if key != "probe_mode" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"capacity.{key}", "must be a number", value)
    return LiveCapacity(estimator, capacity_probes=probes_list, background=background, probes=probes, now=now, **data)
