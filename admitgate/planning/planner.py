"""The window planner: the minimum safe jitter window for a cohort, and whether one exists.

    >>> p = plan(50_000, 2_000)
    >>> round(p.window, 2), p.binding
    (26.34, 'probabilistic')

M clients spread uniformly over a window of W seconds arrive at M/W per second. Lower bounds on W:

* rate: W >= M/H (H: headroom, requests/s);
* concurrency: W >= M*s/K (s: tail service time, s; K: spare connections), by Little's law;
* probabilistic: arrivals in any second are about Poisson(M/W); require P(count > H) <= eps,
  i.e. M/W <= λ_ε. λ_ε is found from the exact Poisson tail; the normal approximation is shown beside it;
* rate limit: R requests remaining, reset in Δ_rl seconds, admit at min(H, R/Δ_rl): W >= M / that.

Upper bounds: a hard deadline D on the last arrival (Δ + W <= D) and an SLA on the p95 wait
(Δ + 0.95 W <= L), where Δ is a Retry-After offset at which the window starts. The window is the
largest lower bound; if it exceeds the smallest upper bound the plan is infeasible, and the result
says which constraints collide and what capacity or relaxation would make them fit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..core.errors import ConfigError, integer
from .poisson import max_safe_rate, normal_safe_rate

#: The smallest overflow tolerance ε: the normal approximation needs Φ⁻¹(1 − ε), and 1 − ε in double
#: precision is off by up to 1.1e-16, which is 0.01 % of 1e-12 (and all of ε below 1.1e-16).
MIN_EPS = 1e-12
#: Beyond these the Poisson tail takes seconds and loses its precision, and M/H its exactness: no one
#: service sees a billion requests a second, nor a cohort of 10¹² clients.
MAX_HEADROOM = 1e9
MAX_CLIENTS = 10**12


@dataclass(frozen=True)
class Bound:
    name: str  # rate | concurrency | probabilistic | rate-limit | deadline | sla-p95
    kind: str  # lower | upper (on W, seconds)
    seconds: float
    detail: str


@dataclass(frozen=True)
class Optimum:
    """Economic optimum W* = sqrt(2 c_cap / c_wait), clamped to the feasible range."""

    unconstrained: float
    window: float
    capacity_cost: float  # c_cap * M / W
    wait_cost: float  # c_wait * M * W / 2
    total_cost: float


@dataclass(frozen=True)
class Plan:
    clients: int
    headroom: float
    start: float  # Δ: the window opens this many seconds from now
    bounds: tuple[Bound, ...]
    lower: float
    upper: float
    feasible: bool
    window: float | None  # W, seconds (None when infeasible)
    binding: str | None
    peak_rate: float | None  # M/W, arrivals per second
    expected_wait: float | None  # Δ + W/2
    p95_wait: float | None  # Δ + 0.95 W
    exact_safe_rate: float | None = None  # λ_ε from the Poisson tail
    normal_safe_rate: float | None = None  # λ_ε from the normal approximation
    optimum: Optimum | None = None
    conflict: str | None = None
    remedies: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """A human-readable report."""
        rows = [f"cohort M = {self.clients:,}, headroom H = {self.headroom:g}/s, window opens at Δ = {self.start:g} s"]
        rows.append(f"{'constraint':14s} {'bound':>6s} {'seconds':>10s}  detail")
        for b in self.bounds:
            mark = " <- binding" if b.name == self.binding else ""
            rows.append(f"{b.name:14s} {b.kind:>6s} {b.seconds:10.3f}  {b.detail}{mark}")
        if self.exact_safe_rate is not None:
            rows.append(
                f"safe arrival rate λ_ε: exact Poisson {self.exact_safe_rate:.2f}/s, "
                f"normal approximation {self.normal_safe_rate:.2f}/s"
            )
        if self.feasible:
            rows.append(f"window W = {self.window:.3f} s (peak {self.peak_rate:.1f}/s); "
                        f"expected wait {self.expected_wait:.3f} s, p95 {self.p95_wait:.3f} s")  # fmt: skip
        else:
            rows.append(f"INFEASIBLE: {self.conflict}")
            rows.extend(f"  - {r}" for r in self.remedies)
        if self.optimum is not None:
            o = self.optimum
            costs = f"capacity cost {o.capacity_cost:.4g} + wait cost {o.wait_cost:.4g} = {o.total_cost:.4g}"
            rows.append(f"economic optimum W* = {o.unconstrained:.3f} s, clamped to {o.window:.3f} s: {costs}")
        return "\n".join(rows)


def _positive(name: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, "must be a finite number", value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, "must be >= 0" if allow_zero else "must be > 0", value)


def plan(
    clients: int,
    headroom: float,
    *,
    service_time: float | None = None,
    connections: float | None = None,
    eps: float | None = 0.01,
    retry_after: float = 0.0,
    remaining: float | None = None,
    reset: float | None = None,
    deadline: float | None = None,
    sla_p95: float | None = None,
    cost_capacity: float | None = None,
    cost_wait: float | None = None,
) -> Plan:
    """Size the jitter window for ``clients`` against ``headroom`` requests/s (see the module docstring)."""
    _check(clients, headroom, service_time, connections, eps, retry_after, remaining, reset, deadline, sla_p95,
           cost_capacity, cost_wait)  # fmt: skip
    m, h = clients, float(headroom)
    bounds, exact, normal = _bounds(m, h, service_time, connections, eps, retry_after, remaining, reset, deadline,
                                    sla_p95)  # fmt: skip
    lowers = [b for b in bounds if b.kind == "lower"]
    uppers = [b for b in bounds if b.kind == "upper"]
    low = max(lowers, key=lambda b: b.seconds)
    high = min(uppers, key=lambda b: b.seconds) if uppers else None
    upper = high.seconds if high else math.inf
    feasible = math.isfinite(low.seconds) and low.seconds <= upper and upper > 0
    optimum = None
    if cost_capacity is not None and cost_wait is not None and feasible:
        w_star = math.sqrt(2 * cost_capacity / cost_wait)
        w = min(max(w_star, low.seconds), upper)
        cap, wait = cost_capacity * m / w, cost_wait * m * w / 2
        optimum = Optimum(w_star, w, cap, wait, cap + wait)
    if not feasible:
        if not math.isfinite(low.seconds):
            conflict = f"{low.name} allows no finite window: {low.detail}"
            remedies = _unbounded_remedies(low, reset)
        else:
            assert high is not None
            conflict = f"{low.name} needs W >= {low.seconds:.3f} s but {high.name} allows W <= {max(upper, 0):.3f} s"
            remedies = _remedies(m, h, low, high, upper, retry_after, service_time, connections, eps, reset)
        return Plan(m, h, retry_after, tuple(bounds), low.seconds, upper, False, None, None, None, None, None,
                    exact, normal, None, conflict, remedies)  # fmt: skip
    window = optimum.window if optimum else low.seconds
    if not optimum or window == low.seconds:
        binding = low.name
    else:  # the optimum lies above the lower bound: free, or clamped by the tightest upper bound
        binding = high.name if high is not None and window >= upper else "economic"
    return Plan(m, h, retry_after, tuple(bounds), low.seconds, upper, True, window, binding, m / window,
                retry_after + window / 2, retry_after + 0.95 * window, exact, normal, optimum)  # fmt: skip


def _check(clients: int, headroom: float, service_time: float | None, connections: float | None, eps: float | None,
           retry_after: float, remaining: float | None, reset: float | None, deadline: float | None,
           sla_p95: float | None, cost_capacity: float | None, cost_wait: float | None) -> None:  # fmt: skip
    """:func:`plan`'s arguments, each checked (a ConfigError names the one at fault)."""
    integer("clients", clients, 1)
    if clients > MAX_CLIENTS:
        raise ConfigError("clients", f"must be <= {MAX_CLIENTS:,}", clients)
    _positive("headroom", headroom)
    if headroom > MAX_HEADROOM:
        raise ConfigError("headroom", f"must be <= {MAX_HEADROOM:g} requests/s", headroom)
    for name, value in (("service_time", service_time), ("connections", connections), ("reset", reset),
                        ("deadline", deadline), ("sla_p95", sla_p95), ("cost_capacity", cost_capacity),
                        ("cost_wait", cost_wait)):  # fmt: skip
        _positive(name, value)
    _positive("retry_after", retry_after, allow_zero=True)
    _positive("remaining", remaining, allow_zero=True)
    if eps is not None and not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and MIN_EPS <= eps < 1):
        raise ConfigError("eps", f"must be in [{MIN_EPS:g}, 1): smaller tolerances are lost to rounding in 1 − ε", eps)
    if (service_time is None) != (connections is None):
        missing = "connections" if connections is None else "service_time"
        raise ConfigError(missing, "needs service_time and connections together")
    if (remaining is None) != (reset is None):
        raise ConfigError("reset" if reset is None else "remaining", "needs remaining and reset together")
    if (cost_capacity is None) != (cost_wait is None):
        raise ConfigError("cost_wait" if cost_wait is None else "cost_capacity", "needs both cost terms")
    if cost_capacity is not None and cost_wait is not None and not math.isfinite(2 * cost_capacity / cost_wait):
        raise ConfigError("cost_wait", "cost_capacity / cost_wait overflows", cost_wait)


