"""Metrics: prometheus-client exposition from the gate's aggregates, checked by promtool and a real Prometheus."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, BandwidthDelay, LiveCapacity, ManualClock, QueueDelay, Settings
from admitgate import metrics as m
from admitgate.core.gate import PACING_BOUNDS, Gate
from admitgate.core.probes import LATENCY_BOUNDS
from admitgate.demo import Upstream, demo_app
from lab.serving import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = ROOT / "dashboards" / "admitgate.json"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is required (Debian package 'prometheus'; .ci/run installs it)"
    return path


async def ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.anyio
async def test_exposition_is_derived_from_the_gate(clock: ManualClock) -> None:
    from tests.test_middleware import call, http_scope

    registry = CollectorRegistry()
    gate = AdmitGate(
        ok_app,
        rate=LiveCapacity(BandwidthDelay(seed=1), initial=1, floor=1, now=clock()),
        routes={"/items/{id}": {"cost": 1}},
        clock=clock,
        metrics=registry,
        settings=Settings(burst=1, max_pacing_delay=0),
    )
    assert (await call(gate, http_scope("/items/1")))[0] == 200
    assert (await call(gate, http_scope("/items/2")))[0] == 429
    got = samples(registry)

    def key(verdict: str) -> tuple[str, tuple]:
        labels = (("class", "default"), ("route", "/items/{id}"), ("verdict", verdict))
        return f"{m.REQUESTS}_total", labels

    assert (got[key("admitted")], got[key("rejected")], got[key("abandoned")]) == (1, 1, 0)
    assert got[f"{m.PACED}_total", (("class", "default"), ("route", "/items/{id}"))] == 0
    assert got[f"{m.RETRY_AFTER}_count", ()] == 1
    assert got[f"{m.REQUEST_LATENCY}_count", ()] == 1
    assert got[m.RATE, ()] == 1.0 and got[m.FLOOR, ()] == 1.0
    assert got[m.ESTIMATOR, (("estimator", "bdp"), ("state", "warming"))] == 1
    assert not any("items/1" in str(labels) for _, labels in got)  # templates, never raw paths


@pytest.mark.anyio
async def test_the_most_rejected_tenants_are_exported_by_a_digest_of_their_key(clock: ManualClock) -> None:
    from admitgate import Tenancy
    from tests.test_middleware import call, http_scope

    async def run(tenancy: Tenancy) -> dict[tuple[str, tuple], float]:
        registry = CollectorRegistry()
        gate = AdmitGate(ok_app, rate=30, clock=clock, metrics=registry, tenants=tenancy,
                         settings=Settings(burst=1, max_pacing_delay=0, tarpit=0))  # fmt: skip
        for i in range(15):  # 15 tenants; tenant i sends 5 + i requests at once: the later ones rejected more
            for _ in range(5 + i):
                await call(gate, http_scope("/", headers=[(b"x-api-key", f"key-{i:02}".encode())]))
        return samples(registry)

    got = await run(Tenancy(key="header:x-api-key", establish=1))
    assert got[m.HOLDERS, ()] > 0  # the places are held in the tenants' schedules, not the root's
    rejected = {dict(labels)["tenant"]: v for (name, labels), v in got.items() if name == f"{m.TENANT_REJECTED}_total"}
    shares = {dict(labels)["tenant"] for (name, labels), _ in got.items() if name == m.TENANT_SHARE}
    assert len(rejected) == m.TOP_TENANTS and shares == set(rejected)
    assert not any("key-" in str(labels) for _, labels in got)  # a tenant key may be a secret: never shown
    assert all(re.fullmatch(r"#[0-9a-f]{12}", tenant) for tenant in rejected)
    named = await run(Tenancy(key="header:x-api-key", establish=1, label=str))
    tenants = {dict(labels)["tenant"] for (name, labels), _ in named.items() if name == f"{m.TENANT_REJECTED}_total"}
    assert tenants == {f"key-{i:02}" for i in range(5, 15)}  # the ten rejected most


def test_what_the_pools_admitted_on_what_the_others_left_is_counted_and_is_0_without_tenants() -> None:
    """``admitgate_spare_requests_total`` is the tenants' table's running count (pools come and go; it does not), and
    0 without tenants. (Multi-process mode syncs it as it syncs the other unlabelled counters; the multi-process
    tests below fail without it there, but run no tenants.)"""
    from admitgate import Tenancy

    registry = CollectorRegistry()
    gate = AdmitGate(ok_app, rate=30, metrics=registry, tenants=Tenancy(key="header:x-api-key"))
    assert gate.tenants is not None
    gate.tenants.spare = 7
    assert samples(registry)[f"{m.SPARE}_total", ()] == 7
    plain = CollectorRegistry()
    AdmitGate(ok_app, rate=30, metrics=plain)
    assert samples(plain)[f"{m.SPARE}_total", ()] == 0


def test_multiprocess_mode_exports_no_series_per_tenant() -> None:
    """Which tenants are rejected most changes; a worker's series cannot be withdrawn from the shared files
    through prometheus-client's public API, so per-tenant series there would grow with every key that was
    ever in a top 10: none are written."""
    from admitgate import Tenancy

    gate = AdmitGate(ok_app, rate=30, tenants=Tenancy(key="header:x-api-key"))
    sync = m.MultiprocessSync(gate)
    metrics = [v for value in vars(sync).values() for v in (value.values() if isinstance(value, dict) else [value])]
    names = {family.name for metric in metrics if hasattr(metric, "describe") for family in metric.describe()}
    assert m.REQUESTS in names and not any("tenant" in name for name in names)


def test_no_registry_no_metrics() -> None:
    gate = AdmitGate(ok_app, rate=5)
    assert gate.tally == {} and not gate._tally_on


@pytest.mark.integration
def test_promtool_accepts_the_exposition_and_the_deploy_files(tmp_path) -> None:
    registry = CollectorRegistry()
    AdmitGate(ok_app, rate=LiveCapacity(BandwidthDelay(seed=1)), metrics=registry)
    check = subprocess.run([promtool(), "check", "metrics"], input=generate_latest(registry), capture_output=True)
    assert check.returncode == 0, check.stderr.decode() + check.stdout.decode()
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                 ["test", "rules", "alerts_test.yml"]):  # fmt: skip
        out = subprocess.run([promtool(), *args], cwd=DEPLOY, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus datasource writes it into a query: escaped alternatives."""
    return "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values) + ")"


