"""admitgate: admission control that paces bursts and spreads rejected herds.

    from admitgate import AdmitGate, Settings
    app.add_middleware(AdmitGate, rate=200, settings=Settings(burst=20))

These names are what an application writes; the machinery behind them (the gate, its pacer and
schedule, routing, tickets) is importable from its own module for advanced use and tests.

Each name is imported when first used (PEP 562), so ``import admitgate.core`` loads the framework-free
core alone: no Starlette, Redis or Prometheus client until a name that needs them is asked for.
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .asgi.headers import HeaderPolicy
    from .asgi.identity import Identity
    from .asgi.middleware import AdmitGate
    from .asgi.quota import Quota, limited
    from .backends.shared import RedisBudget
    from .config import load
    from .core.clock import ManualClock
    from .core.errors import ConfigError
    from .core.priority import Priority
    from .core.settings import Settings
    from .core.tenants.policy import Tenancy
    from .limit.aimd import AIMD
    from .limit.bdp import BandwidthDelay
    from .limit.capacity import LiveCapacity
    from .limit.delay import QueueDelay
    from .limit.gradient import Gradient
    from .limit.static import Static
    from .metrics import metrics_app

try:
    __version__ = version("admitgate")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

#: Public name -> the module that defines it.
_HOMES = {
    "AIMD": "limit.aimd",
    "AdmitGate": "asgi.middleware",
    "BandwidthDelay": "limit.bdp",
    "QueueDelay": "limit.delay",
    "ConfigError": "core.errors",
    "Gradient": "limit.gradient",
    "HeaderPolicy": "asgi.headers",
    "Identity": "asgi.identity",
    "LiveCapacity": "limit.capacity",
    "ManualClock": "core.clock",
    "Priority": "core.priority",
    "Quota": "asgi.quota",
    "RedisBudget": "backends.shared",
    "Settings": "core.settings",
    "Static": "limit.static",
    "Tenancy": "core.tenants.policy",
    "limited": "asgi.quota",
    "load": "config",
    "metrics_app": "metrics",
}


#: Names of 0.1.0 -> their names now ("headroom" is H = μ − λ_new alone; what learns μ is a capacity).
_RENAMED = {"LiveHeadroom": "LiveCapacity"}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use and keep it in the package's namespace."""
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"admitgate.{name} is now admitgate.{new}", DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'admitgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "AIMD",
    "AdmitGate",
    "BandwidthDelay",
    "ConfigError",
    "Gradient",
    "HeaderPolicy",
    "Identity",
    "LiveCapacity",
    "ManualClock",
    "Priority",
    "QueueDelay",
    "Quota",
    "RedisBudget",
    "Settings",
    "Static",
    "Tenancy",
    "__version__",
    "limited",
    "load",
    "metrics_app",
]
