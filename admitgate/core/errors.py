"""Errors raised for bad configuration, and the checks that raise them."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: The characters of an HTTP field name (RFC 9110 ``token``), lower-case.
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


class ConfigError(ValueError):
    """Invalid configuration, raised at construction (start-up), never per request.

    ``field`` names the offending setting so the message can be acted upon; ``problem`` says what is
    wrong with it in words, ``value`` is what was given (``...`` if not shown); ``source``, the file the
    setting was read from (None: code, or a variable, which ``field`` names).
    """

    def __init__(self, field: str, problem: str, value: object = ..., source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.value = value
        self.source = source
        got = "" if value is ... else f" (got {_shown(value)})"
        where = "" if source is None else f" in {source}"
        super().__init__(f"admitgate: invalid {field}{where}: {problem}{got}")

    def renamed(self, field: str, source: str | None = None) -> ConfigError:
        """The same error about ``field`` (a config file's ``settings.burst``, a variable's name), read from
        ``source`` (a file; default: the one it was read from, if any)."""
        return ConfigError(field, self.problem, self.value, source or self.source)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number(field: str, value: object, low: float, high: float, *, above: bool = False, unit: str = "") -> float:
    """``value`` as a float if it is a number in [low, high] (``above``: in (low, high]), else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a number", value)
    ok = (value > low if above else value >= low) and value <= high
    if not ok:  # NaN fails both comparisons
        span = f"{'(' if above else '['}{low:g}, {high:g}]"
        raise ConfigError(field, f"must be a number in {span}{' ' + unit if unit else ''}", value)
    return float(value)


def positive(field: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number > 0, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a number", value)
    if not 0 < value < math.inf:
        raise ConfigError(field, "must be a finite number > 0", value)
    return float(value)


def non_negative(field: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number >= 0, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a number", value)
    if not 0 <= value < math.inf:
        raise ConfigError(field, "must be a finite number >= 0", value)
    return float(value)


def integer(field: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) in [minimum, maximum], else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, "must be a whole number", value)
    if value < minimum or (maximum is not None and value > maximum):
        span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(field, f"must be a whole number {span}", value)
    return value


def flag(field: str, value: object) -> bool:
    """``value`` if it is True or False (not 1, not "no"), else ConfigError."""
    if not isinstance(value, bool):
        raise ConfigError(field, "must be True or False", value)
    return value


def choice(field: str, value: object, options: tuple[str, ...]) -> str:
    """``value`` if it is one of ``options``, else ConfigError listing them."""
    if not isinstance(value, str) or value not in options:
        raise ConfigError(field, f"must be one of {', '.join(map(repr, options))}", value)
    return value


def function(field: str, value: object, *args: object, kind: str = "a function") -> Callable[..., object]:
    """``value`` if it is callable with ``args`` (positional; checked against its signature where it has
    one, never called), else ConfigError saying what was expected (``kind``)."""
    if not callable(value):
        raise ConfigError(field, f"must be {kind}", value)
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # some builtins have no signature: nothing to check
        return value
    try:
        signature.bind(*args)
    except TypeError:
        raise ConfigError(field, f"must be {kind} (it cannot be called with {len(args)} argument(s))", value) from None
    return value


def imported(field: str, spec: object) -> Callable[..., object]:
    """The function an import string ``"module:attribute"`` names (the attribute may be dotted), else ConfigError."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(field, "must be an import string 'module:attribute'", spec)
    module, _, attr = spec.partition(":")
    try:
        target = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(field, f"cannot import it ({exc})", spec) from None
    if not callable(target):
        raise ConfigError(field, "does not name a function", spec)
    return target


def header_name(field: str, name: object) -> str:
    """``name`` stripped and lower-cased if it is an HTTP field name (letters, digits and !#$%&'*+-.^_`|~), else
    ConfigError: what ``"header:<name>"`` keys read."""
    stripped = name.strip().lower() if isinstance(name, str) else ""
    if not stripped or not all(c in _TCHAR for c in stripped):
        raise ConfigError(field, "'header:<name>' needs a header name (letters, digits and !#$%&'*+-.^_`|~)", name)
    return stripped


def reading(field: str, clock: object) -> float:
    """Call ``clock`` once (a function ``() -> seconds``) and return its reading, a finite number; else ConfigError."""
    function(field, clock, kind="a function () -> seconds")
    try:
        value = clock()  # type: ignore[operator]
    except Exception as exc:
        raise ConfigError(field, f"failed when read: {exc!r}") from exc
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(field, "must return seconds (a finite number)", value)
    return float(value)


def async_function(field: str, value: object) -> Callable[[float], Awaitable[None]]:
    """``value`` if it is an async function of one argument (seconds), else ConfigError."""
    call = value if inspect.isfunction(value) or inspect.ismethod(value) else getattr(value, "__call__", None)  # noqa: B004
    if not (inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(call)):
        raise ConfigError(field, "must be an async function of seconds, such as anyio.sleep", value)
    return function(field, value, 0.0, kind="an async function of seconds")  # type: ignore[return-value]


def instance(field: str, value: object, kind: type[T]) -> T:
    """``value`` if it is a ``kind``, a default ``kind()`` if it is None, else ConfigError."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ConfigError(field, f"must be an admitgate.{kind.__name__} (or None)", value)
    return value