def resolve_variables(dashboard: dict, prometheus_url: str) -> dict[str, list[str]]:
    """Each query variable's ``label_values(selector, label)``, evaluated in order as Grafana does."""
    values: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"]
        for name, found in values.items():
            query = query.replace(f"${name}", grafana_regex(found))
        selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", query).groups()
        reply = httpx.get(f"{prometheus_url}/api/v1/label/{label}/values", params={"match[]": selector}, timeout=5)
        values[variable["name"]] = reply.json()["data"]
        assert values[variable["name"]], f"dashboard variable ${variable['name']} has no values ({query})"
    return values


def panel_query(expr: str, selection: dict[str, str]) -> str:
    """A panel query with the variables filled in, on this test's time scale (seconds of data, not minutes)."""
    short = {"$__rate_interval": "10s", "[30s]": "[5s]", ":15s]": ":1s]", "[5m:": "[20s:"}
    for old, new in [*short.items(), *((f"${name}", value) for name, value in selection.items())]:
        expr = expr.replace(old, new)
    return expr


def test_dashboard_filters_every_panel_and_keeps_window_and_state_apart() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance", "route"} <= variables
    panels = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}
    for title, exprs in panels.items():
        for expr in exprs:
            assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, (title, expr)
            assert set(re.findall(r"\$(\w+)", expr)) <= variables | {"__rate_interval"}, expr
            assert m.REQUESTS not in expr or 'route=~"$route"' in expr, expr
    by_route = [t for t, exprs in panels.items() if any("by (route)" in e and 'verdict="rejected"' in e for e in exprs)]
    assert by_route, "no per-route rejection panel"
    for exprs in panels.values():  # different units: seconds vs a 0/1 state
        assert not (any(m.WINDOW in e for e in exprs) and any(m.ESTIMATOR in e for e in exprs))
    assert any(m.WINDOW in e for exprs in panels.values() for e in exprs)
    assert any(m.ESTIMATOR in e for exprs in panels.values() for e in exprs)


