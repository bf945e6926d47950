"""Estimators: arithmetic pinned against hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import pytest

from admitgate.core.errors import ConfigError
from admitgate.limit.estimator import Baseline
from admitgate.limit.estimators import AIMD, BandwidthDelay, Gradient, Static, estimator_from_config
from admitgate.limit.window import Window


def window(now=1.0, dt=0.1, rate=100.0, completion=100.0, latency=0.1, busy=10.0, limiting=True, drops=0,
           recent=None, admit=None) -> Window:  # fmt: skip
    return Window(now, dt, 100, completion, latency, drops, int(busy), busy, latency if recent is None else recent,
                  completion if admit is None else admit, limiting, rate)  # fmt: skip


def test_baseline_is_a_sliding_minimum_over_unfrozen_time() -> None:
    b = Baseline(horizon=1.0)
    for latency in (0.3, 0.1, 0.2):
        b.observe(latency, 0.4)
    assert b.value == 0.1
    b.observe(0.25, 0.4)  # age 1.6: the 0.1 seen at age 0.8 is still inside the horizon
    assert b.value == 0.1
    b.observe(0.25, 0.5)  # age 2.1: now it has left
    assert b.value == 0.2
    b.reset(0.5)
    assert b.value == 0.5


def test_static_returns_its_capacity() -> None:
    assert Static(250).estimate(window()) == 250


def test_bdp_starts_up_fast_then_probes_by_its_gain_once_it_has_seen_saturation() -> None:
    e = BandwidthDelay(cruise=0, probe_gain=0.25, startup_gain=1.0, confirm=1, seed=1)
    # baseline 0.1 s, delivered 100/s: 10 in flight is exactly no queue; start-up doubles a second
    assert e.estimate(window(now=0.1, dt=1.0)) == pytest.approx(200.0)
    assert e.state == "starting" and e.growth == 1.0
    # a queue at 200/s offered while 180/s is delivered: held while it stands for the span of the delivered
    # rate plus a latency (0.5 + 0.1 s), then the capacity is found (start-up is over)
    assert e.estimate(window(now=0.2, rate=200.0, completion=180.0, busy=40.0)) == 200.0
    assert e.state == "starting"
    e.estimate(window(now=0.8, rate=200.0, completion=180.0, busy=40.0))
    assert e.state == "draining" and e.mu == 180.0 and e.growth == 0.25
    drain_to_cruise(e)
    assert e.estimate(window(now=5.0, dt=1.0, rate=180.0, completion=180.0, busy=18.0)) == pytest.approx(225.0)
    assert e.state == "probing"


def test_bdp_paces_start_up_at_twice_what_is_delivered() -> None:
    """BBR's start-up: until the service is first seen saturated, the rate is at least twice what it delivers, so a
    herd landing on a service far above the first guess fills it within a few latencies, not seconds of growth."""
    e = BandwidthDelay(cruise=0, confirm=1, seed=1)
    # 100/s offered and delivered, no queue: a tenth of a second's growth at 2x a second would give 107/s
    assert e.estimate(window(now=0.1)) == pytest.approx(200.0)
    assert e.state == "starting"
    # what is delivered lags the rate: 150/s delivered of 200/s offered, still no queue
    assert e.estimate(window(now=0.2, rate=200.0, completion=150.0, busy=15.0)) == pytest.approx(300.0)
    # a queue: held while it stands (no pace on top of it), then the capacity is what was delivered
    assert e.estimate(window(now=0.3, rate=300.0, completion=180.0, busy=60.0)) == 300.0
    e.estimate(window(now=0.9, rate=300.0, completion=180.0, busy=60.0))
    assert e.state == "draining" and e.mu == 180.0
    drain_to_cruise(e)
    # start-up is over: the rate grows by the probing gain, whatever is delivered
    assert e.estimate(window(now=5.0, rate=180.0, completion=180.0, busy=18.0)) == pytest.approx(180.0 * 1.25**0.1)
    assert e.state == "probing"


def test_bdp_takes_a_capacity_that_fell_in_a_drain_from_a_queue_emptied_at_all_the_service_can_do() -> None:
    """A capacity that halves while bdp drains: less goes in than comes out, so the old rule (more going in than
    coming out) never fired and μ stood at the old capacity until the queue was gone (3 s on a real server, where
    the queue of 120 timed out). Once a whole max filter's span delivered a tenth under μ and more, it is μ."""
    e = BandwidthDelay(cruise=0, confirm=1, reprobe=1000, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=250.0, completion=200.0, busy=60.0))
    e.estimate(window(now=0.8, rate=250.0, completion=200.0, busy=60.0))
    assert e.state == "draining" and e.mu == 200.0
    # the capacity halves: 100/s comes out, 70/s goes in, the queue falls by 3 every 0.1 s
    busy, now = 80.0, 0.8
    while now < 1.65:  # under a max filter's second of samples in this drain: no verdict yet
        now, busy = now + 0.1, busy - 3
        e.estimate(window(now=now, rate=70.0, completion=100.0, busy=busy, admit=70.0))
    assert e.state == "draining" and e.mu == 200.0
    while now < 1.95:  # (0.9 s of them from 1.8 s)
        now, busy = now + 0.1, busy - 3
        e.estimate(window(now=now, rate=70.0, completion=100.0, busy=busy, admit=70.0))
    assert e.state == "draining" and e.mu == 100.0
    # as much going in as coming out at a drain's rate says nothing of a capacity: μ stays
    e2 = BandwidthDelay(cruise=0, confirm=1, reprobe=1000, seed=1)
    e2.estimate(window(now=0.1))
    e2.estimate(window(now=0.2, rate=250.0, completion=200.0, busy=60.0))
    e2.estimate(window(now=0.8, rate=250.0, completion=200.0, busy=60.0))
    now = 0.8
    while now < 2.05:
        now = now + 0.1
        e2.estimate(window(now=now, rate=150.0, completion=150.0, busy=60.0, admit=150.0))
    assert e2.mu == 200.0


