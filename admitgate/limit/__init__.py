"""Capacity: the probes that sample completions, the estimators (BDP, gradient, AIMD, static) and the
headroom that turns what they say into the gate's rate.
"""