@pytest.mark.integration
def test_real_prometheus_scrapes_and_every_panel_and_alert_query_returns_series(serve, tmp_path) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is required (Debian package 'prometheus'; .ci/run installs it)"
    registry = CollectorRegistry()
    live = LiveCapacity(BandwidthDelay(seed=1), initial=100, floor=1)
    app = demo_app(Upstream(workers=4, service_time=0.02), metrics=registry, rate=live, settings=Settings(burst=4))
    with serve(app) as url:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(f"""global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: admitgate
    static_configs: [{{targets: ["{url.removeprefix("http://")}"]}}]
""")
        proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        stop = threading.Event()

        def load() -> None:  # more than the gate's 100/s: admitted, paced and rejected all happen
            with httpx.Client(base_url=url, timeout=5) as client:
                while not stop.is_set():
                    for _ in range(20):
                        client.get("/work")

        threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            api = f"http://127.0.0.1:{port}/api/v1/query"
            deadline = time.monotonic() + 60
            # Until rate() over the scrapes has something at a subquery's step, as the peak/average panels ask
            # (their [20s:1s] steps fall on whole seconds: an instant rate() can have a value before any step does)
            ready = f"max_over_time(sum(rate({m.REQUESTS}_total[5s]))[20s:1s])"
            while True:
                try:  # until it is ready (it answers 503 with a text body while starting)
                    reply = httpx.get(api, params={"query": ready}, timeout=2)
                    r = reply.json() if reply.status_code == 200 else {"data": {"result": []}}
                    if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) > 0:
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                assert time.monotonic() < deadline, "Prometheus never scraped the app"
                time.sleep(0.5)
            dashboard = json.loads(DASHBOARD.read_text())
            variables = resolve_variables(dashboard, f"http://127.0.0.1:{port}")
            assert "/work" in variables["route"], variables  # the demo's route template, not "*"
            chosen = {name: grafana_regex(values) for name, values in variables.items()}
            everything = dict.fromkeys(variables, ".*")  # "All"
            exprs = [panel_query(target["expr"], selection) for selection in (chosen, everything)
                     for panel in dashboard["panels"] for target in panel["targets"]]  # fmt: skip
            import yaml

            rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
            alert_exprs = [r["expr"].replace("offset 1h", "offset 1s") for g in rules["groups"] for r in g["rules"]]
            for expr in exprs:
                r = httpx.get(api, params={"query": expr}, timeout=5).json()
                assert r["status"] == "success", (expr, r)
                assert r["data"]["result"], f"no series for panel query {expr}"
            for expr in alert_exprs:  # valid; alert conditions are not expected to be true here
                r = httpx.get(api, params={"query": expr}, timeout=5).json()
                assert r["status"] == "success", (expr, r)
        finally:
            stop.set()
            for t in threads:
                t.join(15)
            proc.terminate()
            proc.wait(10)


@contextlib.contextmanager
def workers(target: str, directory: Path) -> Iterator[str]:
    """``uvicorn <target> --workers 2`` with ``PROMETHEUS_MULTIPROC_DIR=directory``; yield its URL once it answers."""
    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", target, "--workers", "2", "--port", str(port),
                             "--host", "127.0.0.1", "--log-level", "warning"], cwd=ROOT, env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/metrics", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "uvicorn --workers 2 did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


def scrape(url: str) -> tuple[str, dict[tuple[str, tuple], float]]:
    text = httpx.get(url + "/metrics", timeout=5).text
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    return text, got