def test_bdp_start_up_pace_leaves_the_end_of_a_pause_to_the_rate_held() -> None:
    """The update that ends a pause is applied undamped; right after a stall the 0.2 s rate is the catch-up burst,
    no capacity (see _signals). So that update resumes the rate held, not twice the burst (600/s here)."""
    e = BandwidthDelay(seed=1)
    e.estimate(dataclasses.replace(window(now=0.1), delivered=100.0, current=100.0))
    rate, now = 200.0, 0.1
    while e.state != "paused":  # a stall: nothing served, in flight climbs
        now = round(now + 0.1, 1)
        rate = e.estimate(dataclasses.replace(window(now=now, rate=rate, completion=60.0, busy=20.0 + 100 * now),
                                              delivered=40.0, current=0.0))  # fmt: skip
        assert now < 1.0
    end = e.estimate(dataclasses.replace(window(now=now + 0.1, rate=rate, completion=100.0, busy=12.0, admit=50.0),
                                         delivered=120.0, current=300.0))  # fmt: skip
    assert e.pausing and e.state == "starting" and end == pytest.approx(200.0)


def _slower(before: float, after: float, at: float = 10.0, demand: float = 400.0, until: float = 30.0) -> float:
    """μ after a service with as many workers as it is sent (no queue can form) got slower at ``at`` s: latency
    ``before`` → ``after`` s. Windows built as LiveCapacity builds them, its ×1.25 a step applied (a fluid model)."""
    e, rate, now = BandwidthDelay(seed=1), 100.0, 0.0
    admitted: list[float] = []
    completed: list[float] = []
    busy: list[float] = []
    flight: list[tuple[float, float]] = []  # (due, requests)
    while now < until - 1e-9:
        latency = before if now < at else after
        admitted.append(min(demand, rate) * 0.1)
        flight.append((now + latency, admitted[-1]))
        now += 0.1
        completed.append(sum(n for due, n in flight if due <= now + 1e-9))
        flight = [(due, n) for due, n in flight if due > now + 1e-9]
        busy.append(sum(n for _, n in flight))
        per = lambda xs, n: sum(xs[-n:]) / (len(xs[-n:]) * 0.1)  # noqa: E731
        w = Window(now, 0.1, 100, per(completed, 10), latency, 0, int(busy[-1]), sum(busy[-2:]) / len(busy[-2:]),
                   latency, per(admitted, 2), demand > rate, rate, per(completed, 5), per(completed, 2))  # fmt: skip
        target = e.estimate(w)
        step = math.inf if e.pausing else 1.25
        rate = min(max(target, rate / step), rate * step)
    assert e.mu is not None
    return e.mu


