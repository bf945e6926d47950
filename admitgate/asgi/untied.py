"""Requests the gate cannot tie to a client: counted, and said once, with what to configure.

A request is *untied* when nothing identifies it (see :mod:`admitgate.asgi.identity`): no valid retry ticket, and
the key gives none, as for a peer port of 0 (uvicorn's ``--proxy-headers`` write ``(address, 0)`` for a request
forwarded with X-Forwarded-For, which carries no port). Such a client is known only by the ticket cookie its 429
sets; one that keeps no cookies (urllib3's ``Retry``, curl, ``requests`` without a session) comes back as a
stranger, and its retry counts as a new arrival. The gate counts untied requests and the tickets it hands to them
and gets back, and logs one warning naming what to configure the first time either shows (a port of 0, or
:data:`UNRETURNED` such tickets handed out, the first expired, and none back).
"""

from __future__ import annotations

import logging

log = logging.getLogger("admitgate")

#: Tickets handed to untied clients, none of them back, before the gate says those clients keep no cookies.
UNRETURNED = 50

ADVICE = ("forward the client's port (nginx: proxy_set_header Forwarded "
          "\"for=\\\"$remote_addr:$remote_port\\\";conn=$connection\"; "
          "Identity(trusted_hops=1, forwarded=\"forwarded\")) or key clients by a header "
          "(Identity(key=\"header:<name>\")); see docs/deployment.md")  # fmt: skip


class Untied:
    """What the gate saw of clients it cannot tie to a request (counts since start; Unix seconds for tickets).

    ``requests``: untied requests (given a fresh id); ``portless``: those whose peer port was 0. ``issued``:
    tickets handed to untied clients; ``returned``: such tickets that came back valid.
    """

    __slots__ = ("_first_expiry", "issued", "lasting", "portless", "requests", "returned", "warned")

    def __init__(self) -> None:
        self.requests = self.portless = self.lasting = self.issued = self.returned = 0
        self._first_expiry: float | None = None
        self.warned = False

    def untied(self, port: int | None, closing: bool = False) -> None:
        """A request nothing identifies; ``port``: its peer's port (None: no peer, a Unix socket); ``closing``: it
        closes its connection (a one-shot client, whose ticket not coming back says nothing of cookies: such
        requests alone never make the gate warn)."""
        self.requests += 1
        self.lasting += not closing
        if port == 0:
            self.portless += 1
            if not self.warned:
                self._warn("requests arrive with a peer port of 0 (proxy headers without the client's port)")

    def ticket_issued(self, now_wall: float, expires_wall: float) -> None:
        """A ticket handed to an untied client at ``now_wall``, valid until ``expires_wall``."""
        self.issued += 1
        if self._first_expiry is None:
            self._first_expiry = expires_wall
        elif (not self.warned and not self.returned and self.lasting and self.issued >= UNRETURNED
              and now_wall >= self._first_expiry):  # fmt: skip
            self._warn(f"none of the {self.issued} retry tickets handed to clients nothing else identifies came back "
                       "(their clients keep no cookies)")  # fmt: skip

    def ticket_returned(self) -> None:
        """An untied client's ticket came back valid."""
        self.returned += 1

    def _warn(self, seen: str) -> None:
        self.warned = True
        log.warning("admitgate: %s: returning clients cannot be told from new ones, and their retries count as new "
                    "arrivals; %s", seen, ADVICE)  # fmt: skip

    @property
    def counts(self) -> tuple[int, int, int]:
        """``(requests, issued, returned)``: for metrics."""
        return self.requests, self.issued, self.returned
