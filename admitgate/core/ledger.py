"""A gate's ties to the gates its capacity is divided among (a tenants' table's pools), kept apart from its own state.

* :class:`Ledger`: on the gate whose capacity is divided (the root), what the gates below it carry, kept by
  whoever divides it, so that a shared budget's lease and the root's refresh read them in O(1), however many pools.
* :class:`Parent`: on each gate below (a pool), the replica's bucket every pool's admissions are charged to, and
  what a request going in on that bucket alone leaves there.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pacer import TokenPacer


@dataclass(slots=True)
class Ledger:
    """What the gates below one carry. Requests, rates in requests/s, tokens, seconds.

    ``delegated``: requests decided below, taken at once or asked to reserve, so far (a shared budget leases for
    them as for the gate's own). ``held``: clients holding places in their schedules, and ``new``: their λ_new (a
    running count, made exact at each reallocation when a shared budget reads them). ``owed``: tokens they owe to
    requests held for them (their pacers' debt), as of the last reallocation, and ``owed_until``: when their
    refills will have repaid it (a shared budget counts it only until then).
    """

    delegated: int = 0
    held: int = 0
    new: float = 0.0
    owed: float = 0.0
    owed_until: float = 0.0


@dataclass(slots=True)
class Parent:
    """A pool's tie to its replica (one, shared by every pool of a table).

    ``bucket``: the replica's bucket (at μ, with the replica's burst), charged for every admission in every pool: a
    request whose own token is free while it is short reserves its token there and goes in when that is due. The
    pools' buckets, each at least a token, may hold more between them than the replica's burst. None with a shared
    budget, whose lease bounds the replica. ``keep``: the share of that bucket's burst a request going in on it
    alone (its own bucket short) leaves for the pools' own requests: ``GateTuning.spare``, or the largest class
    reserve in use if more. A pool's gate also gives the place of a hold that a small rate cut turns away to the
    next request held: there the rate moves with the shares, not because the capacity fell.
    """

    bucket: TokenPacer | None
    keep: float
