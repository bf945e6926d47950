"""The ``admitgate`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .core.errors import ConfigError


def _demo(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("admitgate demo needs uvicorn and httpx: pip install 'admitgate[server]'", file=sys.stderr)
        return 2
    from .demo import Upstream

    upstream = Upstream(args.workers, args.service_time, args.queue_timeout)
    capacity = upstream.capacity
    if args.herd:
        return _demo_herd(args, capacity)
    import uvicorn

    from .demo import demo_app

    options: dict[str, object] = {}
    if args.gate == "admitgate":
        from prometheus_client import REGISTRY

        from .core.settings import Settings

        options = {"metrics": REGISTRY}  # served at /metrics
        if args.spread != "schedule":  # otherwise the deployment's [settings] (if any) or the defaults
            options["settings"] = Settings(spread=args.spread)
        if args.rate is not None:
            options["rate"] = args.rate
    app = demo_app(upstream, gate=args.gate, **options)
    if not args.quiet:
        told = "learnt live" if args.rate is None else f"typed in: {args.rate:g} req/s"
        print(f"admitgate demo: /work has capacity {capacity:g} req/s; gate={args.gate} (capacity {told}); "
              f"http://{args.host}:{args.port}")  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)  # uvicorn's defaults
    return 0


def _demo_herd(args: argparse.Namespace, capacity: float) -> int:
    """``--herd N``: the lab's herd driver (``lab/herd.py``), which lives in the source tree, not in the package."""
    try:
        herd = importlib.import_module("lab.herd")
    except ImportError:
        print("admitgate demo --herd drives a herd with the source tree's lab (lab/herd.py): run it from a clone "
              "of the repository", file=sys.stderr)  # fmt: skip
        return 2
    return int(herd.demo_herd(args, capacity, _json))


def _plan(args: argparse.Namespace) -> int:
    from .planning.planner import drain_time, plan, prevent

    eps = None if args.eps in ("off", "none") else _number("eps", args.eps)
    result = plan(
        args.clients, args.headroom, service_time=args.service_time, connections=args.connections, eps=eps,
        retry_after=args.retry_after, remaining=args.remaining, reset=args.reset, deadline=args.deadline,
        sla_p95=args.sla_p95, cost_capacity=args.cost_capacity, cost_wait=args.cost_wait,
    )  # fmt: skip
    out: dict[str, object] = {"plan": result.to_dict()}
    lines = [result.table()]
    if result.feasible and result.window is not None:
        out["setting"] = {"spread": "jitter", "spread_window": round(result.window, 3)}
        lines.append(_setting(result.window))
    if args.period is not None:
        p = prevent(args.clients, args.headroom, args.period, eps=eps)
        out["prevention"] = {"period": p.period, "rate": p.rate, "safe_rate": p.safe_rate,
                             "full_jitter_safe": p.full_jitter_safe, "window": p.window}  # fmt: skip
        verdict = "safe" if p.full_jitter_safe else f"NOT safe: use a window of at least {p.window:.3f} s"
        lines.append(f"prevention: full jitter over T = {p.period:g} s gives {p.rate:.2f}/s "
                     f"(safe rate {p.safe_rate:.2f}/s): {verdict}")  # fmt: skip
    if args.ramp is not None:
        points = _ramp(args.ramp)
        t = drain_time(args.clients, points)
        out["recovery"] = {"ramp": points, "drain_s": t}
        lines.append(f"recovery: backlog {args.clients:,} drains in {t:.3f} s under the headroom ramp {points}")
    print(_json(out) if args.json else "\n".join(lines))
    return 0 if result.feasible else 1


def _setting(window: float) -> str:
    """What the planned window is in the gate's settings, and in a client's."""
    return (f"setting: W is the gate's Settings(spread=\"jitter\", spread_window={window:.3f}), or "
            f"ADMITGATE_SPREAD=jitter ADMITGATE_SPREAD_WINDOW={window:.3f}:\n"
            "  each rejected client is told a place drawn uniformly over W seconds of H (the default "
            "spread=\"schedule\" needs no window:\n  consecutive places at H, over M/H); for clients that "
            "pace themselves, the window each draws its delay from")  # fmt: skip