@pytest.mark.parametrize("before,after", [(0.1, 0.25), (0.2, 0.6), (0.3, 0.9)])
def test_bdp_keeps_its_capacity_through_a_drain_on_a_service_that_only_got_slower(before: float, after: float) -> None:
    """No queue can form, yet more is in flight than the throughput explains: bdp drains, cuts a quarter at the
    plateau and tells a slower service by Little's latency. While that cut is pending, admissions are below what
    is delivered by design: no capacity fell (a rule that read it as one cut μ from 400/s to 22/s in 20 s)."""
    assert _slower(before, after) > 200.0


def drain_to_cruise(e: BandwidthDelay) -> None:
    while e.state == "draining":  # the queue drains
        e.estimate(window(now=e._drain_at + 2, rate=180.0, completion=180.0, busy=18.0))


def test_bdp_starts_up_again_after_a_collapse() -> None:
    e = BandwidthDelay(cruise=0, confirm=1, reprobe=1000, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=200.0, completion=180.0, busy=40.0))
    e.estimate(window(now=0.8, rate=200.0, completion=180.0, busy=40.0))
    drain_to_cruise(e)
    assert e.growth == e.probe_gain
    # an outage: 200/s offered, 20/s delivered and the queue grows: below a quarter is a collapse, believed
    # once the queue has stood 0.5 s beyond a latency (a drop is no shortcut; a stall of a few tenths of a
    # second, as a herd's connections can cause on a real server, is not an outage)
    e.estimate(window(now=5.0, rate=200.0, completion=20.0, busy=60.0, drops=5))
    e.estimate(window(now=5.4, rate=200.0, completion=20.0, busy=60.0, drops=5))
    assert e.state != "draining"
    e.estimate(window(now=5.7, rate=200.0, completion=20.0, busy=60.0, drops=5))
    assert e.mu == 10.0 and e.growth == e.startup_gain  # 20/s answered, 10/s of them 503s: 10/s served
    # cut to a few per second, the service still delivers a trickle: a quarter of that rate, but not of the
    # capacity known before the outage, so start-up (not the probing pace) finds it again
    drain_to_cruise(e)
    e.estimate(window(now=20.0, rate=8.0, completion=5.0, busy=60.0))
    e.estimate(window(now=20.7, rate=8.0, completion=5.0, busy=60.0))
    assert e.state == "draining" and e.growth == e.startup_gain


def test_bdp_holds_through_an_outage_and_resumes_at_the_capacity_known_before_it() -> None:
    import copy

    e = BandwidthDelay(cruise=0, confirm=1, reprobe=1000, seed=1)
    e.estimate(window(now=0.1))  # baseline 0.1 s
    e.estimate(window(now=0.2, rate=200.0, completion=180.0, busy=40.0))
    e.estimate(window(now=0.8, rate=200.0, completion=180.0, busy=40.0))
    drain_to_cruise(e)
    assert e.mu == 180.0
    # the service stops: nothing is served while in flight grows; once the queue has stood 0.5 s beyond a
    # latency, it is an outage
    e.estimate(window(now=5.0, rate=180.0, completion=0.0, busy=60.0))
    assert e.state != "outage"
    e.estimate(window(now=5.7, rate=180.0, completion=0.0, busy=60.0))
    assert e.state == "outage" and e.mu is not None and e.mu < 1
    # meanwhile every answer is a 503 at the queue timeout, or nothing comes back: the rate holds
    assert e.estimate(window(now=7.0, rate=1.0, completion=20.0, latency=1.0, busy=1.0, drops=10)) == 1.0
    assert e.estimate(window(now=9.0, rate=1.0, completion=0.0, latency=1.0, busy=1.0)) == 1.0
    assert e.state == "outage"
    slow = copy.deepcopy(e)
    # served again at the baseline latency, no drops: the rate resumes at half the capacity known before
    # the outage (faded over 30 s), and start-up finds the rest
    rate = e.estimate(window(now=16.0, rate=1.0, completion=5.0, latency=0.1, busy=0.5, admit=5.0))
    assert rate == pytest.approx(0.5 * 180 * math.exp(-(16.0 - 5.7) / 30))
    assert e.mu == rate and e.state != "outage" and e.growth == e.startup_gain
    # served again, but far slower than before: no capacity is assumed; start-up finds it from the rate
    rate = slow.estimate(window(now=16.0, rate=1.0, completion=5.0, latency=0.5, recent=0.5, busy=2.5, admit=5.0))
    assert rate == 1.0 and slow.state != "outage"


