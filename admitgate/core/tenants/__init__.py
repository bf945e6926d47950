"""Fair share among tenants, keyed by a tenant's name: the policy, the pools, the reallocation and the table.

* :mod:`~admitgate.core.tenants.policy`: :class:`Tenancy`, who the tenants are and their weights;
* :mod:`~admitgate.core.tenants.tuning`: :class:`~admitgate.core.tenants.tuning.FairTuning`, the rules' constants;
* :mod:`~admitgate.core.tenants.share`: a pool's share of the replica's μ, the rate source of its gate;
* :mod:`~admitgate.core.tenants.pool`: a pool (its gate and demand meter), and a key not established yet;
* :mod:`~admitgate.core.tenants.state`: what the table keeps, and the rules its parts share;
* :mod:`~admitgate.core.tenants.reallocation`: measure, allocate, apply, open or close, every interval;
* :mod:`~admitgate.core.tenants.waking`: a pool waking between reallocations;
* :mod:`~admitgate.core.tenants.table`: :class:`Tenants`, the decider over the pools.
"""

from .policy import Tenancy
from .table import Tenants

__all__ = ["Tenancy", "Tenants"]
