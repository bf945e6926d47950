"""The window planner: which rate and burst keep a herd's retries inside a window (Poisson bounds)."""
