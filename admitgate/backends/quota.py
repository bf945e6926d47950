"""One quota count for the fleet: GCRA in Redis, one key per quota window and key holding its TAT.

Every replica runs one Lua script (``quota.lua``, package data beside this module) per quota-limited
request (one per distinct key when a request's quotas count different keys): it reads the theoretical
arrival time of each window, decides as :func:`~admitgate.core.quota.check_cells` does with Redis ``TIME`` as
the one clock, and stores each new TAT with an expiry at the moment the window would be fresh again, so Redis
holds one short string per active key and window and nothing for idle ones. The windows of one key share a
hash tag (a digest of the key), so Redis Cluster keeps them on one slot and one script sees them all.

A Redis error or a call slower than ``timeout`` never fails the request: the replica decides on its own
limiters (each replica then allows up to N per W on its own) and logs the change once. While it does, no
request waits for Redis: every ``cooldown`` seconds a ``PING`` in the background (no request's) asks whether
Redis answers within ``timeout`` again, and the next requests count in Redis once it does. So a request waits
for Redis only while Redis answered the last call in time: one round trip, at most ``timeout`` (0.25 s), for
the requests already waiting when Redis turns slow or goes away. (The fleet's count is one ordered count, so a
request counted in it waits for it; the shared budget's tokens, leased ahead, need no such wait.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from importlib import resources
from typing import Any, NamedTuple

from ..core.clock import Clock
from ..core.quota import QuotaLimiter, Tally, check_cells

log = logging.getLogger("admitgate")

#: The quota script (``quota.lua``, shipped beside this module as package data).
QUOTA = (resources.files(__package__) / "quota.lua").read_text(encoding="utf-8")


class Cell(NamedTuple):
    """One window of one quota for one key: its local limiter (the fallback), the key, and in Redis its key,
    the hash tag it shares with the key's other windows, and the script's arguments (T and τ)."""

    limiter: QuotaLimiter
    key: Hashable
    redis_key: str
    tag: str
    args: tuple[str, str]


class RedisQuota:
    """The fleet's quotas: ``await check(cells)`` is the :class:`~admitgate.core.quota.Tally` of those windows.

    ``client``: a redis-py asyncio client (the shared budget's). ``timeout``: seconds per call. ``cooldown``:
    seconds on the local limiters before Redis is tried again.
    """

    def __init__(self, client: Any, clock: Clock, *, timeout: float = 0.25, cooldown: float = 0.5) -> None:
        self.client = client
        self.clock = clock
        self.timeout = timeout
        self.cooldown = cooldown
        self._script = client.register_script(QUOTA)
        self.degraded = False
        self.errors = 0
        self._retry_at = 0.0
        self._probe: asyncio.Task[None] | None = None  # the background PING while degraded

    async def check(self, cells: Sequence[Cell]) -> Tally:
        """The tally of ``cells`` in Redis, or on the local limiters while Redis fails (never an error)."""
        now = self.clock()
        if self.degraded:
            if now >= self._retry_at and (self._probe is None or self._probe.done()):
                self._retry_at = now + self.cooldown
                self._probe = asyncio.get_running_loop().create_task(self._ping(), name="admitgate-quota-probe")
            return check_cells([(cell.limiter, cell.key) for cell in cells], now)
        try:
            return await self._ask(cells)
        except Exception as exc:  # timeouts, connection errors, a NOSCRIPT that could not be fixed, ...
            self._fail(exc, now)
            return check_cells([(cell.limiter, cell.key) for cell in cells], now)

    def _fail(self, exc: BaseException, now: float) -> None:
        self.errors += 1
        if not self.degraded:
            log.warning("admitgate: quota backend failing (%s); each replica counts its own quota",
                        type(exc).__name__)  # fmt: skip
        self.degraded, self._retry_at = True, now + self.cooldown

    async def _ping(self) -> None:
        """Whether Redis answers within ``timeout`` again: if so, the next requests count in Redis."""
        try:
            await asyncio.wait_for(self.client.ping(), self.timeout)
        except Exception as exc:
            self._fail(exc, self.clock())
            return
        log.warning("admitgate: quota backend is back; the quota is the fleet's again")
        self.degraded = False

    async def _ask(self, cells: Sequence[Cell]) -> Tally:
        """One script call per hash tag (a request's windows of one key are one call, atomic)."""
        groups: dict[str, list[int]] = {}
        for i, cell in enumerate(cells):
            groups.setdefault(cell.tag, []).append(i)
        backlogs = [0.0] * len(cells)
        for indices in groups.values():
            keys = [cells[i].redis_key for i in indices]
            args = [arg for i in indices for arg in cells[i].args]
            parts = (await asyncio.wait_for(self._script(keys=keys, args=args), self.timeout)).split()
            wait = float(parts[0])
            if wait > 0:
                return Tally(wait, indices[int(parts[1]) - 1], ())
            for j, i in enumerate(indices):
                backlogs[i] = float(parts[j + 1])
        return Tally(0.0, -1, tuple(backlogs))
