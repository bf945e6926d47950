"""A short smoke of bench/hostile.py: it runs end to end and reports every figure (never a speed check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "hostile.py"
pytestmark = pytest.mark.integration


def test_hostile_headers_smoke_with_wrk() -> None:
    args = ["--rounds", "1", "--duration", "1", "--requests", "20", "--shapes", "fwd-semicolons", "--json"]
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    shapes = {"harmless-fwd", "fwd-semicolons"}  # the baseline of the same shape comes along
    for figures in ("inprocess_us_per_rejection", "server_cpu_us_per_429"):
        assert set(result[figures]) == shapes
        assert all(row["us"] > 0 and row["ratio"] > 0 for row in result[figures].values())
    served = result["server_cpu_us_per_429"]  # one round: the ratio is that round's, hostile over harmless
    assert served["fwd-semicolons"]["ratio"] == pytest.approx(
        served["fwd-semicolons"]["us"] / served["harmless-fwd"]["us"], rel=0.01, abs=0.01
    )
    assert set(result["bare_429_cpu_us"]) == set(result["gate_share_cpu_us"]) == shapes