def total(got: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return sum(v for (n, key), v in got.items() if n == name and set(labels.items()) <= set(key))


def synced(url: str, check: Callable[[dict[tuple[str, tuple], float]], None]) -> tuple[str, dict]:
    """The first scrape that passes ``check`` (its assertions): each worker writes its figures at its next sync,
    once a second, so a scrape can come before one of them has. Waits up to 30 s, then the last scrape's
    failure is the test's."""
    deadline = time.monotonic() + 30
    while True:
        text, got = scrape(url)
        try:
            check(got)
            return text, got
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@pytest.mark.integration
def test_multiprocess_mode_adds_up_every_worker(tmp_path) -> None:
    def started(got: dict) -> None:  # both workers have synced (from lifespan start-up), before any request
        states = {key: v for (name, key), v in got.items() if name == m.ESTIMATOR}
        assert states and set(states.values()) <= {0.0, 1.0} and 1.0 in states.values(), states  # not 2
        assert got.get((m.FLOOR, ())) == 2 * 3  # each worker's floor, added up as the rates are
        assert got[m.RATE, ()] >= got[m.FLOOR, ()]

    def served(got: dict) -> None:
        assert total(got, f"{m.REQUESTS}_total", verdict="admitted") == 300
        assert got[f"{m.REQUEST_LATENCY}_count", ()] == 300
        assert got[f"{m.REQUEST_LATENCY}_bucket", (("le", "+Inf"),)] == 300
        assert set(v for (name, _), v in got.items() if name == m.ESTIMATOR) <= {0.0, 1.0}

    with workers("tests.mp_app:app", tmp_path) as url:
        synced(url, started)
        for _ in range(300):  # a new connection each time, so both workers take some
            assert httpx.get(url + "/", timeout=5, headers={"connection": "close"}).status_code == 200
        text, _ = synced(url, served)
        writers = {p.name.rsplit("_", 1)[-1] for p in tmp_path.glob("counter_*.db")}
        assert len(writers) == 2, writers  # both workers wrote their share
        check = subprocess.run([promtool(), "check", "metrics"], input=text.encode(), capture_output=True)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert not list(tmp_path.glob("gauge_live*.db"))  # a worker that shuts down takes its live gauges along


@pytest.mark.integration
def test_multiprocess_static_rate_exports_no_unset_gauges_and_exact_histograms(tmp_path) -> None:
    def counted(got: dict) -> None:
        assert total(got, f"{m.REQUESTS}_total", verdict="admitted") == 200 - len(retry_after)
        assert total(got, f"{m.REQUESTS}_total", verdict="rejected") == len(retry_after)
        assert got[f"{m.RETRY_AFTER}_count", ()] == len(retry_after)
        assert got[f"{m.RETRY_AFTER}_sum", ()] == sum(retry_after)  # exact, through observe() alone
        for bound in m.RETRY_AFTER_BOUNDS:
            le = (("le", repr(float(bound))),)
            assert got[f"{m.RETRY_AFTER}_bucket", le] == sum(v <= bound for v in retry_after), bound

    with workers("tests.mp_app:static_app", tmp_path) as url:
        replies = [httpx.get(url + "/", timeout=5, headers={"connection": "close"}) for _ in range(200)]
        retry_after = [int(r.headers["retry-after"]) for r in replies if r.status_code == 429]
        assert retry_after and len(retry_after) + sum(r.status_code == 200 for r in replies) == 200
        text, got = synced(url, counted)
    names = {name for name, _ in got}
    assert not names & {m.FLOOR, m.BASELINE, m.LATENCY}, names  # no estimator: absent, as in one process, not 0
    assert got[m.ESTIMATOR, (("estimator", "static"), ("state", "static"))] == 1  # not one per worker
    check = subprocess.run([promtool(), "check", "metrics"], input=text.encode(), capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


@st.composite
def histogram_batches(draw: st.DrawFn) -> tuple[tuple[float, ...], list[list[float]], bool]:
    """Bounds of one of the gate's histograms and values in batches (one per sync), bucket edges included;
    and whether the values are whole seconds, as Retry-After values are."""
    bounds = draw(st.sampled_from([m.RETRY_AFTER_BOUNDS, LATENCY_BOUNDS, PACING_BOUNDS]))
    whole = draw(st.booleans())
    value = st.integers(0, 300).map(float) if whole else st.floats(0, 3 * bounds[-1]) | st.sampled_from(bounds)
    return bounds, draw(st.lists(st.lists(value, max_size=40), min_size=1, max_size=4)), whole


@given(histogram_batches())
def test_pre_aggregated_counts_are_observed_exactly(case) -> None:
    bounds, batches, whole = case
    direct, replayed = CollectorRegistry(), CollectorRegistry()
    one_by_one = Histogram("h", "h", buckets=bounds, registry=direct)
    aggregated = Histogram("h", "h", buckets=bounds, registry=replayed)
    total = held = 0.0
    for batch in batches:  # one batch per sync
        counts = [0] * (len(bounds) + 1)
        for value in batch:
            one_by_one.observe(value)
            counts[bisect_left(bounds, value)] += 1  # as the gate counts
            total += value  # and adds up
        held = m.observe_counts(aggregated, bounds, counts, held, total)
    for le in [*(repr(float(b)) for b in bounds), "+Inf"]:
        assert replayed.get_sample_value("h_bucket", {"le": le}) == direct.get_sample_value("h_bucket", {"le": le})
    assert replayed.get_sample_value("h_sum") == held and direct.get_sample_value("h_sum") == total
    # exact for whole seconds; otherwise an ulp can go when the remainder sits on a bucket's edge
    assert held == total if whole else held == pytest.approx(total, rel=1e-12, abs=1e-15)


def test_metrics_module_uses_only_public_prometheus_client_api() -> None:
    tree = ast.parse((ROOT / "admitgate" / "metrics.py").read_text())
    private = [f"{ast.unparse(node.value)}.{node.attr}" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and not (isinstance(node.value, ast.Name) and node.value.id == "self")]  # fmt: skip
    imported = [(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for a in node.names if a.name.startswith("_") or "._" in (node.module or "")]  # fmt: skip
    assert private == [] and imported == []


@pytest.mark.anyio
async def test_a_typed_in_rate_exports_latency_in_flight_and_responses(clock: ManualClock) -> None:
    from tests.test_middleware import call, http_scope

    registry = CollectorRegistry()
    gate = AdmitGate(ok_app, rate=10, clock=clock, metrics=registry, settings=Settings(burst=2, max_pacing_delay=0))
    statuses = [(await call(gate, http_scope("/a")))[0] for _ in range(3)]
    assert statuses == [200, 200, 429]
    got = samples(registry)
    assert got[f"{m.REQUEST_LATENCY}_count", ()] == 2  # the two admitted, as with a live rate
    assert got[m.INFLIGHT, ()] == 0
    assert got[f"{m.OUTCOMES}_total", (("outcome", "ok"),)] == 2


@pytest.mark.anyio
async def test_a_live_capacity_exports_its_inflight_limit_and_a_typed_in_rate_has_none(clock: ManualClock) -> None:
    from admitgate import Static
    from tests.test_middleware import call, http_scope

    registry = CollectorRegistry()
    live = LiveCapacity(Static(10), initial=10, inflight_floor=4)
    gate = AdmitGate(ok_app, rate=live, clock=clock, metrics=registry)
    assert (await call(gate, http_scope("/a")))[0] == 200
    assert samples(registry)[m.INFLIGHT_LIMIT, ()] == 5  # the floor, and one more for the response served
    typed = CollectorRegistry()
    gate = AdmitGate(ok_app, rate=10, clock=clock, metrics=typed)
    assert (await call(gate, http_scope("/a")))[0] == 200
    assert (m.INFLIGHT_LIMIT, ()) not in samples(typed)


def test_gauges_agree_with_each_other_at_every_scrape_of_a_run() -> None:
    """Read during a run of the default gate (open, then whatever the load makes of it): μ and H are absent until a
    capacity is measured, H never exceeds μ, and the estimator is in exactly one state."""

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    registry = CollectorRegistry()
    app = AdmitGate(Starlette(routes=[Route("/", hello)]), metrics=registry)
    scrapes: list[dict[str, float]] = []

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            for i in range(1500):
                await client.get("/")
                if i % 50 == 0:
                    scrapes.append({name: value for (name, labels), value in samples(registry).items() if not labels})
                    scrapes[-1]["states"] = sum(v for (n, _), v in samples(registry).items() if n == m.ESTIMATOR)

    asyncio.run(run())
    assert len(scrapes) == 30
    for scrape in scrapes:
        assert scrape["states"] == 1
        assert scrape[m.RATE] > 0
        if m.CAPACITY not in scrape:
            assert m.HEADROOM not in scrape
        else:
            assert 0 < scrape[m.HEADROOM] <= scrape[m.CAPACITY]
            assert scrape[m.LAMBDA_NEW] >= 0


def test_a_gate_that_knows_no_capacity_states_no_headroom() -> None:
    gate = Gate(LiveCapacity(QueueDelay()))
    assert gate.state(0.0)["headroom"] is None and gate.state(0.0)["mu"] is None
    typed = Gate(100.0).state(0.0)
    assert typed["headroom"] == pytest.approx(100.0) and typed["mu"] == 100.0