def test_bdp_pauses_while_nothing_is_served_and_resumes_at_once_without_touching_mu() -> None:
    """A real server's event loop, busy with a herd's connections, can stall completions for a few tenths of a
    second: no verdict (μ stays), but nothing more goes in while nothing comes out, and the rate in force
    before comes back as soon as something is served."""
    import dataclasses

    e = BandwidthDelay(cruise=0, confirm=1, reprobe=1000, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=200.0, completion=180.0, busy=40.0))
    e.estimate(window(now=0.8, rate=200.0, completion=180.0, busy=40.0))
    drain_to_cruise(e)
    assert e.estimate(window(now=5.0, rate=180.0, completion=0.0, busy=40.0)) == 180.0  # a queue, for now
    assert not e.pausing
    # not yet 0.3 s beyond a latency (a real server's event loop can stall that long): held
    assert e.estimate(window(now=5.3, rate=180.0, completion=0.0, busy=50.0)) == 180.0 and not e.pausing
    # it has stood 0.3 s beyond a latency and nothing is served: pause at what is delivered
    assert e.estimate(window(now=5.45, rate=180.0, completion=0.0, busy=50.0)) < 1.0
    assert e.state == "paused" and e.pausing and e.mu == 180.0
    # a trickle delivered over 0.5 s is judged against the rate held back, not the paused one: no capacity
    w = dataclasses.replace(window(now=5.5, rate=1.0, completion=6.0, busy=55.0), current=0.0)
    assert e.estimate(w) == 6.0 and e.state == "paused" and e.mu == 180.0
    # served again: the rate in force before, at once
    assert e.estimate(window(now=5.6, rate=6.0, completion=180.0, busy=18.0)) >= 180.0
    assert e.pausing and e.mu == 180.0 and e.state != "paused"
    e.estimate(window(now=5.7, rate=180.0, completion=180.0, busy=18.0))
    assert not e.pausing


def test_bdp_takes_no_capacity_from_a_service_that_answers_only_503s() -> None:
    """A service that answers every request at once with a 503 (no backend behind a proxy) completes at the
    rate offered; none of it is served: an outage, not a capacity of 100/s."""
    e = BandwidthDelay(cruise=0, confirm=1, seed=1)
    e.estimate(window(now=0.1))  # 100/s at 0.1 s
    for now in (0.2, 0.5, 0.8):  # 100/s answered, 50 of them 503s in 0.5 s
        e.estimate(window(now=now, completion=100.0, latency=0.01, busy=1.0, drops=50))
    assert e.state == "outage" and e.mu is not None and e.mu < 1


def test_bdp_re_measures_its_baseline_at_three_quarters_of_mu() -> None:
    e = BandwidthDelay(cruise=0, reprobe=10.0, seed=1)
    e.estimate(window(now=0.1))  # baseline 0.1, re-measurement due at 10 s ± 15 %
    e.estimate(window(now=0.2, rate=100.0, completion=100.0, busy=10.0))
    e._started = True
    at = e._reprobe_at
    rate = e.estimate(window(now=at, rate=100.0, completion=100.0, busy=10.0))
    assert e.state == "re-measuring" and rate == pytest.approx(75.0)
    # in flight settles at 75/s × 0.12 s: the service is a little slower than the old baseline
    for i in range(1, 20):
        rate = e.estimate(window(now=at + i * 0.1, rate=75.0, completion=75.0, admit=75.0, busy=9.0))
        if e.state != "re-measuring":
            break
    assert e.state == "probing" and rate == pytest.approx(100.0)
    assert e.baseline == pytest.approx(0.12)  # Little: in flight over admissions
    assert e._reprobe_at > at + 8


