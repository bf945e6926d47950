"""The configuration's values by kind: each converter takes a value from a file or from the environment (a string)
and returns it typed, or raises ``ValueError`` stating the problem (the caller names the field and its source).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .core.errors import ConfigError, imported

_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})

Convert = Callable[[object, bool], object]  # (value, from the environment) -> value; ValueError(problem) if bad


def to_number(value: object, env: bool) -> object:
    if env and isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    return value


def to_whole(value: object, env: bool) -> object:
    if env and isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be a whole number")
    return value


def to_bool(value: object, env: bool) -> object:
    if env and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def to_text(value: object, env: bool) -> object:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def to_secret(value: object, env: bool) -> object:
    """``ticket``: true or false, else the shared secret itself."""
    if env and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, (bool, str)):
        raise ValueError("must be true, false or the shared secret (a string)")
    return value


def to_function(value: object, env: bool) -> object:
    try:
        return imported("", value)
    except ConfigError as error:
        raise ValueError(error.problem) from None


def to_key(value: object, env: bool) -> object:
    """``key``: "connection", "header:<name>", or an import string naming a function."""
    if isinstance(value, str) and value != "connection" and not value.startswith("header:") and ":" in value:
        return to_function(value, env)
    return to_text(value, env)


def to_templates(value: object, env: bool) -> object:
    if env and isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("must be a list of strings")
    return value


def to_table(value: object, env: bool) -> object:
    if env and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("must be a JSON object") from None
    if not isinstance(value, Mapping):
        raise ValueError("must be a JSON object" if env else "must be a table")
    return dict(value)


def to_metrics(value: object, env: bool) -> object:
    """``metrics``: true (prometheus-client's global registry), false, or an import string naming a registry."""
    if isinstance(value, str) and ":" in value:
        module, _, attr = value.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import it ({exc})") from None
    if to_bool(value, env):
        from prometheus_client import REGISTRY

        return REGISTRY
    return None


_UnionType = type(int | str)


def kind_of(hint: object) -> Convert:
    """The converter for a parameter annotated ``hint``."""
    options = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, _UnionType) else {hint}
    options.discard(type(None))
    callables = {o for o in options if typing.get_origin(o) is Callable or o is Callable}
    if bytes in options:
        return to_secret
    if callables:
        return to_key if str in options else to_function
    for kind, convert in ((bool, to_bool), (float, to_number), (int, to_whole), (str, to_text)):
        if kind in options:
            return convert
    raise TypeError(f"no converter for {hint!r}")  # a new parameter type: teach this module


def kinds_of(target: Any, skip: tuple[str, ...] = ()) -> dict[str, Convert]:
    """Converters for the keyword parameters of ``target`` (a dataclass or a class's ``__init__``)."""
    hints = typing.get_type_hints(target if dataclasses.is_dataclass(target) else target.__init__)
    names = [p.name for p in inspect.signature(target).parameters.values() if p.kind is p.KEYWORD_ONLY or
             p.default is not p.empty]  # fmt: skip
    return {name: kind_of(hints[name]) for name in names if name not in skip}
