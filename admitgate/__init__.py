"""admitgate: admission control that paces bursts and spreads rejected herds.

from admitgate import AdmitGate
app.add_middleware(AdmitGate, rate=200)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .clock import Clock, ManualClock
from .errors import ConfigError
from .estimators import AIMD, BandwidthDelay, Estimator, Gradient, Static
from .gate import Decision, Gate, GateStats, Verdict
from .headers import HeaderPolicy
from .headroom import Headroom, LiveHeadroom, StaticHeadroom
from .identity import client_address, connection_key, header_key
from .middleware import AdmitGate
from .pacer import TokenPacer
from .probes import Probes
from .routing import Priority, Router, Rule
from .schedule import Schedule
from .ticket import RetryTicket

try:
    __version__ = version("admitgate")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "AIMD",
    "AdmitGate",
    "BandwidthDelay",
    "Clock",
    "ConfigError",
    "Decision",
    "Estimator",
    "Gate",
    "GateStats",
    "Gradient",
    "HeaderPolicy",
    "Headroom",
    "LiveHeadroom",
    "ManualClock",
    "Priority",
    "Probes",
    "RetryTicket",
    "Router",
    "Rule",
    "Schedule",
    "Static",
    "StaticHeadroom",
    "TokenPacer",
    "Verdict",
    "__version__",
    "client_address",
    "connection_key",
    "header_key",
]