def _bounds(m: int, h: float, service_time: float | None, connections: float | None, eps: float | None,
            retry_after: float, remaining: float | None, reset: float | None, deadline: float | None,
            sla_p95: float | None) -> tuple[list[Bound], float | None, float | None]:  # fmt: skip
    """The window's lower and upper bounds for ``m`` clients at ``h`` requests/s, and the exact and normal safe
    arrival rates (requests/s; None without a tolerance ``eps``)."""
    bounds = [Bound("rate", "lower", m / h, f"M/H = {m:,}/{h:g}")]
    if service_time is not None and connections is not None:
        bounds.append(Bound("concurrency", "lower", m * service_time / connections,
                            f"M·s/K = {m:,}·{service_time:g}/{connections:g}"))  # fmt: skip
    exact = normal = None
    if eps is not None:
        exact, normal = max_safe_rate(h, eps), normal_safe_rate(h, eps)
        # no arrival rate is safe when the tolerance is below what rounds to zero (a headroom under 1/s, a
        # tiny eps): then no window is long enough
        lower, approx = (m / exact if exact > 0 else math.inf), (m / normal if normal > 0 else math.inf)
        bounds.append(Bound("probabilistic", "lower", lower,
                            f"P(Poisson(M/W) > {math.floor(h)}) <= {eps:g}: M/W <= {exact:.2f}/s "
                            f"(normal approx. {normal:.2f}/s, W >= {approx:.3f} s)"))  # fmt: skip
    if remaining is not None and reset is not None:
        admitted = min(h, remaining / reset)
        if admitted <= 0:
            bounds.append(Bound("rate-limit", "lower", math.inf, "no requests remaining in the rate limit"))
        else:
            bounds.append(Bound("rate-limit", "lower", m / admitted,
                                f"M/min(H, R/Δ) = {m:,}/min({h:g}, {remaining:g}/{reset:g})"))  # fmt: skip
    if deadline is not None:
        bounds.append(Bound("deadline", "upper", deadline - retry_after, f"Δ + W <= D = {deadline:g}"))
    if sla_p95 is not None:
        bounds.append(Bound("sla-p95", "upper", (sla_p95 - retry_after) / 0.95, f"Δ + 0.95·W <= L = {sla_p95:g}"))
    return bounds, exact, normal


