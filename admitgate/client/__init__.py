"""The client the gate is designed for: httpx transports that retry when the server says (the ``client`` extra).

    import httpx
    from admitgate.client import AsyncRetryTransport, RetryPolicy

The transports live in :mod:`admitgate.client.transport`; the delays they wait are pure functions in
:mod:`admitgate.core.backoff`.
"""

from __future__ import annotations

from .transport import AsyncRetryTransport, RetryBudget, RetryPolicy, RetryStats, RetryTransport

__all__ = ["AsyncRetryTransport", "RetryBudget", "RetryPolicy", "RetryStats", "RetryTransport"]
