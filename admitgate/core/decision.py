"""What a decider decides, and the seam the shell (and the simulator) call it through.

A :class:`Decider` is what the middleware holds: one :class:`~admitgate.core.gate.Gate`, or a tenants' table
(:class:`~admitgate.core.tenants.Tenants`) that decides each request in its tenant's pool. Either way the shell
names the request's tenant once (None without tenants) and calls these four methods, never branching on which it
holds. Times in seconds, rates in requests/s, costs in tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sized
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Protocol

from .pacer import TokenPacer
from .priority import Priority
from .schedule import Place

#: Pacing-hold histogram bounds, seconds.
PACING_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0)

#: Who a client is: called only when the answer matters (see :meth:`Decider.admit`).
Identify = Callable[[], "Hashable | None"]


class ClientKey(str):
    """A client's key (the string) and the ``source`` it comes from: an address prefix, say, which is not part of
    who the client is (equal keys are one client wherever it comes from) but bounds the places one source may hold
    ahead of others (see :meth:`~admitgate.core.schedule.Schedule.take`)."""

    source: Hashable | None
    #: whether its client may come back known by another key, a place of its kind held for it (see
    #: :class:`~admitgate.core.strays.Strays`)
    lapses: ClassVar[bool] = False

    def __new__(cls, key: str, source: Hashable | None = None) -> ClientKey:
        made = super().__new__(cls, key)
        made.source = source
        return made


class Stranger(ClientKey):
    """A key that ties its request to no client: an id made up for it (a retry ticket's cookie may carry it back).
    Its client, back without that cookie, is a new request again (see :class:`~admitgate.core.newrate.NewRate`)."""

    lapses = True


class ConnectionKey(ClientKey):
    """A key that is its client's connection: a client told to wait longer than the server keeps an idle connection
    comes back on a new one, known by another key (and, keeping no cookie, by no ticket)."""

    lapses = True


class Verdict(Enum):
    ADMIT = "admitted"
    PACE = "paced"
    REJECT = "rejected"


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gate decided for one request. Times in seconds; rates in requests/s.

    ``delay``: PACE, hold the request this long, then call its decider's ``end_hold``; REJECT, hold the
    429 this long first (the tarpit; 0 for most), then call ``end_hold``.
    ``retry_after``: REJECT, whole seconds to send (>= 1). ``rate``: H, for the rate-limit fields.
    ``key``: the client key the decision was taken for (the ticket to set on a 429), if known.
    """

    verdict: Verdict
    delay: float = 0.0
    retry_after: int = 0
    rate: float = 0.0
    key: Hashable | None = None
    cost: float = 0.0
    reserve: float = 0.0  # the fraction of a bucket's burst its class must leave (its own bucket's, and the replica's)
    place: Place | None = None  # PACE: the place in the schedule a returning client is held for, or
    token: float | None = None  # PACE: the reserved token's place on the pacer's refill axis
    epoch: int = 0  # PACE: the pacer's epoch the token was reserved in
    since: float = 0.0  # PACE: when the hold began
    until: float = 0.0  # PACE: when the wait it was given ends (its wake-ups before then only bring it in sooner)
    pool: Decider | None = None  # the tenant's gate that decided it (admitgate.core.tenants), which ends its holds
    #: PACE: its own token came due while the replica's bucket (Parent.bucket) was short: its token's place there,
    #: reserved then (in once it is due at the rate in force, with room in flight, within its window; else given up)
    guard: float | None = None
    #: PACE: it waits for room in flight for at most ``delay`` s: whoever holds it ends the hold sooner when its
    #: decider says room may have come (see :meth:`Decider.wait_room`)
    room: bool = False
    #: PACE: a new place held while a herd lands on the fleet (see Gate._unheard): it waits for at most ``delay`` s,
    #: and whoever holds it ends the hold sooner when its decider says the fleet's backlog has landed
    #: (see :meth:`Decider.wait_landing`)
    landing: bool = False


ADMITTED = Decision(Verdict.ADMIT)


@dataclass(slots=True)
class Pacing:
    """Pacing holds that began, per PACING_BOUNDS bound as planned (then +Inf; not cumulative), and their
    planned total in seconds. Its own object so that several gates (a tenant's each) can count into one."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(PACING_BOUNDS) + 1))
    seconds: float = 0.0


@dataclass(slots=True)
class GateStats:
    """The gate's counters (requests; the one place that counts them, and what metrics export). Admissions
    at once from the bucket are counted by the pacer (``pacer.taken``)."""

    critical: int = 0  # critical requests (never shed; charged first)
    contended: int = 0  # requests that found no free token (then paced, scheduled or rejected)
    returning: int = 0  # requests from clients holding a place in the schedule
    pacing: Pacing = field(default_factory=Pacing)  # holds (a reserved token, or a client waiting for its place)
    scheduled: int = 0  # returning clients admitted at their place
    rejected: int = 0
    early: int = 0  # rejections of clients back before the time they were told (they ignore Retry-After)
    abandoned: int = 0  # paced requests whose client went away
    overflow: int = 0  # rejections whose place lay beyond max_retry_after (told a folded value within it)
    spare: int = 0  # in a tenants' pool: admissions on the replica's bucket alone, what the pools left unused

    @property
    def paced(self) -> int:
        """Pacing holds that began."""
        return sum(self.pacing.counts)


class Decider(Protocol):
    """What decides a request: a gate, or a tenants' table over the pools of one. ``tenant``: the request's
    tenant name as the shell read it (None: no tenant name, or no tenants)."""

    def try_take(self, cost: float, now: float, tenant: str | None = None) -> bool:
        """The admit path: True if the request goes in at once (a token free, nobody holding a place, nothing
        due), having taken its token; False, having changed nothing :meth:`admit` would not, for anything else."""
        ...

    def admit(self, cost: float, priority: Priority, now: float, identify: Identify,
              tenant: str | None = None) -> Decision:  # fmt: skip
        """Decide one request of ``cost`` tokens in class ``priority``. ``identify()`` returns the client's key
        (or None); it is called only when someone holds a place or the request is not admitted at once."""
        ...

    def end_hold(self, decision: Decision, now: float, gone: bool = False) -> Decision | None:
        """A hold is over at ``now``: what next (None: the client went away while held, ``gone``)."""
        ...

    def limit_of(self, tenant: str | None, now: float) -> tuple[TokenPacer, float]:
        """The bucket an admitted response's rate-limit fields show, and the limit they state (requests/s)."""
        ...

    def wait_room(self, wake: Callable[[], bool]) -> None:
        """Call ``wake`` when room in flight may have come, for a hold of :attr:`Decision.room` (the newest first);
        ``wake`` returns False if its hold is over already, and the room goes to the next."""
        ...

    def room_freed(self) -> None:
        """Room in flight may have come (a response began or ended): wake as many holds waiting for it as fit."""
        ...

    def wait_landing(self, wake: Callable[[], bool], position: float) -> None:
        """Call ``wake`` when a herd's places have landed on the fleet, or the place at ``position`` is due, for a
        hold of :attr:`Decision.landing`."""
        ...

    @property
    def waiting_for_room(self) -> Sized:
        """The holds waiting for room in flight (falsy when none: the shell calls :meth:`room_freed` only then)."""
        ...
