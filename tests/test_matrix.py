"""The scenario matrix's own arithmetic on synthetic records (lab/matrix_cells.py): no server, no clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from urllib3.util.retry import Retry

from admitgate.sim.summary import Attempt, HerdResult
from lab.herd import urllib3_delay
from lab.matrix_cells import (
    CELLS,
    QUICK,
    SHAPES,
    TIMED_OUT,
    Cell,
    Target,
    backlog_end,
    capacity_at,
    closed_figures,
    closed_ratios,
    generator_lag,
    herd_figures,
    median,
    open_figures,
    settle,
    targets,
    usage_figures,
)

KEPT = -2.0  # (``written`` of a shot whose request went on a connection already open: as soon as sent)


def shot(sent: float, done: float, status: int = 200, retry_after: bool = False, due: float | None = None,
         fresh: bool = False, written: float | None = KEPT):  # fmt: skip
    return SimpleNamespace(due=sent if due is None else due, sent=sent, done=done, status=status,
                           retry_after=retry_after, fresh=fresh,
                           written=sent if written == KEPT else written)  # fmt: skip


def test_settle_is_the_first_second_from_which_every_second_stays_within_15_percent() -> None:
    served = {5: 40, 6: 90, 7: 101, 8: 60, 9: 95, 10: 110, 11: 86}  # capacity 100; the dip at 8 restarts the count
    s = settle(served, 100.0, 5.0, 12)
    assert s["settle_s"] == 4.0  # second 9 on
    assert s["worst_after_settle"] == 0.86 and s["lowest_after_step"] == 0.4
    assert settle(served, 100.0, 5.0, 8)["settle_s"] == 1.0  # a run that ends before the dip settled at 6
    assert settle({5: 100, 6: 50}, 100.0, 5.0, 7) == {"settle_s": None, "worst_after_settle": None,
                                                       "lowest_after_step": 0.5}  # fmt: skip


def test_the_capacity_in_force_follows_the_last_step_before_it() -> None:
    steps = ((3.0, 0), (8.0, 20))
    assert [capacity_at(200.0, steps, 20, t) for t in (2.9, 3.0, 7.9, 8.0)] == [200.0, 0.0, 0.0, 200.0]


def test_open_figures_window_offered_rate_and_verdict_inputs() -> None:
    shots = [shot(0.5, 0.6, 503), shot(1.5, 1.6, 503)]  # a 5xx in the first second is forgiven, one after is not
    shots += [shot(3.0 + i / 10, 3.05 + i / 10) for i in range(120)]  # 120 answered 200 within seconds 3-15
    shots += [shot(2.9, 3.2)]  # sent before the window, answered in it: goodput counts it, the share does not
    shots += [shot(5.0, 5.001, 429, True), shot(5.0, 5.001, 429, False), shot(6.0, 7.0, TIMED_OUT), shot(6.0, 6.1, 0)]
    f = open_figures(shots, target=10.0, capacity=10.0, duration=15.0)
    assert f["requests"] == 127 and f["offered_per_s"] == round(127 / 15, 1)
    assert f["offered_short"] is True and f["offered_ratio"] == round(127 / 150, 3)  # 0.847 < 0.95: flagged
    assert f["goodput_window"] == round(121 / 12, 1) and f["goodput_ratio"] == round(121 / 12 / 10, 3)
    assert f["served_share_window"] == round(121 / 124, 3)  # the window's 200s over the 124 sent in it
    assert f["rejected_429"] == 2 and f["no_retry_after"] == 1
    assert f["timeouts"] == 1 and f["timeout_share"] == round(1 / 127, 4) and f["errors"] == 1
    assert f["server_5xx"] == 2 and f["server_5xx_after_1s"] == 1 and f["non_2xx"] == 6
    assert f["ok_p50_s"] == 0.05 and f["ok_p99_s"] == 0.05  # the 200s' own latency: 120 of 0.05 s, one of 0.3 s
    assert f["served_per_s"][3] == 11 and sum(f["served_per_s"]) == 121
    assert f["sent_per_s"][:3] == [1, 1, 1] and sum(f["sent_per_s"]) == 127  # (the one sent at 2.9 s in second 2)
    assert f["rejected_per_s"][5] == 2 and f["timeouts_per_s"][6] == 1 and "capacity_per_s" not in f
    assert open_figures([shot(t / 20, t / 20 + 0.01) for t in range(290)], target=20.0, capacity=20.0,
                        duration=15.0)["offered_short"] is False  # 290 sent in 15 s: 0.967 of 20/s  # fmt: skip


def test_open_figures_time_the_connects_of_fresh_connections_and_count_those_never_established() -> None:
    shots = [shot(3.0 + i / 100, 3.1 + i / 100) for i in range(96)]  # on kept connections: no connect
    shots += [shot(4.0, 4.2, fresh=True, written=4.0005), shot(4.1, 4.3, fresh=True, written=4.1015)]
    shots += [shot(5.0, 6.0, TIMED_OUT, fresh=True, written=None), shot(5.5, 6.5, TIMED_OUT, fresh=True,
                                                                        written=5.9)]  # fmt: skip
    f = open_figures(shots, target=10.0, capacity=10.0, duration=15.0)
    assert f["fresh_connections"] == 4 and f["unconnected"] == 1  # one gave up before its connection was made
    assert f["connect_p50_s"] == 0.0015 and f["connect_p99_s"] == 0.4  # of 0.0005, 0.0015 and 0.4 s
    assert f["fresh_per_s"][4:6] == [2, 2] and sum(f["fresh_per_s"]) == 4
    assert open_figures(shots[:96], target=10.0, capacity=10.0, duration=15.0)["connect_p99_s"] is None


def test_open_figures_settle_against_the_capacity_after_the_last_step() -> None:
    shots = [shot(k + 0.5, k + 0.5 + j / 1000) for k in range(15) for j in range(200 if k < 7 else 95)]
    f = open_figures(shots, target=400.0, capacity=200.0, duration=15.0, steps=((7.0, 10),), workers=20)
    assert f["settle_s"] == 0.0 and f["worst_after_settle"] == 0.95  # 95 a second against the new 100
    assert f["capacity_per_s"][6:8] == [200.0, 100.0]


def herd(attempts: list[Attempt], finished: dict[int, float], clients: int) -> HerdResult:
    result = HerdResult(clients)
    result.attempts, result.finished = attempts, finished
    return result


def test_herd_figures_count_5xx_in_a_cut_second_apart_and_bound_the_drain_by_the_integral() -> None:
    attempts = [Attempt(0, 0.0, 0.1, 429, 1), Attempt(0, 1.0, 1.1, 200, None), Attempt(1, 2.2, 2.3, 503, None),
                Attempt(1, 2.9, 3.0, 503, None), Attempt(1, 4.5, 4.6, 200, None), Attempt(-1, 2.5, 2.6, 503, None),
                Attempt(-1, 3.2, 3.3, 200, None), Attempt(-1, 4.0, 4.8, 503, None)]  # fmt: skip
    f = herd_figures(herd(attempts, {0: 1.1, 1: 4.6}, 2), capacity=2.0, new_rate=0.0, steps=((2.0, 1),),
                     workers=2, service=1.0)  # fmt: skip
    # H = 2/s covers M = 2 in 1 s, before the cut: the bound is 1 s, the drain 4.6 s
    assert f["bound_integral_s"] == 1.0 and f["drain_vs_bound"] == 4.6
    assert f["server_5xx_cut_second"] == 3 and f["server_5xx_outside_cut"] == 1  # sent in [2, 3), and at 4.0
    assert f["served_per_s"] == [0, 1, 0, 1, 1]
    # up to the drain (seconds 2 and 3) against the new 1/s: second 2 served nothing, second 3 one
    assert f["settle_s"] == 1.0 and f["lowest_after_step"] == 0.0 and f["worst_after_settle"] == 1.0
    plain = herd_figures(herd(attempts, {0: 1.1, 1: 4.6}, 2), capacity=2.0, new_rate=0.0)
    assert plain["drain_vs_bound"] == plain["drain_ratio"] == 4.6 and "settle_s" not in plain


def test_closed_figures_take_the_gates_holds_and_ratios_are_to_bare_in_the_same_round() -> None:
    wrk = {"req_per_s": 950.0, "p50_ms": 1.3, "non_2xx": 0}
    f = closed_figures(wrk, {"paced": 3, "rejected": 0, "admitted_at_once": 9000})
    assert f["paced"] == 3 and f["rejected"] == 0
    assert closed_figures(wrk, {})["paced"] == 0  # no gate, nothing held
    assert closed_figures(wrk, None)["paced"] is None  # counters not read: no figure, so no target met
    assert closed_ratios(f, {"req_per_s": 1000.0, "p50_ms": 1.0}) == {"req_ratio": 0.95, "p50_ratio": 1.3}
    assert closed_ratios(f, {})["req_ratio"] is None


def test_a_generator_whose_timers_ran_late_is_flagged() -> None:
    assert generator_lag([0.001] * 98 + [0.2, 0.3]) == {"loop_lag_p99_s": 0.2, "loop_lag_max_s": 0.3,
                                                       "loop_lag_bound_s": 0.1, "generator_short": True}  # fmt: skip
    assert generator_lag([0.001] * 99 + [0.5])["generator_short"] is False  # one late timer in a hundred
    assert generator_lag([])["generator_short"] is False
    open_loop = generator_lag([0.001] * 98 + [0.03, 0.03], late=0.025)  # the open loop's tighter bound
    assert open_loop["generator_short"] is True and open_loop["loop_lag_bound_s"] == 0.025
    assert generator_lag([0.001] * 98 + [0.03, 0.03])["generator_short"] is False


def test_a_run_whose_server_or_generator_waited_for_a_core_is_flagged_contended() -> None:
    before = {"server": (10.0, 1.0), "generator": (3.0, 0.5), "wrk": None}
    after = {"server": (25.0, 1.5), "generator": (6.0, 0.8), "wrk": (1.0, 0.0)}
    f = usage_figures(before, after, 15.0)  # (a process not read before: no figure)
    assert f == {"server_cpu_share": 1.0, "server_wait_share": 0.033, "generator_cpu_share": 0.2,
                 "generator_wait_share": 0.02, "contended": False}  # fmt: skip
    waited = usage_figures(before, {**after, "server": (16.0, 4.0)}, 15.0)
    assert waited["server_cpu_share"] == 0.4 and waited["server_wait_share"] == 0.2 and waited["contended"] is True
    assert usage_figures({"server": None}, {"server": (1.0, 1.0)}, 15.0) == {"contended": False}


def test_medians_over_rounds_skip_missing_figures_and_a_flag_raised_once_stays_raised() -> None:
    assert median([1.0, None, 3.0, 10.0]) == 3.0
    assert median([None, None]) is None
    assert median([False, True, False]) is True
    assert median([[1, 2], [3]]) is None  # per-second series are kept per round, not medianed


def test_targets_per_cell_kind_and_way() -> None:
    closed = Cell("cpu-0", "closed32", "closed32")
    assert {t.key: str(t) for t in targets(closed, SHAPES["cpu-0"], "default")}["req_ratio"] == "≥ 0.95"
    assert {t.key: str(t) for t in targets(closed, SHAPES["cpu-0"], "metrics")}["req_ratio"] == "≥ 0.93"
    assert targets(closed, SHAPES["cpu-0"], "bare") == []
    p99 = {s: next(t for t in targets(Cell(s, "open", "open5", multiple=5.0), SHAPES[s], "default")
                   if t.key == "ok_p99_s").bound for s in ("cpu-2", "io-100x500-q1")}  # fmt: skip
    assert p99 == {"cpu-2": 0.25, "io-100x500-q1": 0.75}
    assert targets(Cell("cpu-2", "open", "open1", multiple=1.0), SHAPES["cpu-2"], "default") == []
    keys = {t.key for t in targets(Cell("io-20x100-q2", "herd", "cut", steps=((5.0, 10),)), SHAPES["io-20x100-q2"],
                                   "default")}  # fmt: skip
    assert {"server_5xx_outside_cut", "server_5xx_cut_second", "settle_s"} <= keys and "server_5xx" not in keys
    up = {t.key for t in targets(Cell("io-20x100-q2", "herd", "double", steps=((5.0, 40),)), SHAPES["io-20x100-q2"],
                                 "default")}  # fmt: skip
    assert "server_5xx" in up and "server_5xx_cut_second" not in up


def test_a_target_is_not_met_by_a_missing_figure_but_no_returning_herd_has_no_edge_to_judge() -> None:
    assert Target("x", "<=", 2.0).met({"x": 2.0}) and not Target("x", "<=", 2.0).met({"x": 2.01})
    assert Target("x", ">=", 0.95).met({"x": 0.95}) and not Target("x", ">=", 0.95).met({"x": None})
    assert not Target("x", "<=", 1.0).met({"x": float("nan")}) and not Target("x", "<=", 1.0).met({})
    edge = Target("edge_peak_to_avg", "<=", 1.5, unless="all_first_try")
    assert edge.met({"edge_peak_to_avg": None, "all_first_try": True})
    assert not edge.met({}) and not edge.met({"edge_peak_to_avg": 2.0, "all_first_try": True})


def test_a_herds_settle_window_ends_when_its_backlog_could_no_longer_fill_a_second() -> None:
    finished = [1.2, 1.5, 2.1, 2.2, 2.3, 3.5, 4.1, 5.9]  # 10 clients, two never served
    assert backlog_end(finished, 10, 1.0, 3.0, 8) == 6  # 2 left at 6 s, fewer than 3 a second
    assert backlog_end(finished, 10, 1.0, 2.0, 8) == 8  # 2 left is still a second's worth: up to the last second
    attempts = [Attempt(i, 0.0, 0.1, 200, None) for i in range(3)]
    once = herd_figures(herd(attempts, dict.fromkeys(range(3), 0.1), 3), capacity=10.0, new_rate=1.0)
    assert once["all_first_try"] is True and once["edge_peak_to_avg"] is None


def test_every_target_names_a_figure_its_cell_produces() -> None:
    produced = {
        "closed32": set(closed_figures({"req_per_s": 1.0, "p50_ms": 1.0, "non_2xx": 0}, {})) | {"req_ratio",
                                                                                             "p50_ratio"},
        "open": set(open_figures([shot(4.0, 4.1)], target=1.0, capacity=1.0, duration=15.0, steps=((7.0, 10),),
                                 workers=20)),
        "herd": set(herd_figures(herd([Attempt(0, 0.0, 0.1, 200, None)], {0: 0.1}, 1), capacity=10.0, new_rate=1.0,
                                 steps=((0.5, 5),), workers=10, service=1.0)),
    }  # fmt: skip
    for cell in CELLS:
        for way in ("default", "typed", "metrics"):
            assert {t.key for t in targets(cell, SHAPES[cell.shape], way)} <= produced[cell.load], cell.id
    assert set(QUICK) <= {c.id for c in CELLS}
    assert {c.load for c in CELLS if c.id in QUICK} == {"closed32", "open", "herd"}


@pytest.mark.parametrize("failures", range(1, 12))
def test_the_urllib3_policy_waits_as_urllib3s_retry_does(failures: int) -> None:
    retry = Retry(total=10_000, backoff_factor=0.1, status_forcelist=(429, 503), respect_retry_after_header=True)
    for _ in range(failures):
        retry = retry.increment(method="GET", url="/io", response=SimpleNamespace(status=503, get_redirect_location=
                                                                                   lambda: None))  # fmt: skip
    assert urllib3_delay(failures, None) == retry.get_backoff_time()
    assert urllib3_delay(failures, 7) == retry.parse_retry_after("7") == 7
    assert urllib3_delay(failures, 0) == retry.get_backoff_time()  # urllib3 takes "Retry-After: 0" as none
