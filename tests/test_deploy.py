"""Deployment material: the files parse, and the config they ship is one admitgate accepts."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from admitgate import AdmitGate, LiveCapacity
from admitgate.config import load

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


async def app(scope, receive, send):  # pragma: no cover - never called
    pass


def test_the_shipped_config_is_valid_in_both_places(tmp_path) -> None:
    kwargs = load(DEPLOY / "admitgate.toml", env={})
    assert isinstance(kwargs["rate"], LiveCapacity)
    AdmitGate(app, **kwargs)
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "admitgate.yaml").read_text()))
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Deployment", "Service"} <= kinds
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "admitgate.toml"
    path.write_text(config_map["data"]["admitgate.toml"])
    assert isinstance(load(path, env={})["rate"], LiveCapacity)


def test_compose_wires_the_app_redis_prometheus_and_grafana() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"app", "redis", "prometheus", "grafana"}
    assert compose["services"]["app"]["environment"]["ADMITGATE_BACKEND"].startswith("redis://")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert '"admitgate", "demo"' in dockerfile


def test_the_files_the_deploy_material_refers_to_exist() -> None:
    texts = [p.read_text() for p in DEPLOY.rglob("*") if p.suffix in {".yml", ".yaml", ".toml", ""} and p.is_file()]
    referred = {ref for text in texts for ref in re.findall(r"\bk8s/[\w.-]+\.ya?ml\b", text)}
    assert referred and all((DEPLOY / ref).is_file() for ref in referred), referred


def test_the_service_monitor_selects_the_service_and_carries_the_release_label() -> None:
    monitor = yaml.safe_load((DEPLOY / "k8s" / "servicemonitor.yaml").read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    # kube-prometheus-stack selects ServiceMonitors by `release: <Helm release name>`; the README names it
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "admitgate.yaml").read_text()))
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "admitgate-demo")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    assert "http" in ports
    assert "ServiceMonitor" not in {d["kind"] for d in docs}  # admitgate.yaml applies without the operator's CRDs