#: The rows of ``admitgate simulate``'s table, and what each means (seconds, requests/s; one column per run).
SIMULATE_ROWS = {
    "drain_s": "seconds from the release until the last herd client got a 2xx (inf: not drained)",
    "drain_ratio": "drain_s over the bound M/H: 1.0 is as fast as the headroom allows",
    "edge_peak_to_avg": "herd arrivals at the server: the busiest second over the mean second (1.0 is flat)",
    "upstream_peak_to_avg": "the same for requests forwarded to the upstream",
    "peak_concurrency": "the most requests the upstream held at once",
    "server_5xx": "5xx answers: the upstream's timeouts (the herd's and the new arrivals')",
    "attempts": "tries the herd made in all (first tries and retries)",
    "retry_after_min": "the shortest Retry-After told, seconds",
    "retry_after_p50": "the median Retry-After told, seconds",
    "retry_after_max": "the longest Retry-After told, seconds",
    "herd_latency_p50_s": "median seconds from a herd try to its 2xx",
    "herd_latency_p99_s": "99th percentile of the same",
    "background_success": "share of the new arrivals (one try each) answered 2xx",
    "background_p50_s": "median seconds a new arrival's 2xx took",
    "background_p99_s": "99th percentile of the same",
}


def _simulate(args: argparse.Namespace) -> int:
    from .config import tomllib
    from .sim.engine import simulate, stderr_progress
    from .sim.scenario import scenario_from

    if args.scenario and args.scenario.endswith(".toml"):
        try:
            with open(args.scenario, "rb") as fh:
                spec: str | dict[str, object] = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("scenario", f"cannot read {args.scenario}: {exc}") from None
    else:
        spec = args.scenario
    overrides = {"clients": args.clients, "policy": args.policy, "seed": args.seed,
                 "ignore_fraction": args.ignore_fraction, "spread": args.spread, "edge_cpu": args.edge_cpu}  # fmt: skip
    runs = []
    for gate in (True, False) if not args.gate_only else (True,):
        scenario = scenario_from(spec, gate=gate, **overrides)
        if args.json:
            runs.append(simulate(scenario))
        else:
            with stderr_progress(scenario.duration) as progress:
                runs.append(simulate(scenario, progress))
    if not args.json and not args.plot:
        for run in runs:
            del run["series"]
    if args.plot:
        from .sim.plot import plot

        plot(runs, args.plot)
    if args.json:
        print(_json(runs))
        return 0
    print(f"{runs[0]['scenario']}: {runs[0]['clients']:,} clients, bound M/H = {runs[0]['bound_s']} s")
    print(f"{'':22s}" + "".join(f"{r['gate']:>14s}" for r in runs))
    for k, meaning in SIMULATE_ROWS.items():
        print(f"{k:22s}" + "".join(f"{r[k]!s:>14s}" for r in runs) + f"   {meaning}")
    for r in runs:
        if r["finished"] < r["clients"]:
            why = (f"stopped at its time limit of {scenario.duration:g} simulated seconds (the scenario's duration)"
                   if r["simulated_s"] is not None else "ran out of events")  # fmt: skip
            print(f"{r['gate']}: {r['clients'] - r['finished']:,} of {r['clients']:,} clients had not finished when "
                  f"the run {why}: drain_s inf means not drained")  # fmt: skip
    return 0


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, since strict JSON has no Infinity or NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    """Strict JSON (RFC 8259): an infinite or undefined figure is written as null."""
    return json.dumps(_finite(value), indent=2, allow_nan=False)


