"""A pool's share of its replica's capacity: the rate source its gate reads (:class:`Share`), and how a cut between
reallocations is split among the pools (:class:`Split`)."""

from __future__ import annotations

import math

from ..gate import Gate
from ..probes import Probes
from ..source import RateReading


class Share:
    """A pool's rate source (a :class:`~admitgate.core.source.RateSource` its gate reads): ``value``, its share
    of the capacity ``basis`` (both requests/s, as of the last reallocation), which its pacer refills at scaled
    by what the ``root``'s rate is now over ``basis``; the ``capacity`` its Retry-After is told at (see
    :meth:`Pool.set_share`), its ``entitlement`` (its weighted share among the tenants asking: the ``q`` its
    rate-limit fields show), and ``whole``: how many times the replica's share the fleet's H is, with a shared
    budget (1 without), so that in an outage the pool expects back its part of the fleet's H (see
    :attr:`Gate.whole`).

    A live estimator's start-up doubles μ in a second: pools that followed it only at each reallocation held
    admissions below the rate it was testing, so it grew on (to 1.5 times the capacity in the simulator's
    tenant herd) and then drained the queue it had built. With a shared budget the root's rate is its lease,
    which moves with every grant (10/s between herds): there the pools keep their shares until the next
    reallocation (followed, the fleet's tenant herd drained at 1.17-1.19 where it drains at 1.13-1.14).

    A cut follows max-min fairness, not the proportion: it comes out of the pools the last reallocation could not
    give all they asked (``kept`` False), and a pool given all it asked keeps its rate while those pools, per weight,
    are still left more than it has (see :class:`Split`). Cut in proportion, a small tenant beside a herd's was cut
    below what it asked at each of the estimator's re-measurements (¾ of μ for a few tenths of a second) and drains,
    its paced requests outran their window, and one was turned away."""

    __slots__ = ("basis", "capacity", "entitlement", "growth", "kept", "root", "split", "value", "whole")

    def __init__(self, value: float, capacity: float, growth: float, root: Gate, basis: float,
                 split: Split | None = None) -> None:  # fmt: skip
        self.value, self.capacity, self.entitlement, self.growth = value, capacity, capacity, growth
        self.root, self.basis = root, basis
        self.whole = 1.0
        self.split = split
        self.kept = False  #: the last reallocation gave it all it asked

    def rate(self, now: float) -> float:
        return self.value * self.scale

    def read(self, now: float) -> RateReading:
        """Its pool's reading: its rate now; in an outage when the root is (see :attr:`Gate.collapsed`: a pool's share
        cut as other tenants wake is none, but its low H is waited out at its peak as an outage's is, since the share
        comes back as they drain)."""
        return RateReading(self.value * self.scale, self.capacity, self.growth, self.root.collapsed, self.whole)

    def state(self) -> None:
        return None

    @property
    def probes(self) -> Probes | None:
        """The root's: one service (a pool that paces or rejects tells the estimator so)."""
        return self.root.probes

    @property
    def scale(self) -> float:
        """What turns a share into requests/s now (1 with a shared budget): the root's rate now over ``basis``, but
        for a cut, which comes out of the pools not ``kept`` first (see :class:`Split`)."""
        root = self.root
        if self.basis <= 0 or root.backend is not None:
            return 1.0
        ratio = root.pacer.rate / self.basis
        split = self.split
        if ratio >= 1.0 or split is None or split.rest <= 0 or split.held <= 0:
            return ratio
        left = 1.0 - (split.held + split.rest) * (1.0 - ratio) / split.rest  # what the others keep of theirs
        if not left > 0 or left * split.low < split.high:  # less per weight than a kept pool has: in proportion
            return ratio
        return 1.0 if self.kept else left

    def unkeep(self, weight: float) -> None:
        """Count it (of ``weight``) among the pools a cut comes out of (see :class:`Split`)."""
        split = self.split
        if self.kept and split is not None:
            split.held -= self.value
            split.rest += self.value
            split.low = min(split.low, self.value / weight)
        self.kept = False


class Split:
    """The pools' shares as the last reallocation gave them, requests/s in the shares' units: ``held`` in the pools
    given all they asked (:attr:`Share.kept`), ``rest`` in the others; ``high``, the most a kept pool was given per
    weight, and ``low``, the least any other was. Between reallocations the pools' rates sum to the root's rate
    (their sum scaled by it) as before, but a cut comes out of ``rest``: the kept pools keep theirs while the
    others are left at least ``high`` per weight (max-min fairness's water level, which a cut lowers, stays above
    them), and below that all are cut in proportion. ``held`` and ``rest`` follow each share set between
    reallocations (:meth:`Pool.set_share`); whatever they miss (a pool dropped from the table) the replica's bucket
    (:attr:`Parent.bucket`) bounds, as every pool's admissions are charged there too."""

    __slots__ = ("held", "high", "low", "rest")

    def __init__(self) -> None:
        self.held = self.rest = self.high = 0.0
        self.low = math.inf
