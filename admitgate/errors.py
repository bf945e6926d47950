"""Errors raised for bad configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid configuration, raised at construction (start-up), never per request.

    ``field`` names the offending setting so the message can be acted upon.
    """

    def __init__(self, field: str, problem: str, value: object = ...) -> None:
        self.field = field
        got = "" if value is ... else f" (got {value!r})"
        super().__init__(f"admitgate: invalid {field}: {problem}{got}")


def positive(field: str, value: float) -> float:
    """Return ``value`` as a float if it is a finite number > 0, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a number", value)
    if not value > 0 or value == float("inf"):
        raise ConfigError(field, "must be a finite number > 0", value)
    return float(value)


def non_negative(field: str, value: float) -> float:
    """Return ``value`` as a float if it is a finite number >= 0, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a number", value)
    if not value >= 0 or value == float("inf"):
        raise ConfigError(field, "must be a finite number >= 0", value)
    return float(value)


def integer(field: str, value: int, minimum: int) -> int:
    """Return ``value`` if it is an int (not a bool) >= ``minimum``, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, f"must be an integer >= {minimum}", value)
    return value
