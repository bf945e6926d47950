"""The event-loop model the ablation benchmark runs on: its costs, its upstream, and the gate in front of it."""

from __future__ import annotations

import pytest

from admitgate.core.gate import Gate
from admitgate.core.settings import Settings
from lab.loop_model import NET, PARSE, RESPOND, TASK, Outcome, Server, Shape, closed_figures


def _send(server: Server, t: float, out: list[Outcome]) -> None:
    o = Outcome(t)
    out.append(o)

    def answered(tt: float, status: int, ra: object) -> None:
        o.done, o.status, o.retry_after = tt, status, ra

    server.request(t, answered)


def test_one_connection_to_a_cpu_bound_app_waits_for_each_request_s_whole_round_trip() -> None:
    server = Server(Shape("cpu", burn=0.001), None)
    out: list[Outcome] = []
    server.closed_loop(1, 0.0, 1.0, out)
    server.run(1.1)
    cycle = 2 * NET + PARSE + TASK + 0.001 + RESPOND  # (to the server, parsed, served on the loop, back)
    assert closed_figures(out, 0.0, 1.0)["rps"] == pytest.approx(1 / cycle, abs=1.0)
    assert Shape("cpu", burn=0.001).capacity == pytest.approx(1 / (PARSE + TASK + 0.001 + RESPOND))


def test_a_request_that_waits_longer_than_the_queue_timeout_for_a_worker_is_answered_503() -> None:
    server = Server(Shape("io", workers=1, service=0.1, queue_timeout=0.15), None)
    out: list[Outcome] = []
    for _ in range(3):
        _send(server, 0.0, out)
    server.run(1.0)
    assert [o.status for o in out] == [200, 200, 503]  # (a worker frees at 0.1 s, the next at 0.2 s: too late)
    assert out[1].done == pytest.approx(0.2, abs=0.001)
    assert out[2].done == pytest.approx(0.15, abs=0.001)


def test_the_gate_in_front_answers_what_finds_no_token_with_429_and_a_retry_after() -> None:
    gate = Gate(10.0, Settings(burst=2, max_pacing_delay=0))
    server = Server(Shape("io", workers=5, service=0.01), gate)
    out: list[Outcome] = []
    for _ in range(12):
        _send(server, 0.0, out)
    server.run(1.0)
    assert sorted(o.status for o in out) == [200, 200] + [429] * 10
    assert all(o.retry_after for o in out if o.status == 429)


def test_a_herd_obeying_retry_after_is_served_in_full_at_the_gate_s_rate() -> None:
    gate = Gate(100.0, Settings(burst=10))
    server = Server(Shape("io", workers=20, service=0.01), gate)
    result = server.herd(300, 1.0, 20.0)
    server.run(21.0)
    assert len(result.finished) == 300
    assert max(result.finished.values()) == pytest.approx(3.0, abs=0.6)  # (300 at 100/s, 10 at once)
