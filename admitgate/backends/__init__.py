"""Budgets shared between processes: the Redis lease (its Lua script ships as ``lease.lua``)."""
