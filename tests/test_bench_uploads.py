"""A short smoke of bench/uploads.py: it runs end to end and reports every figure (never a memory target)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "uploads.py"
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("variant", ["gate", "unread"])
def test_paced_uploads_smoke(variant: str) -> None:
    args = ["--uploads", "20", "--body-mib", "0.25", "--hold", "0.5", "--variant", variant, "--json"]
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["rss_idle_mib"] > 0 and result["rss_held_mib"] > 0
    assert result["held"] + result["completed"] == 20 and result["completed_bytes_ok"]
    assert result["admitgate"].startswith(str(BENCH.parent.parent))
