"""One quota count for the fleet: GCRA in Redis, one key per quota key holding its TAT.

Every replica runs one Lua script (``quota.lua``, package data beside this module) per quota-limited
request: it reads the key's theoretical arrival time, decides as :class:`~admitgate.core.quota.QuotaLimiter`
does with Redis ``TIME`` as the one clock, and stores the new TAT with a ``PEXPIRE`` at the moment the key
would be fresh again, so Redis holds one short string per active key and nothing for idle ones.

A Redis error or a call slower than ``timeout`` never fails the request: the replica decides on its own
:class:`~admitgate.core.quota.QuotaLimiter` (each replica then allows up to N per W on its own), logs the
change once, and tries Redis again after ``cooldown`` seconds, so a dead Redis does not cost every
request a timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Hashable
from importlib import resources
from typing import Any

from ..core.clock import Clock
from ..core.quota import Answer, QuotaLimiter

log = logging.getLogger("admitgate")

#: The quota script (``quota.lua``, shipped beside this module as package data).
QUOTA = (resources.files(__package__) / "quota.lua").read_text(encoding="utf-8")


class RedisQuota:
    """The fleet's quota: ``await check(key)`` is the :class:`~admitgate.core.quota.Answer` for ``key`` (a wait
    of 0.0: allowed and counted).

    ``client``: a redis-py asyncio client (the shared budget's). ``local``: the fallback limiter (also the
    rate and clock). ``prefix``: the Redis key prefix (replicas with the same prefix share the counts).
    ``timeout``: seconds per call. ``cooldown``: seconds on the fallback before Redis is tried again.
    """

    def __init__(self, client: Any, local: QuotaLimiter, clock: Clock, *, prefix: str = "admitgate:quota",
                 timeout: float = 0.25, cooldown: float = 0.5) -> None:  # fmt: skip
        self.client = client
        self.local = local
        self.clock = clock
        self.prefix = prefix
        self.timeout = timeout
        self.cooldown = cooldown
        self.args = [repr(local.rate.interval), repr(local.rate.tolerance)]
        self._script = client.register_script(QUOTA)
        self.degraded = False
        self.errors = 0
        self._retry_at = 0.0

    def redis_key(self, key: Hashable) -> str:
        """The Redis key of quota key ``key``: a digest, so a client's header bytes never shape a Redis key."""
        digest = hashlib.blake2b(repr(key).encode("utf-8", "backslashreplace"), digest_size=16).hexdigest()
        return f"{self.prefix}:{digest}"

    async def check(self, key: Hashable) -> Answer:
        now = self.clock()
        if self.degraded and now < self._retry_at:
            return self.local.check(key)
        try:
            reply = await asyncio.wait_for(self._script(keys=[self.redis_key(key)], args=self.args), self.timeout)
            wait, backlog = (float(part) for part in reply.split())
        except Exception as exc:  # timeouts, connection errors, a NOSCRIPT that could not be fixed, ...
            self.errors += 1
            if not self.degraded:
                log.warning("admitgate: quota backend failing (%s); each replica counts its own quota",
                            type(exc).__name__)  # fmt: skip
            self.degraded, self._retry_at = True, now + self.cooldown
            return self.local.check(key)
        if self.degraded:
            log.warning("admitgate: quota backend is back; the quota is the fleet's again")
            self.degraded = False
        return Answer(wait, backlog)