def _serve(e: BandwidthDelay, now: float, until: float, queue, drop_once: bool = False) -> list[float]:
    """Drive ``e`` against a service of 100/s at 0.1 s of its own latency with ``queue(e)`` requests standing in front
    of it while 100/s goes in; admitting at 3/4 of μ drains it (a re-measurement reads 0.1 s). ``drop_once``: a 503
    in the window that ends the first re-measurement (it cannot reset the baseline then). Returns when each
    re-measurement began."""
    began: list[float] = []
    while now < until - 1e-9:
        now = round(now + 0.1, 1)
        if e.state == "re-measuring":
            quiet, drops = e._quiet, int(drop_once and len(began) == 1 and now >= e._quiet_until)
            e.estimate(window(now=now, rate=quiet, completion=quiet, admit=quiet, busy=quiet * 0.1, drops=drops))
        else:
            q = queue(e)
            e.estimate(window(now=now, latency=0.1 + q / 100, busy=10.0 + q))
            if e.state == "re-measuring":
                began.append(now)
    return began


def test_bdp_re_measures_only_when_its_baseline_has_not_been_seen_for_the_interval() -> None:
    """BBR's min-RTT filter: once a re-measurement has measured the baseline, windows that read it push the next
    one back (it would cost a quarter of μ for a few latencies and find what they show); a standing queue that hides
    it does not."""
    for queue, count in ((0.5, 1), (3.0, 5)):  # 5 % over the measured baseline: seen; 30 %: not seen
        e = BandwidthDelay(cruise=0, reprobe=10.0, seed=1)
        e.estimate(window(now=0.1))
        e._started = True
        began = _serve(e, 0.1, 60.0, lambda e, q=queue: q)
        assert len(began) >= count if count > 1 else len(began) == 1, (queue, began)
        assert 8.5 <= began[0] <= 11.6  # the first is always due: nothing had measured the baseline


def test_bdp_re_measures_a_first_baseline_that_held_a_queue() -> None:
    """The gate starts (a restart, a new replica) in front of a queue of 10 in balance: its first baseline is 0.2 s.
    Windows at 0.2 s must not pass for the baseline seen: only a re-measurement anchors that."""
    e = BandwidthDelay(cruise=0, reprobe=10.0, seed=1)
    e.estimate(window(now=0.1, latency=0.2, busy=20.0))
    e._started = True
    began = _serve(e, 0.1, 40.0, lambda e: 10.0 if (e.baseline or 0) > 0.15 else 0.0)
    assert began and began[0] <= 11.6 and e.baseline == pytest.approx(0.1)


def _verdict() -> tuple[BandwidthDelay, float]:
    """bdp after a drain's verdict that the service got twice as slow (baseline 0.1 s -> 0.2 s), and when."""
    e = BandwidthDelay(tolerance=0.5, confirm=1, cruise=0, drain_time=0.5, reprobe=10.0, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, completion=100.0, latency=0.2, busy=20.0))
    target = e.estimate(window(now=0.8, completion=100.0, latency=0.2, busy=20.0))
    now = 0.8
    while e.state == "draining":
        now = round(now + 0.1, 1)
        target = e.estimate(window(now=now, completion=target, admit=target, latency=0.2, busy=target * 0.2))
    assert e.baseline == pytest.approx(0.2)
    return e, now


def test_bdp_owes_a_re_measurement_after_a_drain_took_a_slower_service_for_the_new_normal() -> None:
    """That verdict (Little's latency stayed put when admissions were cut) can be a queue in balance; the next
    re-measurement checks it, windows at the new baseline do not put it off."""
    e, now = _verdict()
    while e.state != "re-measuring" and now < 30:
        now = round(now + 0.1, 1)
        e.estimate(window(now=now, rate=100.0, completion=100.0, latency=0.2, busy=20.0))
    assert e.state == "re-measuring" and now <= 11.6
    # and a re-measurement that cannot reset it (a 503 in its last window) anchors nothing: the next one comes
    e, now = _verdict()
    began = _serve(e, now, 45.0, lambda e: 10.0 if (e.baseline or 0) > 0.15 else 0.0, drop_once=True)
    assert len(began) >= 2 and e.baseline == pytest.approx(0.1), began