def _remedies(m: int, h: float, low: Bound, high: Bound, upper: float, delta: float, s: float | None,
              k: float | None, eps: float | None, reset: float | None) -> tuple[str, ...]:  # fmt: skip
    out: list[str] = []
    if upper <= 0:
        return (f"the Retry-After offset Δ = {delta:g} s alone exceeds the {high.name} bound: shorten Δ",)
    if low.name == "rate":
        out.append(f"raise headroom to H >= {m / upper:.1f}/s (+{(m / upper / h - 1) * 100:.1f} %)")
    elif low.name == "concurrency" and s is not None and k is not None:
        out.append(f"raise spare connections to K >= {math.ceil(m * s / upper)} (now {k:g}), or cut the tail "
                   f"service time to s <= {upper * k / m:.4g} s")  # fmt: skip
    elif low.name == "probabilistic" and eps is not None:
        need = m / upper
        lo, hi = h, max(2 * h, need * 2 + 100)
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if max_safe_rate(mid, eps) < need else (lo, mid)
        out.append(f"raise headroom to H >= {hi:.1f}/s (+{(hi / h - 1) * 100:.1f} %) at eps = {eps:g}, "
                   f"or accept a larger overflow probability")  # fmt: skip
    elif low.name == "rate-limit" and reset is not None:
        out.append(f"the server's limit must admit >= {m / upper:.1f}/s: R >= {m / upper * reset:.0f} per {reset:g} s")
    if high.name == "deadline":
        out.append(f"or relax the deadline to D >= {delta + low.seconds:.3f} s")
    else:
        out.append(f"or relax the p95 SLA to L >= {delta + 0.95 * low.seconds:.3f} s")
    return tuple(out)


