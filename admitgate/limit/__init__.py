"""Capacity: the probes that sample completions, the estimators (BDP, gradient, AIMD, static) and the
capacity source (:class:`~admitgate.limit.capacity.LiveCapacity`) that turns what they say into the gate's rate.
"""
