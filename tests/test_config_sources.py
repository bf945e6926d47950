"""One rule for the file and the variables: a name that sets nothing is an error in both, and every error names
where its value came from, also for values only the gate would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from admitgate import AdmitGate, ConfigError
from admitgate.config import load
from tests.test_middleware import Recorder

ROOT = Path(__file__).resolve().parent.parent


def loaded_from(tmp_path: Path, text: str) -> tuple[Path, ConfigError]:
    path = tmp_path / "admitgate.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    return path, error.value


@pytest.mark.parametrize(("text", "field"), [
    ("[gate]\nrate = -5\n", "gate.rate"),  # a number, but the gate's range is [0.001, 1e9]
    ("[gate]\nrate = 100\nworkers = 0\n", "gate.workers"),
    ("[settings]\nburst = 5\n[routes.\"/x\"]\ncost = 10\n", "routes['/x'].cost"),  # never fits in the burst
    ("[quota]\nlimit = \"5/minute\"\nkey = \"tenant\"\n", "quota.key"),  # per tenant, without tenants
    ("[settings]\nbrust = 5\n", "settings.brust"),
])  # fmt: skip
def test_an_error_from_the_file_names_its_key_and_the_file(tmp_path: Path, text: str, field: str) -> None:
    path, error = loaded_from(tmp_path, text)
    assert error.field == field and error.source == str(path)
    assert str(error).startswith(f"admitgate: invalid {field} in {path}: ")


@pytest.mark.parametrize(("env", "field"), [
    ({"ADMITGATE_RATE": "-5"}, "ADMITGATE_RATE"),
    ({"ADMITGATE_RATE": "100", "ADMITGATE_WORKERS": "0"}, "ADMITGATE_WORKERS"),
    ({"ADMITGATE_BURST": "5", "ADMITGATE_ROUTES": '{"/x": {"cost": 10}}'}, "ADMITGATE_ROUTES['/x'].cost"),
    ({"ADMITGATE_QUOTA": "5/minute", "ADMITGATE_QUOTA_KEY": "tenant"}, "ADMITGATE_QUOTA_KEY"),
    ({"ADMITGATE_RAET": "100"}, "ADMITGATE_RAET"),
])  # fmt: skip
def test_an_error_from_a_variable_names_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(env=env)
    assert error.value.field == field and error.value.source is None


def test_the_same_value_from_the_file_and_a_variable_is_the_same_kind_of_error(tmp_path: Path) -> None:
    _, from_file = loaded_from(tmp_path, "[gate]\nraet = 100\n")
    with pytest.raises(ConfigError) as from_env:
        load(env={"ADMITGATE_RAET": "100"})
    assert "did you mean rate?" in from_file.problem and "did you mean ADMITGATE_RATE?" in from_env.value.problem
    _, from_file = loaded_from(tmp_path, "[gate]\nrate = -5\n")
    with pytest.raises(ConfigError) as from_env:
        load(env={"ADMITGATE_RATE": "-5"})
    assert from_file.problem == from_env.value.problem


def test_a_variable_overriding_the_file_is_named_as_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text("[gate]\nrate = 100\n")
    with pytest.raises(ConfigError) as error:
        load(path, env={"ADMITGATE_RATE": "-5"})
    assert error.value.field == "ADMITGATE_RATE" and error.value.source is None


def test_the_variables_kubernetes_sets_for_the_example_services_are_not_mistakes() -> None:
    """A pod gets ``<SERVICE>_SERVICE_HOST``, ``<SERVICE>_PORT_<n>_TCP_ADDR``... for every service beside it: the
    example manifest's ``admitgate-*`` services give ``ADMITGATE_*`` variables that set nothing."""
    manifest = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "admitgate.yaml").read_text()))
    services = [doc for doc in manifest if doc and doc.get("kind") == "Service"]
    env: dict[str, str] = {}
    for service in services:
        name = service["metadata"]["name"].upper().replace("-", "_")
        assert name.startswith("ADMITGATE")
        for port in service["spec"]["ports"]:
            number, link = port["port"], f"{name}_PORT_{port['port']}_TCP"
            env |= {f"{name}_SERVICE_HOST": "10.0.0.7", f"{name}_SERVICE_PORT": str(number),
                    f"{name}_PORT": f"tcp://10.0.0.7:{number}", link: f"tcp://10.0.0.7:{number}",
                    f"{link}_PROTO": "tcp", f"{link}_PORT": str(number), f"{link}_ADDR": "10.0.0.7"}  # fmt: skip
            if "name" in port:
                env[f"{name}_SERVICE_PORT_{port['name'].upper()}"] = str(number)
    assert services and len(env) >= 7
    assert load(env={**env, "ADMITGATE_RATE": "100"}) == {"rate": 100}


def test_what_load_accepts_the_gate_accepts(tmp_path: Path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text('[gate]\nrate = 100\nworkers = 2\n[settings]\nburst = 20\n[routes."/x"]\ncost = 10\n'
                    '[tenants]\nkey = "header:x-team"\n[quota]\nlimit = "5/minute"\nkey = "tenant"\n')  # fmt: skip
    AdmitGate(Recorder(), **load(path, env={}))


def user_key(scope: dict) -> str | None:
    return dict(scope["headers"]).get(b"x-user", b"").decode() or None


def test_a_route_quotas_key_function_is_an_import_string_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text('[routes."/login"]\nquota = { limit = "1/minute", key = "tests.test_config_sources:user_key" }\n')
    assert load(path, env={})["routes"]["/login"]["quota"]["key"].__qualname__ == "user_key"
    _, error = loaded_from(tmp_path, '[routes."/login"]\nquota = { limit = "1/minute", key = "tests.nowhere:key" }\n')
    assert error.field == "routes['/login'].quota.key" and error.source == str(path)