def test_bdp_takes_the_delivered_rate_as_capacity_once_a_queue_is_confirmed() -> None:
    e = BandwidthDelay(tolerance=0.5, confirm=2, cruise=0, seed=1)
    e.estimate(window(now=0.1))
    # 100/s delivered × 0.1 s = 10 expected; 20 in flight is 10 queued (> 0.5·10 + 1) -- twice
    first = e.estimate(window(now=0.2, completion=90.0, busy=20.0))
    assert e.state != "draining" and first >= 90
    # twice, but the queue has not stood for the delivered rate's span plus a latency (0.6 s): held
    assert e.estimate(window(now=0.3, completion=90.0, busy=20.0)) == 100.0 and e.state != "draining"
    rate = e.estimate(window(now=0.8, completion=90.0, busy=20.0))
    assert e.state == "draining" and e.mu == 90.0
    # drain: μ − queued/drain_time = 90 − (20 − 9) / 1 = 79
    assert rate == pytest.approx(79.0)


def test_bdp_rebaselines_when_draining_does_not_lower_latency() -> None:
    e = BandwidthDelay(tolerance=0.5, confirm=1, cruise=0, drain_time=0.5, seed=1)
    e.estimate(window(now=0.1))  # baseline 0.1 s
    # the service got twice as slow: 20 in flight at 100/s is a queue by the old baseline
    e.estimate(window(now=0.2, completion=100.0, latency=0.2, busy=20.0))
    target = e.estimate(window(now=0.8, completion=100.0, latency=0.2, busy=20.0))
    assert e.state == "draining"
    for i in range(9, 50):  # in flight is always admissions × 0.2 s: no queue, at any drain rate
        target = e.estimate(window(now=i / 10, completion=target, admit=target, latency=0.2, busy=target * 0.2))
        if e.state != "draining":
            break
    assert e.baseline == pytest.approx(0.2)  # by Little: in flight over admissions
    assert target > 40  # cut by a quarter once to tell a slower service from a queue, not run down
    assert e.state != "draining"


def test_bdp_does_not_take_a_herds_first_instants_for_the_capacity() -> None:
    """A herd fills the service at once: for a latency nothing completes, so the delivered rate is a few per
    second while in flight jumps. That is the onset of a queue, not a capacity of a few per second."""
    e = BandwidthDelay(cruise=0, seed=1)
    e.estimate(window(now=1.0, rate=100.0, completion=20.0, busy=2.0, limiting=False))  # 20/s, baseline 0.1 s
    for now, delivered in ((1.1, 12.0), (1.2, 6.0), (1.3, 40.0), (1.4, 80.0)):
        assert e.estimate(window(now=now, rate=100.0, completion=delivered, busy=22.0)) == 100.0  # held
        assert e.mu is None or e.mu >= 100.0
    # the queue has stood 0.6 s: now what is delivered is the capacity
    e.estimate(window(now=1.8, rate=100.0, completion=200.0, busy=40.0))
    assert e.state == "draining" and e.mu == 200.0


def test_bdp_takes_no_capacity_from_the_catch_up_after_a_stall_at_a_herds_onset() -> None:
    """On a real server a herd's connections keep the event loop busy: nothing completes for a few tenths
    of a second, then the service catches up and delivers what was admitted. That queue says nothing of the
    capacity: start-up goes on (it took 100/s, the initial rate, for the capacity of a 200/s service)."""
    e = BandwidthDelay(seed=1)
    e.estimate(window(now=1.0, rate=100.0, completion=20.0, busy=2.0, limiting=False))  # 20/s, baseline 0.1 s
    for now in (1.1, 1.2, 1.3):  # the stall: nothing completes while in flight grows
        assert e.estimate(window(now=now, rate=100.0, completion=0.0, busy=20.0)) == 100.0
    # the catch-up: 100/s delivered (all that was admitted) with a queue still standing
    assert e.estimate(window(now=1.45, rate=100.0, completion=100.0, busy=30.0)) == 100.0  # held, not confirmed
    assert e.state == "starting" and e.growth == e.startup_gain
    assert e.estimate(window(now=1.55, rate=100.0, completion=160.0, busy=12.0)) > 100.0  # queue gone: grows on
    # a queue that stands past the stall while less comes out than goes in is a capacity, as ever
    for now in (1.6, 1.7, 1.8, 1.9, 2.0):
        e.estimate(window(now=now, rate=200.0, completion=150.0, busy=40.0))
    assert e.state == "draining" and e.mu == 150.0


