"""Configuration from a TOML file and ``ADMITGATE_*`` environment variables: the objects code builds.

    app.add_middleware(AdmitGate, **admitgate.load("admitgate.toml"))   # or $ADMITGATE_CONFIG

The file has one section per group of :class:`~admitgate.asgi.middleware.AdmitGate`'s keywords::

    [gate]                      # AdmitGate's own: rate, exempt, default_class, metrics, workers, gate_websockets
    rate = 200                  # omit to learn the capacity live (then [capacity] tunes the estimator)
    exempt = ["/health", "/metrics"]
    [settings]                  # admitgate.Settings: burst, max_pacing_delay, tarpit, ...
    burst = 20
    [identity]                  # admitgate.Identity: key, trusted_hops, forwarded, ticket, secure_cookie
    ticket = "s3cret shared between replicas"
    [headers]                   # admitgate.HeaderPolicy: status, legacy, on_admit, draft, policy_name, body
    status = 503
    [classes.batch]             # admitgate.Priority per class (replaces the default classes)
    reserve = 0.5
    [routes."/search/{q}"]      # route template -> cost, class, exempt
    cost = 2
    [capacity]                  # the live estimator: estimator, initial, floor, ... and [capacity.<estimator>]
    estimator = "delay"
    [backend]                   # url, and admitgate.RedisBudget's options
    url = "redis://redis:6379/0"
    [tenants]                   # admitgate.Tenancy: key, weights, max_tenants, establish, ...
    key = "header:x-api-key"
    weights = { premium = 3 }
    [quota]                     # admitgate.Quota: limit, key, burst, name, max_keys
    limit = "100/minute"

Every key has a variable: ``ADMITGATE_<KEY>`` for the gate, settings and identity keys
(``ADMITGATE_BURST``, ``ADMITGATE_TICKET``), ``ADMITGATE_HEADERS_<KEY>``, ``ADMITGATE_BACKEND`` (the URL)
and ``ADMITGATE_BACKEND_<KEY>``, ``ADMITGATE_ESTIMATOR``, ``ADMITGATE_CAPACITY_<KEY>``,
``ADMITGATE_<ESTIMATOR>_<PARAM>``, ``ADMITGATE_TENANTS_<KEY>``, ``ADMITGATE_QUOTA`` (the limit) and
``ADMITGATE_QUOTA_<KEY>``; ``ADMITGATE_ROUTES``, ``ADMITGATE_CLASSES`` and
``ADMITGATE_TENANTS_WEIGHTS`` hold JSON objects.
Variables override the file. Lists are comma-separated (``ADMITGATE_EXEMPT=/health,/ready``), booleans
``true``/``false`` (or 1/0, yes/no, on/off), functions ``module:attribute`` import strings.

One rule for both: a key of the file or an ``ADMITGATE_*`` variable that names no setting is an error (with the
nearest name), as a bad value is, because a mistyped setting that is only warned about leaves the service running
on a default nobody chose. The variables Kubernetes sets for a service named ``admitgate-*``
(``ADMITGATE_REDIS_SERVICE_HOST``, ``ADMITGATE_REDIS_PORT``...) are the one exception: they are not ours, and are
skipped. Every error is a :class:`~admitgate.core.errors.ConfigError` naming the file's ``section.key`` and the
file, or the variable; the combinations only the gate checks (a rate of -5, a route's cost beyond the burst)
are checked by :func:`load` too, so they are named the same way.

Why no settings library (pydantic-settings, msgspec): the values are validated once, by the objects
themselves (:class:`~admitgate.Settings`, :class:`~admitgate.Identity`, :class:`~admitgate.HeaderPolicy`,
the estimators), because code that builds them without a file needs the same checks with the same field
names; this module only maps the file and the variables onto their signatures (it reads the type hints).
A settings library would validate a second copy of the schema and add a dependency of pydantic's weight
to a middleware whose core has none.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib's parser, from PyPI as tomli (a dependency there)
    import tomli as tomllib

from .asgi.build import check
from .asgi.headers import HeaderPolicy
from .asgi.identity import Identity
from .asgi.quota import Quota
from .asgi.routing import Router
from .config_values import (
    Convert,
    kinds_of,
    to_bool,
    to_key,
    to_metrics,
    to_number,
    to_secret,
    to_table,
    to_templates,
    to_text,
    to_whole,
)
from .core.errors import ConfigError
from .core.priority import Priority
from .core.settings import Settings
from .core.tenants.policy import Tenancy
from .limit.estimators import ESTIMATORS, capacity_from_config

log = logging.getLogger("admitgate")

SECTIONS = ("gate", "settings", "identity", "headers", "classes", "routes", "capacity", "backend", "tenants",
            "quota")  # fmt: skip
#: Keys that moved out of ``[gate]``, and where to.
_MOVED = {"routes": "[routes]", "classes": "[classes]", "backend": "[backend] url"}
#: The variables Kubernetes sets for each service (``<NAME>_SERVICE_HOST``, ``<NAME>_PORT_80_TCP_ADDR``...): a
#: service named ``admitgate-redis`` gives every pod ``ADMITGATE_REDIS_PORT``. Not settings, and not mistakes.
_SERVICE_LINK = re.compile(r"ADMITGATE(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)"
                           r"(_(PROTO|PORT|ADDR))?)?)")  # fmt: skip


def _schema() -> dict[str, dict[str, Convert]]:
    from .backends.shared import RedisBudget

    return {
        "gate": {"rate": to_number, "exempt": to_templates, "default_class": to_text, "metrics": to_metrics,
                 "workers": to_whole, "gate_websockets": to_bool},
        "settings": kinds_of(Settings),
        "identity": {**kinds_of(Identity), "key": to_key, "ticket": to_secret},
        "headers": kinds_of(HeaderPolicy),
        "backend": {"url": to_text, **kinds_of(RedisBudget, skip=("client",))},
        "tenants": {**kinds_of(Tenancy, skip=("weights",)), "weights": to_table},
        "quota": {"limit": to_text, **kinds_of(Quota)},
    }  # fmt: skip


# -- the environment ------------------------------------------------------------------------------
def _variable(var: str, flat: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """(section, key) that ``var`` sets, or None if it names no setting."""
    name = var[len("ADMITGATE_") :].lower()
    if name in flat:
        return flat[name]
    if name in ("routes", "classes"):
        return name, ""
    if name == "estimator":
        return "capacity", "estimator"
    for prefix, section in (("headers_", "headers"), ("backend_", "backend"), ("capacity_", "capacity"),
                            ("tenants_", "tenants"), ("quota_", "quota")):  # fmt: skip
        if name.startswith(prefix) and name[len(prefix) :]:
            return section, name[len(prefix) :]
    estimator, _, param = name.partition("_")
    if estimator in ESTIMATORS and param:
        return "capacity", f"{estimator}.{param}"
    return None


def _from_env(env: Mapping[str, str], schema: dict[str, dict[str, Convert]]) -> dict[tuple[str, str], tuple[str, str]]:
    """``{(section, key): (raw value, variable)}`` for every ``ADMITGATE_*`` variable that names a setting."""
    flat = {key: (section, key) for section in ("gate", "settings", "identity") for key in schema[section]}
    flat["backend"] = ("backend", "url")
    flat["quota"] = ("quota", "limit")
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for var, raw in env.items():
        if not var.startswith("ADMITGATE_") or var == "ADMITGATE_CONFIG":
            continue
        if var.startswith("ADMITGATE_HEADROOM_"):  # its name in 0.1.0
            raise ConfigError(var, f"is now called ADMITGATE_CAPACITY_{var[len('ADMITGATE_HEADROOM_') :]}: rename it")
        place = _variable(var, flat)
        if place is None and _SERVICE_LINK.fullmatch(var):
            continue
        if place is None:
            known = [f"ADMITGATE_{k.upper()}" for k in flat]
            raise ConfigError(var, f"names no admitgate setting{_nearest(var, known)}; the variables are listed in "
                                   "docs/configuration.md")  # fmt: skip
        found[place] = (raw, var)
    return found


# -- the file -------------------------------------------------------------------------------------
def _read(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError("config", "file not found", str(path)) from None
    except IsADirectoryError:
        raise ConfigError("config", "is a directory, not a TOML file", str(path)) from None
    except OSError as exc:
        raise ConfigError("config", f"cannot be read ({exc.strerror})", str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("config", f"is not UTF-8 text (byte {exc.start})", str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"not valid TOML: {exc}", str(path)) from None
    if "headroom" in data:  # its name in 0.1.0 (headroom is H = μ − λ_new; this table tunes how μ is learnt)
        raise ConfigError("headroom", "the table is now called [capacity] (same keys): rename it")
    unknown = set(data) - set(SECTIONS)
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"unknown section; known: {', '.join(SECTIONS)}")
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table ([section])", table)
    return data


# -- loading --------------------------------------------------------------------------------------
def load(path: str | Path | None = None, env: Mapping[str, str] | None = None, now: float = 0.0) -> dict[str, Any]:
    """AdmitGate keyword arguments from ``path`` (TOML; default ``$ADMITGATE_CONFIG``) and ``env``
    (default ``os.environ``): only what was set, as the objects code builds (``Settings``, ``Identity``,
    ``HeaderPolicy``, ``Priority``, ``LiveCapacity``, ``RedisBudget``), so ``AdmitGate(app, **load())`` works.

    A number in ``rate`` is the capacity, and then nothing is learnt: a ``[capacity]`` table beside it
    is ignored with a warning (a deployment may set estimator defaults for every service). Without a
    rate, ``[capacity]`` (or any ``ADMITGATE_CAPACITY_*``) tunes the estimator that learns it. What only the gate
    would check (the rate's range, a route's cost against the burst, a quota's key) is checked here too, so every
    error names the key and file, or the variable, it came from.
    """
    env = os.environ if env is None else env
    path = path or env.get("ADMITGATE_CONFIG")
    schema = _schema()
    values, names = _gather(path, env, schema)
    try:
        out = _options(values, names, schema, now)
        check(out)
    except ConfigError as error:
        raise _located(error, names, str(path) if path else None) from None
    return out


def _options(values: dict[str, dict[str, Any]], names: Names, schema: dict[str, dict[str, Convert]],
             now: float) -> dict[str, Any]:  # fmt: skip
    """AdmitGate's keyword arguments from the ``values`` gathered (see :func:`load`)."""
    out: dict[str, Any] = {}
    for section in ("gate", "settings", "identity", "headers", "backend", "tenants", "quota"):
        for key, value in values[section].items():
            convert = schema[section].get(key)
            if convert is None:
                raise _unknown(section, key, schema, names)
            from_env = names[section, key].startswith("ADMITGATE_")
            values[section][key] = _convert(convert, value, from_env, names[section, key])
    gate = values["gate"]
    out.update({k: v for k, v in gate.items() if not (k == "metrics" and v is None)})
    if values["quota"] and "limit" not in values["quota"]:
        raise ConfigError("quota.limit", "is required with other [quota] keys (or ADMITGATE_QUOTA)")
    built = (("settings", Settings), ("identity", Identity), ("headers", HeaderPolicy), ("tenants", Tenancy),
             ("quota", Quota))  # fmt: skip
    for section, kind in built:
        if values[section]:
            out[section] = _build(kind, values[section], section, names)
    if values["classes"]:
        out["classes"] = _classes(values["classes"], names)
    if values["routes"]:
        out["routes"] = _route_keys(values["routes"], names)
    _check_routes(out, names)
    if values["backend"]:
        backend = _backend(values["backend"], names)
        if backend is not None:
            out["backend"] = backend
    capacity = values["capacity"]
    if capacity and "rate" in gate:
        log.warning("admitgate: rate=%r is the capacity, so nothing is learnt: the [capacity] settings (%s) are "
                    "ignored", gate["rate"], ", ".join(sorted(capacity)))  # fmt: skip
    elif capacity:
        out["rate"] = _build(lambda **kw: capacity_from_config(kw, now=now), capacity, "capacity", names)
    return out


def _located(error: ConfigError, names: Names, path: str | None) -> ConfigError:
    """``error`` naming the key or variable that set its field, and the file if it came from one.

    The gate's own checks name a keyword (``rate``, ``burst``, ``routes['/x'].cost``); a keyword set by the file
    is ``section.key`` there, one set by a variable is the variable."""
    field = error.field
    if field.startswith("routes["):
        field = _route_name(field, names)
    elif field not in names.values():
        for section in ("gate", "settings", "identity", "headers", "tenants", "quota", "backend"):
            rest = field.removeprefix(f"{section}.")
            head = rest.split("[", 1)[0].split(".", 1)[0]
            if (section, head) in names:
                field = names[section, head] + rest[len(head) :]
                break
    from_file = path is not None and any(
        field == name or field.startswith((f"{name}.", f"{name}[")) for name in names.values()
        if not name.startswith("ADMITGATE_"))  # fmt: skip
    return error.renamed(field, path if from_file else None)


def _gather(path: str | Path | None, env: Mapping[str, str],
            schema: dict[str, dict[str, Convert]]) -> tuple[dict[str, dict[str, Any]], Names]:  # fmt: skip
    """Every value the file at ``path`` (if any) and the variables in ``env`` set, by section and key, as given
    (variables over the file), and what an error calls each."""
    data = _read(path) if path else {}
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    names: dict[tuple[str, str], str] = {}  # (section, key) -> what to call it in an error
    for section, table in data.items():
        for key, value in table.items():
            values[section][key] = value
            names[section, key] = f"{section}[{key!r}]" if section in ("routes", "classes") else f"{section}.{key}"
    for (section, key), (raw, var) in _from_env(env, schema).items():
        if section in ("routes", "classes"):
            values[section] = _convert(to_table, raw, True, var)
            names.update({(section, k): f"{var}[{k!r}]" for k in values[section]})
        elif section == "capacity":
            _put_capacity(values["capacity"], key, raw, var)
            if "." not in key:  # an estimator's parameter keeps the file's name, capacity.<estimator>.<param>
                names[section, key] = var
        else:
            values[section][key] = raw
            names[section, key] = var
    return values, names


def _convert(convert: Convert, value: object, env: bool, name: str) -> Any:
    try:
        return convert(value, env)
    except ValueError as exc:
        raise ConfigError(name, str(exc), value) from None


def _put_capacity(table: dict[str, Any], key: str, raw: str, var: str) -> None:
    """Put one ``ADMITGATE_CAPACITY_*`` (or estimator) value into ``[capacity]``, typed as the file would be."""
    if key == "capacity_probes":
        value: Any = to_templates(raw, True)
    else:
        value = raw if key in ("estimator", "probe_mode") else _guess(raw)
    if "." in key:
        estimator, _, param = key.partition(".")
        nested = table.setdefault(estimator, {})
        if not isinstance(nested, dict):
            raise ConfigError(var, "conflicts with a [capacity] key of the same name")
        nested[param] = value
    else:
        table[key] = value


def _guess(raw: str) -> object:
    """An environment value for a table whose keys are not typed here: a number, a boolean, or the string."""
    for convert in (to_whole, to_number, to_bool):
        try:
            return convert(raw, True)
        except ValueError:
            pass
    return raw


Names = dict[tuple[str, str], str]  # (section, key) -> what an error calls it: settings.burst, ADMITGATE_BURST


def _unknown(section: str, key: str, schema: dict[str, dict[str, Convert]], names: Names) -> ConfigError:
    name = names[section, key]
    if section == "gate" and key in _MOVED:
        return ConfigError(name, f"moved to {_MOVED[key]}")
    for other in ("settings", "identity"):
        if section == "gate" and key in schema[other]:
            return ConfigError(name, f"belongs in [{other}]")
    return ConfigError(name, f"unknown key{_nearest(key, list(schema[section]))}; known: {', '.join(schema[section])}")


def _nearest(name: str, known: list[str]) -> str:
    """`` (did you mean X?)`` for the known name nearest ``name``, if one is near."""
    near = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _build(kind: Callable[..., Any], params: dict[str, Any], section: str, names: dict[tuple[str, str], str]) -> Any:
    """``kind(**params)``, its ConfigError renamed after the key or variable that set the field."""
    try:
        return kind(**params)
    except ConfigError as error:
        raise _renamed(error, section, names) from None


def _renamed(error: ConfigError, section: str, names: dict[tuple[str, str], str]) -> ConfigError:
    field = error.field.removeprefix(f"{section}.")
    head = field.split("[", 1)[0].split(".", 1)[0]
    if (section, head) in names:
        return error.renamed(names[section, head] + field[len(head) :])
    if (section, "") in names or section in ("routes", "classes", "gate"):
        return error
    return error.renamed(f"{section}.{field}")


def _classes(table: dict[str, Any], names: dict[tuple[str, str], str]) -> dict[str, Priority]:
    classes = {}
    for name, spec in table.items():
        field = names.get(("classes", name), f"classes[{name!r}]")
        if not isinstance(spec, Mapping):
            raise ConfigError(field, "must be a table of critical and reserve", spec)
        unknown = set(spec) - {"critical", "reserve"}
        if unknown:
            raise ConfigError(field, f"unknown keys {sorted(unknown)}; known: critical, reserve")
        try:
            classes[name] = Priority(name, **spec)
        except ConfigError as error:
            raise ConfigError(field + error.field.partition("]")[2], error.problem, error.value) from None
    return classes


def _check_routes(out: dict[str, Any], names: dict[tuple[str, str], str]) -> None:
    """Build the router once, so a bad route, template or class fails here, named as it was set."""
    if not {"routes", "exempt", "classes", "default_class"} & set(out):
        return
    try:
        Router(out.get("routes"), out.get("exempt", ()), classes=out.get("classes"),
               default_class=out.get("default_class", "default"))  # fmt: skip
    except ConfigError as error:
        if error.field.startswith("routes["):
            raise error.renamed(_route_name(error.field, names)) from None
        raise _renamed(error, "gate", names) from None


def _route_keys(routes: dict[str, Any], names: Names) -> dict[str, Any]:
    """``routes`` with each route quota's ``key``, if an import string (``"myapp.keys:user"``), its function."""
    for template, spec in routes.items():
        quota = spec.get("quota") if isinstance(spec, Mapping) else None
        if isinstance(quota, Mapping) and "key" in quota:
            name = names.get(("routes", template), f"routes[{template!r}]")
            spec["quota"] = {**quota, "key": _convert(to_key, quota["key"], False, f"{name}.quota.key")}
    return routes


def _route_name(field: str, names: Names) -> str:
    """``routes['/x'].cost`` as it was set: the file's ``routes['/x'].cost``, or ``ADMITGATE_ROUTES['/x'].cost``."""
    template, _, rest = field[len("routes[") :].partition("]")
    where = {repr(key): name for (section, key), name in names.items() if section == "routes"}
    return where.get(template, f"routes[{template}]") + rest


def _backend(table: dict[str, Any], names: dict[tuple[str, str], str]) -> Any:
    """The shared budget (a :class:`~admitgate.backends.shared.RedisBudget`, checked now), or None for ``memory://``."""
    from .backends.shared import backend_from_url

    if "url" not in table:
        raise ConfigError("backend.url", "is required with other [backend] keys")
    options = {k: v for k, v in table.items() if k != "url"}
    try:
        return backend_from_url(table["url"], **options)
    except ConfigError as error:
        raise _renamed(error.renamed("backend.url") if error.field == "backend" else error, "backend", names) from None
