import json
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from admitgate import ConfigError
from admitgate.cli import main
from admitgate.planning.planner import drain_time, plan, prevent


def test_the_manuals_worked_numbers() -> None:
    p = plan(50_000, 2_000, service_time=0.2, connections=400, eps=None)
    assert {b.name: b.seconds for b in p.bounds} == {"rate": 25.0, "concurrency": 25.0}
    assert p.window == 25.0 and p.expected_wait == 12.5 and p.p95_wait == pytest.approx(23.75)


def test_the_one_percent_bound_adds_about_five_percent_not_ten() -> None:
    p = plan(50_000, 2_000, eps=0.01)
    assert p.binding == "probabilistic"
    assert p.window / 25.0 == pytest.approx(1.0535, abs=0.001)
    normal = 50_000 / p.normal_safe_rate
    assert normal / 25.0 == pytest.approx(1.0531, abs=0.001)


def test_retry_after_offsets_the_window_and_tightens_upper_bounds() -> None:
    p = plan(1000, 100, eps=None, retry_after=5, deadline=20, sla_p95=16)
    bounds = {b.name: b.seconds for b in p.bounds}
    assert bounds["deadline"] == 15.0 and bounds["sla-p95"] == pytest.approx(11 / 0.95)
    assert p.window == 10.0 and p.expected_wait == 10.0 and p.p95_wait == 14.5


def test_server_rate_limit() -> None:
    p = plan(600, 100, eps=None, remaining=60, reset=2)  # admits min(100, 30)/s
    assert p.binding == "rate-limit" and p.window == 20.0


def test_infeasible_plans_say_what_collides_and_what_would_fix_it() -> None:
    p = plan(50_000, 2_000, eps=None, deadline=20)
    assert not p.feasible and p.window is None
    assert p.conflict == "rate needs W >= 25.000 s but deadline allows W <= 20.000 s"
    assert p.remedies[0] == "raise headroom to H >= 2500.0/s (+25.0 %)"
    assert "D >= 25.000" in p.remedies[1]
    q = plan(50_000, 2_000, eps=0.01, sla_p95=19)
    assert q.binding is None and "probabilistic" in q.conflict and "raise headroom" in q.remedies[0]


def test_economic_optimum_is_clamped() -> None:
    free = plan(100, 100, eps=None, cost_capacity=50, cost_wait=1)  # W* = 10 s
    assert free.optimum.unconstrained == 10.0 and free.window == 10.0 and free.binding == "economic"
    assert free.optimum.capacity_cost == 500.0 and free.optimum.wait_cost == 500.0
    clamped = plan(100, 100, eps=None, cost_capacity=50, cost_wait=1, deadline=4)
    assert clamped.window == 4.0 and clamped.binding == "deadline"


def test_prevention_and_recovery_modes() -> None:
    assert prevent(1000, 100, 60).full_jitter_safe
    unsafe = prevent(10_000, 100, 60)
    assert not unsafe.full_jitter_safe and unsafe.window > 100
    assert drain_time(1000, [(0, 100)]) == 10.0
    assert drain_time(1500, [(0, 0), (10, 200)]) == pytest.approx(12.5)
    assert drain_time(500, [(0, 0), (10, 200)]) == pytest.approx(math.sqrt(50))  # 10·t²/2 = 500


@pytest.mark.parametrize(("kwargs", "field"), [({"clients": 0}, "clients"), ({"clients": -3}, "clients"),
                                               ({"headroom": 0}, "headroom"), ({"headroom": -1}, "headroom"),
                                               ({"eps": 0}, "eps"), ({"eps": 1}, "eps"),
                                               ({"service_time": 0.2}, "connections")])  # fmt: skip
def test_bad_input_names_the_argument(kwargs, field) -> None:
    args = {"clients": 100, "headroom": 10.0, **kwargs}
    with pytest.raises(ConfigError) as info:
        plan(args.pop("clients"), args.pop("headroom"), **args)
    assert info.value.field == field


