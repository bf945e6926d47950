"""The seam between the gate and a budget shared with other replicas: what the gate calls, and nothing more.

The gate never imports a backend: :class:`~admitgate.backends.shared.RedisBudget` implements this protocol,
attaches itself to a gate and sets the gate's pacer from its leases (:meth:`TokenPacer.set_grant`).
"""

from __future__ import annotations

from typing import Protocol


class Budget(Protocol):
    """A shared budget, as the gate sees it on each refresh."""

    #: This replica's own capacity estimate, requests/s, which the gate publishes to the fleet (None: not yet).
    local_rate: float | None
    #: The fleet's capacity μ, requests/s: its configured rate or the sum of the replicas' (None: not yet).
    fleet_rate: float | None

    def headroom(self, backlog: float) -> float | None:
        """This replica's share of the fleet's shed rate H, requests/s, for a retry schedule ``backlog`` tokens
        long now; None while the fleet's figures are unknown (the replica's own H applies then)."""
        ...

    def unsettled(self, backlog: float) -> bool:
        """Whether the fleet's backlog is still landing: places this replica holds (``backlog``) or the others' that
        the leases have not yet published. A new place is told once they have (see :meth:`Gate._unheard`)."""
        ...

    def overdue(self, now: float) -> None:
        """Called at each refresh of the gate (seconds, the gate's clock): a budget whose next lease is late may
        adjust the pacer meanwhile."""
        ...
