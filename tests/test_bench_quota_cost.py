"""A smoke run of bench/quota_cost.py: every variant answers its requests, in memory and with Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_quota_cost_smoke() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "quota_cost.py"), "--rounds", "1", "--requests", "64",
                           "--keys", "8", "--in-flight", "1", "8", "--json"],
                          capture_output=True, text=True, check=True, timeout=300)  # fmt: skip
    runs = json.loads(done.stdout)
    assert [run["in_flight"] for run in runs] == [1, 8]
    for run in runs:
        assert set(run["us_per_request_median"]) == {
            "bare", "admitgate-gate", "admitgate", "admitgate-limited", "slowapi", "fastapi-limiter",
            "admitgate-gate+redis", "admitgate+redis", "admitgate-limited+redis", "slowapi+redis",
            "fastapi-limiter+redis"}  # fmt: skip
        assert all(us > 0 for us in run["us_per_request_median"].values())
        assert set(run["admitgate_quota_path_us_median"]) == {"", "+redis", "-limited", "-limited+redis"}