def test_cli(capsys) -> None:
    assert main(["plan", "-M", "50000", "-H", "2000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["binding"] == "probabilistic"
    assert main(["plan", "-M", "50000", "-H", "2000", "--deadline", "20"]) == 1
    assert "INFEASIBLE" in capsys.readouterr().out
    assert main(["plan", "-M", "0", "-H", "2000"]) == 2
    assert "invalid --clients" in capsys.readouterr().err
    assert main(["plan", "-M", "5", "-H", "2", "--eps", "2"]) == 2
    assert "invalid --eps" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("ramp", "expected"),
    [
        # Steps down at 2 s. 0–2 s at 180/s serves 360; the other 1,640 at 80/s take 20.5 s: 2 + 20.5 = 22.5 s.
        # (Sorting on (t, H) put (2, 80) first and drained at 180/s from a linear 180 -> 80 start: 11.667 s.)
        ([(0, 180), (2, 180), (2, 80)], 22.5),
        # An outage from 0 to 10 s, then 180/s: nothing is served before 10 s, 2,000/180 = 11.111 s after it:
        # 21.111 s. (The (t, H) sort read it as a ramp 180 -> 0 over 0–10 s, 900 served: 16.111 s.)
        ([(0, 180), (0, 0), (10, 0), (10, 180)], 10 + 2000 / 180),
        # Down and up again: 0–5 s at 200/s serves 1,000; 5–20 s at 50/s serves 750; the last 250 at 200/s
        # take 1.25 s: 21.25 s.
        ([(0, 200), (5, 200), (5, 50), (20, 50), (20, 200)], 21.25),
        # The same steps given out of time order: only time orders them, equal times keep their order.
        ([(20, 50), (0, 200), (5, 200), (5, 50), (20, 200)], 21.25),
    ],
)  # fmt: skip
def test_drain_time_steps_down_in_the_order_given(ramp, expected) -> None:
    assert drain_time(2000, ramp) == pytest.approx(expected)


def test_cli_ramp_keeps_the_order_given(capsys) -> None:
    assert main(["plan", "-M", "2000", "-H", "180", "--eps", "off", "--ramp", "0:180,2:180,2:80", "--json"]) == 0
    recovery = json.loads(capsys.readouterr().out)["recovery"]
    assert recovery["ramp"] == [[0, 180], [2, 180], [2, 80]] and recovery["drain_s"] == pytest.approx(22.5)


def test_drain_time_rejects_malformed_points() -> None:
    with pytest.raises(ConfigError, match="ramp"):
        drain_time(100, [(0, 100, 5)])
    with pytest.raises(ConfigError, match="ramp"):
        drain_time(100, [(0, float("nan"))])


ANY_NUMBER = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**13))


@settings(max_examples=300, deadline=None)
@given(clients=st.integers(-5, 10**13), headroom=st.floats(allow_nan=True, allow_infinity=True), eps=st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True)), extra=st.dictionaries(st.sampled_from(
        ["service_time", "connections", "retry_after", "remaining", "reset", "deadline", "sla_p95", "cost_capacity",
         "cost_wait"]), ANY_NUMBER))  # fmt: skip
@example(clients=1, headroom=0.5, eps=2.4e-11, extra={})  # no arrival rate is that safe: infeasible, not 1/0
def test_plan_is_a_finite_answer_or_a_config_error(clients, headroom, eps, extra) -> None:
    extra = {k: v for k, v in extra.items() if v is not None}
    if "retry_after" not in extra:
        extra["retry_after"] = 0.0
    try:
        p = plan(clients, headroom, eps=eps, **extra)
    except ConfigError:
        return
    if p.feasible:
        assert math.isfinite(p.window) and 0 < p.window <= p.upper and p.window >= p.lower
        assert math.isfinite(p.expected_wait) and math.isfinite(p.p95_wait)
    else:
        assert p.window is None and p.conflict and p.remedies
