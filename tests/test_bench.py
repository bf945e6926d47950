"""A short smoke of each benchmark: they run end to end and report every figure (never a speed check)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
pytestmark = pytest.mark.integration


def run(*args: str, timeout: float = 300) -> dict:
    """A benchmark's ``--json`` report. It starts its own throwaway redis-server where it needs one, whatever
    ``REDIS_URL`` says: benchmarks name their keys alike, and two running at once would share a budget."""
    env = {name: value for name, value in os.environ.items() if name != "REDIS_URL"}
    out = subprocess.run([sys.executable, *args, "--json"], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_inprocess_smoke() -> None:
    result = run(str(BENCH / "inprocess.py"), "--rounds", "1", "--requests", "2000")
    assert set(result["us_per_request_median"]) >= {"trivial", "passthrough", "admitgate", "starlette"}
    assert result["pacer_decision_ns_median"] > 0


def test_overhead_smoke_with_wrk() -> None:
    result = run(str(BENCH / "overhead.py"), "--rounds", "1", "--duration", "1", "--variants", "bare,admitgate,slowapi")
    assert set(result["ratio_to_bare_median"]) == {"bare", "admitgate", "slowapi"}
    assert all(v > 0 for v in result["req_per_s_median"].values())


def test_overhead_instructions_smoke_with_callgrind() -> None:
    """Each variant served alone under callgrind, its instructions counted while wrk runs, the gate's clock slowed."""
    # (two seconds: under callgrind, on a loaded machine, a server 35 times slower once served none in one)
    result = run(str(BENCH / "overhead.py"), "--instructions", "--variants", "bare,admitgate_tenants_closed",
                 "--duration", "2")  # fmt: skip
    counts = result["instructions_per_request"]
    assert set(counts) == {"bare", "admitgate_tenants_closed"}
    # (how many the gate adds is the benchmark's figure: over a run of a second the count per request moves with
    # how many requests the loaded machine served under callgrind, by more than the gate's part; 204,040 against
    # bare's 205,735 once)
    assert counts["admitgate_tenants_closed"] > 0 and counts["bare"] > 0
    ratio = result["instruction_ratio_to_bare"]["admitgate_tenants_closed"]  # bare's count over the variant's
    assert result["slowdown"] > 1 and ratio == round(counts["bare"] / counts["admitgate_tenants_closed"], 3)


def test_herd_smoke() -> None:
    result = run(str(BENCH / "herd.py"), "--clients", "400", "--rounds", "1", "--deadline", "40",
                 "--scenarios", "admitgate static rate=200,slowapi 200/s")  # fmt: skip
    gated = result["median"]["admitgate static rate=200"]
    assert gated["finished"] == 400 and gated["server_5xx"] == 0
    assert set(result["met"]["admitgate static rate=200"]) == {"drain_ratio", "edge_peak_to_avg", "server_5xx",
                                                               "new_served"}  # fmt: skip


def test_schedule_matrix_smoke(tmp_path) -> None:
    result = run(str(BENCH / "schedule.py"), "--seeds", "1", "--out", str(tmp_path / "schedule.json"))
    assert len(result["matrix"]) == 16 and [b["clients"] for b in result["big"]] == [20_000, 40_000, 100_000]
    assert all(b["server_5xx"] == 0 and b["crowd_ok"] for b in result["big"])


def test_estimator_trials_smoke(tmp_path) -> None:
    result = run(str(BENCH / "estimators.py"), "--seeds", "1", "--estimators", "static,bdp", "--phases", "0,1",
                 "--out", str(tmp_path / "estimators.json"))  # fmt: skip
    assert set(result) == {"static", "bdp"}
    assert set(result["bdp"]["seeds_passing"]) >= {"goodput", "p99", "cv", "recovery"}
    static = result["static"]
    assert static["phases"] == [0.0, 1.0] and set(static["within_5s"].values()) == {0.0}  # a static limit never moves
    assert all(len(runs) == 2 for runs in result["bdp"]["median"]["runs"].values())


def test_shared_budget_benchmark_smoke() -> None:
    result = run(str(BENCH / "shared.py"), "--rounds", "1", "--duration", "1")
    assert set(result["req_per_s_median"]) == {"bare", "admitgate", "admitgate_redis", "slowapi_asgi", "slowapi_redis"}
    trips = result["redis_round_trips_per_1000_decisions"]
    assert trips["slowapi_redis"] > 10 * trips["admitgate_redis"]


