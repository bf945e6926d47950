"""Deployment material: the files parse, and the config they ship is one admitgate accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

from admitgate import AdmitGate, LiveHeadroom
from admitgate.config import load

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


async def app(scope, receive, send):  # pragma: no cover - never called
    pass


def test_the_shipped_config_is_valid_in_both_places(tmp_path) -> None:
    kwargs = load(DEPLOY / "admitgate.toml", env={})
    assert isinstance(kwargs["rate"], LiveHeadroom)
    AdmitGate(app, **kwargs)
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "admitgate.yaml").read_text()))
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Deployment", "Service", "ServiceMonitor"} <= kinds
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "admitgate.toml"
    path.write_text(config_map["data"]["admitgate.toml"])
    assert isinstance(load(path, env={})["rate"], LiveHeadroom)


def test_compose_wires_the_app_redis_prometheus_and_grafana() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"app", "redis", "prometheus", "grafana"}
    assert compose["services"]["app"]["environment"]["ADMITGATE_BACKEND"].startswith("redis://")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert '"admitgate", "demo"' in dockerfile