def _unbounded_remedies(low: Bound, reset: float | None) -> tuple[str, ...]:
    if low.name == "rate-limit" and reset is not None:
        return (f"wait for the rate limit to reset (in {reset:g} s) and plan again with the new R",)
    return (f"the {low.name} bound overflows: give M and H in a range where M/H is finite",)


@dataclass(frozen=True)
class Prevention:
    """Periodic task: full jitter over the period T is safe when M/T is within the safe rate."""

    period: float
    full_jitter_safe: bool
    rate: float  # M/T
    safe_rate: float
    window: float  # T if full jitter is safe, else the minimum safe window
    plan: Plan


def prevent(clients: int, headroom: float, period: float, *, eps: float | None = 0.01) -> Prevention:
    """Prevention mode: cohort of ``clients`` repeating every ``period`` seconds."""
    _positive("period", period)
    p = plan(clients, headroom, eps=eps)
    safe = p.exact_safe_rate if p.exact_safe_rate is not None else headroom
    rate = clients / period
    ok = rate <= safe and rate < headroom
    return Prevention(period, ok, rate, safe, period if ok else max(p.lower, period), p)


def drain_time(backlog: float, headroom: Sequence[tuple[float, float]]) -> float:
    """Recovery mode: the least T with ∫_0^T H(t) dt = backlog, for H(t) piecewise linear through
    ``headroom`` points (t seconds, H requests/s) and constant after the last one. Points at the same
    time are a step, taken in the order given: ``[(0, 180), (2, 180), (2, 80)]`` steps down at 2 s.

    >>> drain_time(1000, [(0, 100)])
    10.0
    >>> drain_time(1500, [(0, 0), (10, 200)])  # ramp 0 -> 200/s over 10 s holds 1000, then 500 at 200/s
    12.5
    """
    _positive("backlog", backlog)
    for point in headroom:
        if not isinstance(point, (tuple, list)) or len(point) != 2:
            raise ConfigError("ramp", "expected (t, H) pairs", point)
        t, rate = point
        _positive("ramp", rate, allow_zero=True)
        _positive("ramp", t, allow_zero=True)
    # Sort on time only, stably: two points at one time are a step, and their given order says which way
    # it goes (sorting on (t, H) would turn every step down into a step up).
    points = sorted(headroom, key=lambda point: point[0])
    if not points or points[0][0] != 0:
        raise ConfigError("ramp", "needs a point at t = 0", points)
    if points[-1][1] <= 0:
        raise ConfigError("ramp", "the final headroom must be > 0", points)
    done = 0.0
    for (t0, h0), (t1, h1) in itertools.pairwise(points):
        if t1 == t0:  # a step: H jumps from h0 to h1 at t0
            continue
        area = (h0 + h1) / 2 * (t1 - t0)
        if done + area >= backlog:
            need = backlog - done  # solve h0·x + (h1 − h0)/(2Δt)·x² = need for x in [0, Δt]
            slope = (h1 - h0) / (t1 - t0)
            x = need / h0 if slope == 0 else (-h0 + math.sqrt(h0 * h0 + 2 * slope * need)) / slope
            return t0 + x
        done += area
    t_last, h_last = points[-1]
    return t_last + (backlog - done) / h_last
