"""LiveCapacity: probes in, a bounded and step-limited rate out."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate.core.errors import ConfigError
from admitgate.core.gate import Gate
from admitgate.core.probes import Probes
from admitgate.core.source import StaticCapacity
from admitgate.limit.capacity import LiveCapacity
from admitgate.limit.estimators import AIMD, BandwidthDelay, Gradient, Static


def feed(h: LiveCapacity, start: float, seconds: float, rate: float, latency: float, shed: bool = True) -> float:
    """Complete ``rate`` requests/s of ``latency`` s each from ``start``; return the rate at the end."""
    p = h.probes
    n = int(seconds * rate)
    out = h.rate(start)
    for i in range(n):
        t = start + i / rate
        p.admit(t)
        p.complete(latency, 200, t + latency * 0)  # in and out: in flight stays ~0
        if shed:
            p.limited()
        out = h.rate(t)
    return out


def test_static_capacity() -> None:
    assert StaticCapacity(5).rate(0) == 5.0


def test_cold_start_is_permissive_and_low_traffic_holds() -> None:
    h = LiveCapacity(BandwidthDelay(seed=1), initial=50, min_samples=20)
    assert h.rate(0.0) == 50
    p = h.probes
    for i in range(5):  # 5 requests in 1 s: too few to judge
        p.admit(i * 0.2)
        p.complete(0.1, 200, i * 0.2 + 0.1)
    assert h.rate(1.05) == 50
    assert h.state().state == "warming"


def test_external_capacity_probe_caps_and_background_is_subtracted() -> None:
    h = LiveCapacity(Static(100), initial=100, capacity_probes=[lambda now: 60.0], background=10.0)
    assert h.rate(0.0) == 100  # no bucket closed yet
    h.probes.admit(0.05)
    rate = h.rate(0.15)
    assert rate == pytest.approx(100 / 1.25)  # on its way down, one step at a time
    for i in range(2, 20):
        rate = h.rate(i / 10 + 0.05)
    assert rate == pytest.approx(50.0)  # min(100, 60) − 10
    assert h.state().background == 10.0


def test_replace_mode_and_a_failing_probe_is_ignored(caplog) -> None:
    def broken(now: float) -> float:
        raise RuntimeError("pool gone")

    h = LiveCapacity(Static(100), initial=100, capacity_probes=[broken, lambda now: 300.0], probe_mode="replace",
                     max_step=10)  # fmt: skip
    h.probes.admit(0.0)
    assert h.rate(0.15) == pytest.approx(300.0)
    assert "pool gone" in caplog.text


@pytest.mark.parametrize("make", [lambda: BandwidthDelay(seed=2), lambda: Gradient(seed=2), lambda: AIMD(seed=2)])
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.0, 400.0), st.floats(0.001, 5.0), st.floats(0, 80), st.booleans(),
                                st.integers(0, 3)), min_size=1, max_size=40))  # fmt: skip
def test_rate_is_finite_and_within_bounds(make, steps) -> None:
    h = LiveCapacity(make(), initial=100, floor=2, ceiling=1000, max_step=0.25, min_samples=5)
    p = h.probes
    t = 0.0
    for rate, latency, busy, shed, drops in steps:
        for _ in range(int(rate / 10)):
            p.admit(t)
            p.complete(latency, 503 if drops else 200, t)
            if shed:
                p.limited()
        p.inflight = int(busy)  # whatever the app holds
        t += 0.1
        current = h.rate(t)
        assert math.isfinite(current) and 2 <= current <= 1000


def test_a_collapse_is_not_damped_on_the_way_down() -> None:
    """An outage: the service serves nothing; the rate goes under a quarter of what it was in one update (a
    pause, then the verdict), not ÷1.25 per update (about 2 s from 100/s to 10/s, every request of which would
    fail)."""
    h = LiveCapacity(BandwidthDelay(confirm=1, seed=1), initial=100, min_samples=5)
    p = h.probes
    t = 0.0
    for _ in range(20):  # 100/s, 0.1 s each: the baseline; then the service stops completing anything
        for _ in range(10):
            p.admit(t)
            p.complete(0.1, 200, t)
        p.limited()
        p.inflight = 10
        t += 0.1
        h.rate(t)
    rates = [h.rate(t)]
    while h.estimator.state != "outage":  # nothing at all is served
        for _ in range(10):
            p.admit(t)
        p.limited()
        p.inflight += 10
        t += 0.1
        rates.append(h.rate(t))
        assert t < 3.0
    assert h.estimator.mu is not None and h.estimator.mu < 0.25 * rates[0]
    assert rates[-1] < 0.25 * rates[0]
    assert max(a / b for a, b in itertools.pairwise(rates)) > 1.25**2  # in one update


class Scripted:
    """An estimator that says what the test tells it to."""

    name, state, baseline, measured = "scripted", "scripted", None, True

    def __init__(self, mu: float) -> None:
        self.mu = self.target = mu
        self.pausing = False

    def estimate(self, window) -> float:
        return self.target


def stepped(previous: float, target: float, mu: float | None, pausing: bool) -> float:
    """The documented rule (``LiveCapacity``, ``max_step`` 0.25, within 2-1000): × or ÷ 1.25 at most per update;
    no limit while the estimator pauses; none on the way down where μ is under a quarter of the rate (a
    collapse), nor on the way up where it is over four times it (a capacity back)."""
    low, high = previous / 1.25, previous * 1.25
    if pausing:
        low, high = 0.0, math.inf
    elif mu is not None and mu < previous / 4:
        low = 0.0
    elif mu is not None and mu > previous * 4:
        high = math.inf
    return min(max(target, low, 2.0), high, 1000.0)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.5, 2000.0), st.none() | st.floats(0.5, 5000.0), st.booleans()),
                      min_size=1, max_size=40))  # fmt: skip
def test_rate_is_step_limited_except_in_a_collapse_a_recovery_or_a_pause(steps) -> None:
    estimator = Scripted(100.0)
    h = LiveCapacity(estimator, initial=100, floor=2, ceiling=1000, max_step=0.25, min_samples=5)  # type: ignore[arg-type]
    previous = 100.0
    for k, (target, mu, pausing) in enumerate(steps):
        estimator.target, estimator.mu, estimator.pausing = target, mu, pausing
        for _ in range(10):  # enough completions in the bucket to judge by
            h.probes.admit(k / 10 + 0.05)
            h.probes.complete(0.01, 200, k / 10 + 0.05)
        current = h.rate((k + 1) / 10 + 0.05)  # (mid-bucket: the bucket it was fed in has closed)
        assert current == pytest.approx(stepped(previous, target, mu, pausing), rel=1e-12)
        previous = current


def test_a_capacity_back_after_an_outage_is_not_damped_on_the_way_up() -> None:
    """The estimator resumes at a capacity over 4× the rate an outage left: the rate goes there in one
    update, not ×1.25 per update (about 2 s from 4/s to 80/s, while the herd waits); smaller rises are damped."""
    e = Scripted(100.0)
    h = LiveCapacity(e, initial=100, min_samples=1)
    p, t = h.probes, 0.0

    def update(mu: float) -> float:
        nonlocal t
        e.mu = e.target = mu
        p.admit(t)
        p.complete(0.1, 200, t)
        p.limited()
        t += 0.1
        return h.rate(t)

    assert update(4.0) == 4.0  # a collapse: at once
    assert update(80.0) == 80.0  # back: at once
    assert update(200.0) == pytest.approx(100.0)  # within 4×: a step


def test_a_pause_and_its_end_are_not_damped() -> None:
    """The estimator pauses (nothing is served for a moment; μ untouched) and ends the pause: both at once."""
    e = Scripted(100.0)
    h = LiveCapacity(e, initial=100, min_samples=1)
    p, t = h.probes, 0.0

    def update(target: float, pausing: bool) -> float:
        nonlocal t
        e.target, e.pausing = target, pausing
        p.admit(t)
        p.complete(0.1, 200, t)
        p.limited()
        t += 0.1
        return h.rate(t)

    assert update(30.0, True) == 30.0
    assert update(100.0, True) == 100.0
    assert update(30.0, False) == pytest.approx(80.0)  # not a pause: a step


def test_gate_reads_probes_and_reports_state() -> None:
    h = LiveCapacity(BandwidthDelay(seed=1), initial=100)
    gate = Gate(h, now=0.0)
    assert gate.probes is h.probes
    state = gate.state(0.0)
    assert state["estimator"] == "bdp" and state["rate"] == 100 and state["lambda_new"] == 0


def test_invalid_configuration_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"capacity\.ceiling"):
        LiveCapacity(Static(1), floor=10, ceiling=5)
    with pytest.raises(ConfigError, match=r"capacity\.probe_mode"):
        LiveCapacity(Static(1), probe_mode="max")
    with pytest.raises(ConfigError, match=r"capacity\.min_samples"):
        LiveCapacity(Static(1), min_samples=0)
    with pytest.raises(ConfigError, match=r"capacity\.estimator"):
        LiveCapacity(object())  # type: ignore[arg-type]


class Recording(Static):
    """A fixed capacity that keeps the windows it was handed."""

    def __init__(self, capacity: float) -> None:
        super().__init__(capacity)
        self.windows: list = []

    def estimate(self, window):  # type: ignore[no-untyped-def]
        self.windows.append(window)
        return super().estimate(window)


@pytest.mark.parametrize(("width", "current"), [(0.05, 200.0), (0.1, 200.0), (0.25, 220.0)])
def test_the_windows_spans_are_seconds_whatever_the_probe_bucket_width(width: float, current: float) -> None:
    """Delivered over the newest 0.5 s, current over 0.2 s (as many whole buckets as come nearest: one 0.25 s
    bucket), whatever the width: 100/s for a second, 300/s for 0.3 s, 200/s for the last 0.2 s."""
    estimator = Recording(1000.0)
    h = LiveCapacity(estimator, initial=1000, min_samples=1, probes=Probes(width=width, buckets=80, now=0.0))
    p = h.probes
    t = 0.0
    for rate, until in ((100.0, 1.0), (300.0, 1.3), (200.0, 1.5)):
        while t < until - 1e-9:
            p.admit(t)
            p.complete(0.001, 200, t)
            h.rate(t)
            t += 1.0 / rate
    h.rate(1.5 + 1e-6)  # closes the last bucket and summarises
    window = estimator.windows[-1]
    assert window.delivered == pytest.approx((0.3 * 300 + 0.2 * 200) / 0.5, rel=0.05)
    assert window.current == pytest.approx(current, rel=0.05)


@pytest.mark.parametrize("width", [0.1, 0.3, 1.0])
def test_the_window_gives_drops_per_second_over_the_delivered_rates_span(width: float) -> None:
    """100 completions a second of which 40 are 503s: 40 drops a second whatever the width (bdp takes them
    off the delivered rate; a count over 0.6 s or 1 s read as over 0.5 s overstated them)."""
    estimator = Recording(1000.0)
    h = LiveCapacity(estimator, initial=1000, min_samples=1, probes=Probes(width=width, buckets=50, now=0.0))
    p = h.probes
    for i in range(300):  # 3 s at 100/s
        t = i / 100
        p.admit(t)
        p.complete(0.001, 503 if i % 5 < 2 else 200, t)
        h.rate(t)
    h.rate(3.0 + 1e-6)
    window = estimator.windows[-1]
    assert window.delivered == pytest.approx(100.0, rel=0.05)
    assert window.drop_rate == pytest.approx(40.0, rel=0.05)
