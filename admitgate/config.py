"""Configuration from a TOML file and ``ADMITGATE_*`` environment variables, validated at start-up.

    # admitgate.toml
    [gate]
    burst = 50
    max_pacing_delay = 1.5

    [headroom]
    estimator = "bdp"        # static | bdp | gradient | aimd
    initial = 200            # requests/s before any evidence
    floor = 5
    [headroom.bdp]
    tolerance = 0.25

    app = AdmitGate(app, **admitgate.config.load("admitgate.toml"))

Environment variables override the file: ``ADMITGATE_<KEY>`` for ``[gate]`` keys and
``ADMITGATE_HEADROOM_<KEY>`` / ``ADMITGATE_<ESTIMATOR>_<PARAM>`` for the headroom (for example
``ADMITGATE_ESTIMATOR=gradient``, ``ADMITGATE_HEADROOM_FLOOR=10``, ``ADMITGATE_BDP_TOLERANCE=0.3``).
Every error is a :class:`~admitgate.errors.ConfigError` naming the field (``headroom.bdp.tolerance``).
External probes are given as ``"module:attribute"`` import strings.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib's parser, from PyPI as tomli (a dependency there)
    import tomli as tomllib

from .errors import ConfigError
from .estimators import ESTIMATORS, estimator_from_config
from .headroom import LiveHeadroom
from .probes import Probes

#: ``[gate]`` keys accepted (AdmitGate keyword arguments that are plain values), with their types.
GATE_KEYS: dict[str, type | tuple[type, ...]] = {
    "rate": (int, float), "burst": (int, float), "max_pacing_delay": (int, float), "max_waiters": int,
    "spread": str, "max_retry_after": (int, float), "exempt": list, "default_class": str, "key": str,
    "trusted_hops": int, "forwarded": str, "ticket": bool, "secure_cookie": bool, "gate_websockets": bool,
    "tarpit": (int, float), "max_tarpitted": int, "max_keys": int, "routes": dict, "standing_queue": (int, float),
    "fresh_pacing_delay": (int, float), "backend": str,
}  # fmt: skip
#: ``[headroom]`` keys (LiveHeadroom keyword arguments) besides ``estimator`` and the estimator tables.
HEADROOM_KEYS = ("initial", "floor", "ceiling", "max_step", "window", "min_samples", "probe_bucket",
                 "probe_buckets", "background", "capacity_probes", "probe_mode", "growth")  # fmt: skip
#: The default estimator (see the README's estimator table for why).
DEFAULT_ESTIMATOR = "bdp"


def _import(field: str, spec: object) -> Any:
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(field, "must be an import string 'module:attribute'", spec)
    module, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(field, f"cannot import ({exc})", spec) from None
    if not callable(target):
        raise ConfigError(field, "does not name a callable", spec)
    return target


def _number(field: str, text: str) -> int | float | str | bool:
    """Parse an environment value: int, float, bool, or else the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def headroom_from_config(section: Mapping[str, Any], now: float = 0.0) -> LiveHeadroom:
    """Build a :class:`~admitgate.headroom.LiveHeadroom` from a ``[headroom]`` mapping."""
    data = dict(section)
    name = data.pop("estimator", DEFAULT_ESTIMATOR)
    if not isinstance(name, str):
        raise ConfigError("headroom.estimator", "must be a string", name)
    params: dict[str, Any] = {}
    for key in list(data):
        if key in ESTIMATORS:
            table = data.pop(key)
            if not isinstance(table, Mapping):
                raise ConfigError(f"headroom.{key}", "must be a table", table)
            if key == name:
                params = dict(table)
    unknown = set(data) - set(HEADROOM_KEYS)
    if unknown:
        field = sorted(unknown)[0]
        raise ConfigError(f"headroom.{field}", f"unknown key; known: estimator, {', '.join(HEADROOM_KEYS)}")
    estimator = estimator_from_config(name, params)
    probes = Probes(data.pop("probe_bucket", 0.1), data.pop("probe_buckets", 50), now=now)
    background = data.pop("background", 0.0)
    if isinstance(background, str):
        background = _import("headroom.background", background)
    capacity = data.pop("capacity_probes", [])
    if not isinstance(capacity, list):
        raise ConfigError("headroom.capacity_probes", "must be a list of import strings", capacity)
    probes_list = [_import(f"headroom.capacity_probes[{i}]", spec) if isinstance(spec, str) else spec
                   for i, spec in enumerate(capacity)]  # fmt: skip
    if name == "static" and "initial" not in data:
        data["initial"] = params["capacity"]
    for key, value in data.items():
        if key != "probe_mode" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"headroom.{key}", "must be a number", value)
    return LiveHeadroom(estimator, capacity_probes=probes_list, background=background, probes=probes, now=now, **data)


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``ADMITGATE_*`` variables as a nested config mapping (``{"gate": .., "headroom": ..}``)."""
    gate: dict[str, Any] = {}
    headroom: dict[str, Any] = {}
    for var, raw in env.items():
        if not var.startswith("ADMITGATE_") or var == "ADMITGATE_CONFIG":
            continue
        key = var[len("ADMITGATE_") :].lower()
        value = _number(var, raw)
        if key == "estimator":
            headroom["estimator"] = raw
        elif key.startswith("headroom_"):
            headroom[key[len("headroom_") :]] = value
        elif key.split("_", 1)[0] in ESTIMATORS and "_" in key:
            est, param = key.split("_", 1)
            headroom.setdefault(est, {})[param] = value
        elif key in GATE_KEYS:
            gate[key] = value
        else:
            raise ConfigError(var, "unknown admitgate environment variable")
    out: dict[str, Any] = {}
    if gate:
        out["gate"] = gate
    if headroom:
        out["headroom"] = headroom
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def load(path: str | Path | None = None, env: Mapping[str, str] | None = None, now: float = 0.0) -> dict[str, Any]:
    """AdmitGate keyword arguments from ``path`` (TOML; default ``$ADMITGATE_CONFIG``) and ``env``.

    With a ``[headroom]`` table (or ``ADMITGATE_ESTIMATOR``) the rate is a :class:`LiveHeadroom`;
    otherwise ``[gate] rate`` is a static rate.
    """
    env = os.environ if env is None else env
    path = path or env.get("ADMITGATE_CONFIG")
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError("config", "file not found", str(path)) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", f"not valid TOML: {exc}", str(path)) from None
    data = _merge(data, from_env(env))
    unknown = set(data) - {"gate", "headroom"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown section; known: gate, headroom")
    gate = dict(data.get("gate", {}))
    for key, value in gate.items():
        kind = GATE_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"gate.{key}", f"unknown key; known: {', '.join(GATE_KEYS)}")
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise ConfigError(f"gate.{key}", f"must be of type {getattr(kind, '__name__', kind)}", value)
    if "headroom" in data:
        if "rate" in gate:
            raise ConfigError("gate.rate", "conflicts with [headroom] (the rate is estimated)")
        gate["rate"] = headroom_from_config(data["headroom"], now=now)
    return gate
