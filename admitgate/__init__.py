"""admitgate: admission control that paces bursts and spreads rejected herds.

    from admitgate import AdmitGate, Settings
    app.add_middleware(AdmitGate, rate=200, settings=Settings(burst=20))

These names are what an application writes; the machinery behind them (the gate, its pacer and
schedule, routing, tickets) is importable from its own module for advanced use and tests.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .clock import ManualClock
from .config import load
from .errors import ConfigError
from .estimators import AIMD, BandwidthDelay, Gradient, Static
from .headers import HeaderPolicy
from .headroom import LiveHeadroom
from .identity import Identity
from .metrics import metrics_app
from .middleware import AdmitGate
from .routing import Priority
from .settings import Settings
from .shared import RedisBudget
from .tenants import Tenancy

try:
    __version__ = version("admitgate")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "AIMD",
    "AdmitGate",
    "BandwidthDelay",
    "ConfigError",
    "Gradient",
    "HeaderPolicy",
    "Identity",
    "LiveHeadroom",
    "ManualClock",
    "Priority",
    "RedisBudget",
    "Settings",
    "Static",
    "Tenancy",
    "__version__",
    "load",
    "metrics_app",
]