def _number(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(name, "must be a number", raw) from None


def _ramp(raw: str) -> list[tuple[float, float]]:
    """``"0:500,10:2000"`` -> [(0, 500), (10, 2000)] (seconds: requests/s)."""
    try:
        return [(float(t), float(h)) for t, h in (item.split(":") for item in raw.split(","))]
    except ValueError:
        raise ConfigError("ramp", "expected t:H pairs like 0:500,10:2000", raw) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="admitgate", description="ASGI admission control that spreads herds.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    _plan_parser(sub)
    _simulate_parser(sub)
    return parser


def _demo_parser(sub: Any) -> None:
    """The ``demo`` command on ``sub`` (argparse's subparsers)."""
    demo = sub.add_parser("demo", help="serve the demo app behind the gate, or fire a herd at it (--herd N)")
    demo.add_argument("--host", default="127.0.0.1", help="address to serve on (default: %(default)s)")
    demo.add_argument("--port", type=int, default=8000, help="port to serve on (default: %(default)s)")
    demo.add_argument("--gate", choices=["admitgate", "none"], default="admitgate",
                      help="what guards the demo app (default: %(default)s)")  # fmt: skip
    demo.add_argument("--spread", choices=["schedule", "jitter"], default="schedule",
                      help="how Retry-After spreads a herd (default: %(default)s)")  # fmt: skip
    demo.add_argument("--workers", type=int, default=20, help="upstream workers K (default: %(default)s)")
    demo.add_argument("--service-time", type=float, default=0.1, help="seconds per request (default: %(default)s)")
    demo.add_argument("--queue-timeout", type=float, default=1.0,
                      help="503 after waiting this long for a worker, seconds (default: %(default)s)")  # fmt: skip
    demo.add_argument("--herd", type=int, default=0, metavar="N",
                      help="release N obeying clients and summarise (default: %(default)s, just serve)")  # fmt: skip
    demo.add_argument("--rate", type=float, default=None,
                      help="the service's capacity μ in req/s, typed in (default: none, learnt live)")  # fmt: skip
    demo.add_argument("--background", type=float, default=20.0,
                      help="new arrivals per second on /work during the herd (default: %(default)s)")  # fmt: skip
    demo.add_argument("--step", metavar="T:WORKERS",
                      help="capacity changes during the herd, e.g. 5:10 (10 workers from 5 s in)")  # fmt: skip
    demo.add_argument("--ignore-fraction", type=float, default=0.0,
                      help="share of clients ignoring Retry-After (default: %(default)s)")  # fmt: skip
    demo.add_argument("--unrecognisable", action="store_true", help="new connection per try, no cookies")
    demo.add_argument(
        "--deadline", type=float, default=90.0, help="bound on the herd run, seconds (default: %(default)s)"
    )
    demo.add_argument("--json", action="store_true", help="print the herd summary as JSON")
    demo.add_argument("--quiet", action="store_true", help="no start-up line")
    demo.set_defaults(func=_demo)


def _plan_parser(sub: Any) -> None:
    """The ``plan`` command on ``sub`` (argparse's subparsers)."""
    plan = sub.add_parser("plan", help="size the minimum safe jitter window for a cohort")
    plan.add_argument("--clients", "-M", type=int, required=True, help="cohort size M")
    plan.add_argument("--headroom", "-H", type=float, required=True, help="headroom H, requests/s")
    plan.add_argument("--service-time", type=float, help="tail (p90-p95) service time s, seconds")
    plan.add_argument("--connections", type=float, help="spare connections K")
    plan.add_argument("--eps", default="0.01",
                      help="overflow probability tolerance in [1e-12, 1), or 'off' (default: %(default)s)")  # fmt: skip
    plan.add_argument("--retry-after", type=float, default=0.0,
                      help="Retry-After offset Δ, seconds (default: %(default)s)")  # fmt: skip
    plan.add_argument("--remaining", type=float, help="server rate limit: requests remaining R")
    plan.add_argument("--reset", type=float, help="server rate limit: seconds until reset")
    plan.add_argument("--deadline", type=float, help="hard deadline D on the last arrival, seconds")
    plan.add_argument("--sla-p95", type=float, help="SLA on the p95 wait L, seconds")
    plan.add_argument("--cost-capacity", type=float, help="cost per unit capacity (per req/s)")
    plan.add_argument("--cost-wait", type=float, help="cost per request-second of wait")
    plan.add_argument("--period", type=float, help="prevention mode: period T of the synchronised task")
    plan.add_argument("--ramp", help="recovery mode: headroom ramp as t:H points, e.g. 0:500,10:2000")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (null where a figure is infinite)")
    plan.set_defaults(func=_plan)


def _simulate_parser(sub: Any) -> None:
    """The ``simulate`` command on ``sub`` (argparse's subparsers)."""
    from .sim.scenario import SCENARIOS

    rows = "\n".join(f"  {row:22s}{meaning}" for row, meaning in SIMULATE_ROWS.items())
    sim = sub.add_parser("simulate", help="run a herd against the real gate on a virtual clock",
                         description="Run a herd against the real gate on a virtual clock, with the gate and "
                                     "without it (one column each).",
                         epilog=f"rows of the table:\n{rows}",
                         formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sim.add_argument("scenario", nargs="?", default="cache-expiry",
                     help=f"a scenario.toml, or an embedded scenario: {', '.join(SCENARIOS)} "
                          "(default: %(default)s)")  # fmt: skip
    sim.add_argument("--clients", type=int, help="herd size (default: the scenario's)")
    sim.add_argument("--policy", help="obey, obey-jitter, ignore, full, equal, decorrelated (default: the scenario's)")
    sim.add_argument("--ignore-fraction", type=float, help="share ignoring Retry-After (default: the scenario's)")
    sim.add_argument("--spread", choices=["schedule", "jitter"], help="spreading policy (default: the scenario's)")
    sim.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    sim.add_argument(
        "--edge-cpu", type=float, help="server CPU seconds per request on one core (default: the scenario's)"
    )
    sim.add_argument("--gate-only", action="store_true", help="skip the run without the gate")
    sim.add_argument("--plot", metavar="PNG", help="save a plot (needs the 'plot' extra: matplotlib)")
    sim.add_argument("--json", action="store_true", help="print the runs as JSON (null where a figure is infinite)")
    sim.set_defaults(func=_simulate)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:  # bad input: a clear message naming the argument, exit code 2
        print(str(exc).replace("admitgate: invalid ", f"admitgate {args.command}: invalid --", 1).replace("_", "-"),
              file=sys.stderr)  # fmt: skip
        return 2