def test_bdp_takes_no_capacity_from_the_first_fifth_of_a_second_past_a_stall() -> None:
    """A real herd's onset, traced: the event loop stalled for 0.3 s, then delivered 105/s over the 0.2 s past
    it (what had been admitted at the initial 100/s) with 40 in flight. Taken for the capacity, start-up ended
    at 105/s where the service does 200/s. Past a stall, only the 0.5 s rate counts."""
    e = BandwidthDelay(seed=1)
    e.estimate(window(now=1.0, rate=100.0, completion=20.0, busy=2.0, limiting=False))  # 20/s, baseline 0.1 s
    for now in (1.1, 1.2, 1.3):  # the stall
        e.estimate(dataclasses.replace(window(now=now, rate=100.0, completion=0.0, busy=12.0), current=0.0))
    w = window(now=1.51, rate=100.0, completion=42.0, busy=40.0)
    assert e.estimate(dataclasses.replace(w, delivered=42.0, current=105.0)) == 100.0  # held, not confirmed
    assert e.state == "starting" and (e.mu is None or e.mu >= 100.0)
    w = window(now=1.61, rate=100.0, completion=82.0, busy=28.0)
    e.estimate(dataclasses.replace(w, delivered=82.0, current=200.0))
    assert e.state == "starting"


def test_bdp_confirms_the_queue_of_a_saturated_service_that_stalls_again_and_again() -> None:
    """A stall puts off a confirmation from what is delivered after it, not for ever: a saturated service
    whose event loop stalls in every other window has its queue confirmed in a stall, by the 0.5 s rate."""
    e = BandwidthDelay(seed=1)
    e.estimate(window(now=1.0, rate=100.0, completion=20.0, busy=2.0, limiting=False))  # 20/s, baseline 0.1 s
    now = 1.0
    for i in range(12):  # 200/s offered, 150/s delivered over 0.5 s, but nothing at all in every other 0.2 s
        now = round(now + 0.1, 1)
        w = window(now=now, rate=200.0, completion=150.0, busy=60.0)
        e.estimate(dataclasses.replace(w, delivered=150.0, current=300.0 if i % 2 else 0.0))
        if e.state == "draining":
            break
    assert e.state == "draining" and e.mu == 150.0
    assert now <= 1.1 + 0.1 + 0.5  # over from 1.1: a latency, then the 0.5 s span


def test_bdp_raises_mu_to_what_a_standing_queue_delivers_while_it_drains() -> None:
    e = BandwidthDelay(confirm=1, cruise=0, drain_time=1.0, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=250.0, completion=170.0, busy=90.0))
    e.estimate(window(now=0.8, rate=250.0, completion=170.0, busy=90.0))  # a noisy first sample
    assert e.state == "draining" and e.mu == 170.0
    e.estimate(window(now=0.9, rate=150.0, completion=200.0, busy=80.0))  # the queue still stands
    assert e.state == "draining" and e.mu == 200.0
    e.estimate(window(now=1.0, rate=150.0, completion=190.0, busy=70.0))
    assert e.mu == 200.0  # a maximum: a lower sample does not pull it down


def test_bdp_lowers_mu_when_a_standing_queue_takes_in_more_than_it_delivers_while_it_drains() -> None:
    e = BandwidthDelay(confirm=1, cruise=0, drain_time=1.0, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=250.0, completion=200.0, busy=40.0))
    e.estimate(window(now=0.8, rate=250.0, completion=200.0, busy=40.0))
    assert e.state == "draining" and e.mu == 200.0
    # the capacity halves: 187/s still go in, 100/s come out, the queue grows; the old samples leave the
    # one-second filter and μ follows the delivered rate down, with the drain rate under it
    for i in range(9, 22):
        rate = e.estimate(window(now=i / 10, rate=187.0, completion=100.0, admit=187.0, busy=40.0 + 9 * i))
    assert e.state == "draining" and e.mu == 100.0 and rate < 100.0


def test_bdp_ends_a_drain_on_what_is_in_flight_now_not_on_the_lagging_average() -> None:
    import dataclasses

    e = BandwidthDelay(confirm=1, cruise=0, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=250.0, completion=200.0, busy=60.0))
    e.estimate(window(now=0.8, rate=250.0, completion=200.0, busy=60.0))
    assert e.state == "draining"
    # the 0.2 s average still shows 30 in flight (a queue of 10 over the 20 the throughput explains), but
    # in flight now is 20: the queue is gone, and holding the drain rate would leave the service idle
    w = dataclasses.replace(window(now=0.9, rate=150.0, completion=200.0, busy=30.0), inflight=20)
    assert e.estimate(w) == 200.0 and e.state != "draining"