def test_estimator_live_smoke() -> None:
    result = run(str(BENCH / "estimator_live.py"), "--seconds", "8")
    assert {"before_step", "after_step", "estimates"} <= set(result)
    assert any("mu" in gauges for _, gauges in result["estimates"])  # the gate's estimate is on /metrics


def test_fleet_herd_smoke() -> None:
    result = run(str(BENCH / "fleet_herd.py"), "--clients", "400", "--rate", "200", "--rounds", "1")
    (one,) = result["this"]["runs"]
    assert math.isfinite(one["drain_ratio"])  # every client of the herd was served (unfinished, it is infinite)
    bound = 400 / (200 - 40)  # M / H: H is the rate less the new arrivals beside the herd
    assert one["retry_after_max"] >= 1 and one["retry_after_max_ratio"] == round(one["retry_after_max"] / bound, 3)


def test_fleet_rate_smoke() -> None:
    result = run(str(BENCH / "fleet_rate.py"), "--rounds", "1", "--seconds", "1")
    (one,) = result["runs"]
    assert one["statuses"]["200"] > 0 and result["other_statuses"] == 0  # admitted, and never a 5xx: no speed
    assert one["ratio"] == pytest.approx(one["admitted_per_s"] / 200, abs=1e-3)  # (of the fleet's 200/s)


def test_fairness_smoke() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "fairness.py"), "--seconds", "3", "--warmup", "1",
                          "--scenarios", "lone,weights,lone-slowapi"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["lone"]["admitted_per_s"]["alone"] > 0  # behaviour: the server ran and admitted; no speed
    assert len(result["weights"]["admitted_per_s"]) == 3
    slow = result["lone-slowapi"]  # slowapi holds the key to its limit: a sixth of 100/s, 16/s in windows of a second
    assert 0 < slow["admitted_per_s"]["alone"] <= 1.5 * 16


