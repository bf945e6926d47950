"""The window planner: the minimum safe jitter window for a cohort of retries, from Poisson tail bounds."""