def test_bdp_drain_keeps_the_highest_sample_of_the_last_second_then_lets_it_go() -> None:
    e = BandwidthDelay(confirm=1, cruise=0, drain_time=5.0, seed=1)
    e.estimate(window(now=0.1))
    e.estimate(window(now=0.2, rate=300.0, completion=150.0, busy=90.0))
    e.estimate(window(now=0.8, rate=300.0, completion=150.0, busy=90.0))
    assert e.state == "draining" and e.mu == 150.0
    e.estimate(window(now=0.9, rate=200.0, completion=220.0, admit=300.0, busy=90.0))  # a high sample
    assert e.mu == 220.0
    # more goes in than comes out, at 160/s: within the second the 220 stands (noise does not pull μ down) ...
    e.estimate(window(now=1.5, rate=200.0, completion=160.0, admit=300.0, busy=90.0))
    assert e.mu == 220.0
    # ... and once it has left the filter, μ follows the standing queue down
    e.estimate(window(now=2.0, rate=200.0, completion=160.0, admit=300.0, busy=90.0))
    assert e.mu == 160.0


def test_bdp_takes_no_capacity_from_a_drop_at_a_herds_onset() -> None:
    """A 503 in the herd's first instants is no shortcut past the wait for a measurable queue: what was
    delivered over the idle time before it (a few per second) is not the capacity."""
    e = BandwidthDelay(cruise=0, confirm=1, seed=1)
    e.estimate(window(now=1.0, rate=100.0, completion=20.0, busy=2.0, limiting=False))
    assert e.estimate(window(now=1.1, rate=100.0, completion=6.0, busy=22.0, drops=1)) == 100.0
    assert e.state != "draining" and (e.mu is None or e.mu >= 100.0)


def test_bdp_holds_when_app_limited() -> None:
    e = BandwidthDelay(cruise=0, seed=1)
    assert e.estimate(window(now=0.1, rate=300.0, limiting=False)) == 300.0
    assert e.state == "app-limited"


def test_gradient_scales_by_the_clamped_latency_ratio() -> None:
    e = Gradient(tolerance=0.5, smoothing=0.2, seed=1)
    e.estimate(window(now=0.1, limiting=False))  # baseline 0.1
    # latency 0.3: gradient = 1.5·0.1/0.3 = 0.5; mu = 100·(1 − 0.2·0.5) = 90
    assert e.estimate(window(now=0.2, latency=0.3)) == pytest.approx(90.0)
    # latency 0.12 is inside the tolerance: gradient 1, grows by the gain over dt
    assert e.estimate(window(now=0.3, rate=90.0, latency=0.12)) == pytest.approx(90 * 1.2**0.1)


def test_aimd_adds_while_under_target_and_multiplies_down_once_per_latency() -> None:
    e = AIMD(increase=10.0, backoff=0.9, latency_target=0.2, seed=1)
    assert e.estimate(window(now=0.1, dt=0.5)) == pytest.approx(105.0)
    assert e.estimate(window(now=0.2, rate=105.0, latency=0.5)) == pytest.approx(94.5)
    assert e.estimate(window(now=0.3, rate=94.5, latency=0.5)) == pytest.approx(94.5)  # cooling down
    assert e.estimate(window(now=0.8, rate=94.5, latency=0.5)) == pytest.approx(85.05)
    assert e.estimate(window(now=1.0, rate=85.05, drops=3, latency=0.1)) == pytest.approx(85.05)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"capacity\.estimator"):
        estimator_from_config("vegas")
    with pytest.raises(ConfigError, match=r"capacity\.bdp\.tolerance"):
        estimator_from_config("bdp", {"tolerance": -1})
    with pytest.raises(ConfigError, match=r"capacity\.bdp\.bogus"):
        estimator_from_config("bdp", {"bogus": 1})
    with pytest.raises(ConfigError, match=r"capacity\.static\.capacity"):
        estimator_from_config("static")
    with pytest.raises(ConfigError, match=r"capacity\.gradient\.min_gradient"):
        estimator_from_config("gradient", {"min_gradient": "x"})
    with pytest.raises(ConfigError, match=r"capacity\.aimd\.backoff"):
        AIMD(backoff=1.5)
