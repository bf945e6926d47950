"""Metrics: prometheus-client exposition from the gate's aggregates, checked by promtool and a real Prometheus."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from admitgate import AdmitGate, BandwidthDelay, LiveHeadroom, ManualClock
from admitgate import metrics as m
from admitgate.demo import Upstream, demo_app
from admitgate.serving import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


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
    gate = AdmitGate(ok_app, rate=LiveHeadroom(BandwidthDelay(seed=1), initial=1, floor=1, now=clock()),
                     burst=1, max_pacing_delay=0, routes={"/items/{id}": {"cost": 1}}, clock=clock,
                     metrics=registry)  # fmt: skip
    assert (await call(gate, http_scope("/items/1")))[0] == 200
    assert (await call(gate, http_scope("/items/2")))[0] == 429
    got = samples(registry)

    def key(verdict: str) -> tuple[str, tuple]:
        labels = (("class", "default"), ("route", "/items/{id}"), ("verdict", verdict))
        return f"{m.DECISIONS}_total", labels

    assert (got[key("admitted")], got[key("rejected")], got[key("paced")]) == (1, 1, 0)
    assert got[f"{m.RETRY_AFTER}_count", ()] == 1
    assert got[f"{m.REQUEST_LATENCY}_count", ()] == 1
    assert got[m.RATE, ()] == 1.0 and got[m.FLOOR, ()] == 1.0
    assert got[m.ESTIMATOR, (("estimator", "bdp"), ("state", "warming"))] == 1
    assert not any("items/1" in str(labels) for _, labels in got)  # templates, never raw paths


def test_no_registry_no_metrics() -> None:
    gate = AdmitGate(ok_app, rate=5)
    assert gate.tally == {} and not gate._tally_on


def test_promtool_accepts_the_exposition_and_the_deploy_files(tmp_path) -> None:
    registry = CollectorRegistry()
    AdmitGate(ok_app, rate=LiveHeadroom(BandwidthDelay(seed=1)), metrics=registry)
    check = subprocess.run([promtool(), "check", "metrics"], input=generate_latest(registry), capture_output=True)
    assert check.returncode == 0, check.stderr.decode() + check.stdout.decode()
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                 ["test", "rules", "alerts_test.yml"]):  # fmt: skip
        out = subprocess.run([promtool(), *args], cwd=DEPLOY, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.server
def test_real_prometheus_scrapes_and_every_panel_and_alert_query_returns_series(serve, tmp_path) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is required (Debian package 'prometheus'; .ci/run installs it)"
    registry = CollectorRegistry()
    live = LiveHeadroom(BandwidthDelay(seed=1), initial=100, floor=1)
    app = demo_app(Upstream(workers=4, service_time=0.02), metrics=registry, rate=live, burst=4)
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
            while True:  # until rate() over the scrapes has something
                try:  # until it is ready (it answers 503 with a text body while starting)
                    reply = httpx.get(api, params={"query": f"sum(rate({m.DECISIONS}_total[5s]))"}, timeout=2)
                    r = reply.json() if reply.status_code == 200 else {"data": {"result": []}}
                    if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) > 0:
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                assert time.monotonic() < deadline, "Prometheus never scraped the app"
                time.sleep(0.5)
            dashboard = json.loads((ROOT / "dashboards" / "admitgate.json").read_text())
            # the same queries on this test's time scale (seconds of data, not minutes)
            short = {"$__rate_interval": "10s", "[30s]": "[5s]", ":15s]": ":1s]", "[5m:": "[20s:"}
            exprs = []
            for panel in dashboard["panels"]:
                for target in panel["targets"]:
                    expr = target["expr"]
                    for old, new in short.items():
                        expr = expr.replace(old, new)
                    exprs.append(expr)
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


@pytest.mark.server
def test_multiprocess_mode_adds_up_every_worker(tmp_path) -> None:
    import os
    import sys

    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.mp_app:app", "--workers", "2", "--port",
                             str(port), "--host", "127.0.0.1", "--log-level", "warning"],
                            cwd=ROOT, env=env)  # fmt: skip
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
        for _ in range(300):  # a new connection each time, so both workers take some
            assert httpx.get(url + "/", timeout=5, headers={"connection": "close"}).status_code == 200
        time.sleep(2.5)  # each worker syncs once a second
        text = httpx.get(url + "/metrics", timeout=5).text
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
        admitted = sum(v for (name, labels), v in got.items()
                       if name == f"{m.DECISIONS}_total" and ("verdict", "admitted") in labels)  # fmt: skip
        assert admitted == 300
        assert got[f"{m.REQUEST_LATENCY}_count", ()] == 300
        writers = {p.name.rsplit("_", 1)[-1] for p in tmp_path.glob("counter_*.db")}
        assert len(writers) == 2, writers  # both workers wrote their share
        check = subprocess.run([promtool(), "check", "metrics"], input=text.encode(), capture_output=True)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    finally:
        proc.terminate()
        proc.wait(15)