def test_fairness_closed_loop_smoke() -> None:
    """The worker pools' scenario beside the open-loop one, in one run: every tenant served, each rate also read
    as a share of its weighted share of H."""
    out = subprocess.run([sys.executable, str(BENCH / "fairness.py"), "--seconds", "3", "--warmup", "1",
                          "--scenarios", "abuse,workers-2"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    tenants = {"abuser", *(f"obedient-{i}" for i in range(5))}
    for scenario in ("abuse", "workers-2"):
        assert set(result[scenario]["admitted_per_s"]) == tenants, result[scenario]
        shares = result[scenario]["share_of_fair"]
        assert all(shares[t] == pytest.approx(6 * result[scenario]["share_of_H"][t], abs=2e-3) for t in tenants)


def test_quota_smoke() -> None:
    result = run(str(BENCH / "quota.py"), "--limit", "20/second", "--seconds", "2", "--rate", "200")
    assert result["other_statuses"] == 0 and result["burst_admitted"] >= 20  # the quota's whole burst (more: refilled)
    # four replicas, one count (20 a second, not 80), whatever the machine; how near 20 it comes is the benchmark's
    assert 0 < result["admitted_per_window"] <= 1.5 * 20


def test_tenant_keys_smoke(tmp_path) -> None:
    result = run(str(BENCH / "tenant_keys.py"), "--keys", "2000", "--run", "2", "--out", str(tmp_path / "k.json"))
    assert result["keys"] >= 2000 and result["server_5xx"] == 0 and result["rows"][-1]["rss_mb"] > 0


def test_light_tenants_smoke() -> None:
    result = run(str(BENCH / "light_tenants.py"), "--light", "5", "--seconds", "8", "--warmup", "3")
    assert set(result) == {"light5-tenants", "light5-one-pool"}
    for figures in result.values():
        assert figures["admitted_per_s"] <= 100.0 * (8 - 3 + 1) / (8 - 3)  # within rate·t + burst (a second's)
        assert 0 <= figures["light_first_try"] <= 1
        # the capacity used whole: the busy tenant has about its max-min share, 100/s less the light 5 × 0.5/s
        assert figures["busy_per_s"] + figures["light_per_s"] == pytest.approx(figures["admitted_per_s"], abs=0.1)
        assert figures["busy_per_s"] >= 0.95 * (100 - 5 * 0.5)


@pytest.mark.parametrize("gate", [(), ("--slowapi",)], ids=["admitgate", "slowapi"])
def test_tenant_herd_smoke(gate: tuple[str, ...]) -> None:
    result = run(str(BENCH / "tenant_herd.py"), "--clients", "200", "--rounds", "1", *gate)
    (one,) = result["runs"]
    assert one["herd_finished"] == 200 and one["small_requests"] > 0  # behaviour: both tenants were served
    if gate:
        assert one["gate"] == "slowapi 190/second per key"
    else:
        assert one["tenants_on"] is True and "gate" not in one


def test_the_matrix_goes_on_in_a_scheduler_autogroup_of_its_own_at_its_nice_value() -> None:
    """A process that does not lead a session forks; the child leads one, its autogroup at the process's nice
    value; the parent passes the child's exit status on."""
    code = ("import json, os, sys; sys.path.insert(0, 'bench'); from matrix_load import own_autogroup; "
            "done = own_autogroup(); print(json.dumps({'done': done, 'leads': os.getsid(0) == os.getpid(), "
            "'group': open('/proc/self/autogroup').read()})); sys.exit(3)")  # fmt: skip
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    out = subprocess.run(["nice", "-n", "5", sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=BENCH.parent)  # fmt: skip
    assert out.returncode == 3, out.stderr[-3000:]
    result = json.loads(out.stdout)
    if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
        assert result["done"] == {"autogroup": True, "nice": nice, "applied": True}
        assert result["leads"] and result["group"].endswith(f" nice {nice}\n")
    else:
        assert result["done"] == {"autogroup": False} and not result["leads"]


def test_matrix_smoke(tmp_path: Path) -> None:
    """One closed-loop cell, two ways side by side: every figure and its verdict, merged into the results file."""
    out = tmp_path / "matrix.json"
    result = run(str(BENCH / "matrix.py"), "--cells", "io-4x20-q1/closed32", "--ways", "typed,bare", "--rounds", "1",
                 "--out", str(out))  # fmt: skip
    cell = result["cells"]["io-4x20-q1/closed32"]
    assert set(cell["ways"]) == {"typed", "bare"} and cell["capacity"] == 200.0
    typed = cell["ways"]["typed"]
    assert typed["median"]["req_per_s"] > 0 and typed["median"]["req_ratio"] > 0
    assert set(typed["met"]) == {"req_ratio", "p50_ratio", "paced", "rejected", "non_2xx"}
    stored = json.loads(out.read_text())
    assert stored["cells"]["io-4x20-q1/closed32"]["ran"]["rounds"] == 1
    assert stored["cells"]["io-4x20-q1/closed32"]["ran"]["scheduler"] == result["scheduler"]


def test_ablation_smoke(tmp_path: Path) -> None:
    """One rule out on one cell: with no in-flight limit, the herd's onset into a dead service passes 5xx through."""
    result = run(str(BENCH / "ablation.py"), "--variants", "no-floor", "--seeds", "1", "--workers", "1",
                 "--cells", "io-20x100-q2/outage", "--out", str(tmp_path / "ablation.json"))  # fmt: skip
    base, bare = result["runs"]["base"][0]["io-20x100-q2/outage"], result["runs"]["no-floor"][0]["io-20x100-q2/outage"]
    assert bare["r5xx"] > base["r5xx"]
    assert set(result["compared"]) == {"base", "no-floor"}
    assert json.loads((tmp_path / "ablation.json").read_text())["seeds"] == 1


def test_proxy_herd_smoke_behind_nginx() -> None:
    result = run(str(BENCH / "proxy_herd.py"), "--clients", "40", "--identities", "40", "--deadline", "20",
                 "--honest-for", "8")  # fmt: skip
    assert set(result["herd"]) == {"direct", "nginx, typical lines", "nginx, port forwarded",
                                   "nginx, typical lines, 250 networks"}  # fmt: skip
    for name, m in result["herd"].items():
        assert m["finished"] == 40 and set(m["met"]) == set(result["herd_targets"]), (name, m)
        assert isinstance(m["service_503"], int) and isinstance(m["nginx_errors"], list), (name, m)
        assert sum(m["status_counts"].values()) >= 40, (name, m)
    assert all(m["honest_newcomers"] > 0 and "honest_wait_max_s" in m for m in result["flood"].values())
