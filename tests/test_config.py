"""Configuration: TOML and environment, validated at start-up with the field named."""

from __future__ import annotations

import pytest

from admitgate import AdmitGate, Settings
from admitgate.config import capacity_from_config, load
from admitgate.core.errors import ConfigError
from admitgate.limit.capacity import LiveCapacity
from admitgate.limit.delay import QueueDelay
from admitgate.limit.estimators import BandwidthDelay, Gradient


async def app(scope, receive, send):  # pragma: no cover - never called
    pass


def pool_capacity(now: float) -> float:
    return 123.0


def test_toml_builds_a_live_capacity(tmp_path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text("""
[settings]
burst = 20
max_pacing_delay = 1.0
[capacity]
estimator = "gradient"
initial = 150
floor = 5
capacity_probes = ["tests.test_config:pool_capacity"]
[capacity.gradient]
tolerance = 0.4
[capacity.bdp]
tolerance = 9   # tables for other estimators are accepted and ignored
""")
    kwargs = load(path, env={})
    assert kwargs["settings"] == Settings(burst=20, max_pacing_delay=1.0)
    source = kwargs["rate"]
    assert isinstance(source, LiveCapacity) and isinstance(source.estimator, Gradient)
    assert source.estimator.tolerance == 0.4 and source.floor == 5 and source.initial == 150
    assert source.capacity_probes[0](0.0) == 123.0
    AdmitGate(app, **kwargs)  # the middleware accepts it as is


def test_environment_overrides_the_file(tmp_path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[capacity]\nestimator = "gradient"\n')
    env = {"ADMITGATE_CONFIG": str(path), "ADMITGATE_ESTIMATOR": "bdp", "ADMITGATE_BDP_TOLERANCE": "0.3",
           "ADMITGATE_CAPACITY_FLOOR": "7", "ADMITGATE_BURST": "12", "OTHER": "x"}  # fmt: skip
    kwargs = load(env=env)
    assert isinstance(kwargs["rate"].estimator, BandwidthDelay)
    assert kwargs["rate"].estimator.tolerance == 0.3 and kwargs["rate"].floor == 7
    assert kwargs["settings"].burst == 12


def test_static_rate_without_a_capacity_table() -> None:
    assert load(env={"ADMITGATE_RATE": "250"}) == {"rate": 250}


@pytest.mark.parametrize(
    ("text", "env", "field"),
    [
        ('[capacity]\nestimator = "vegas"\n', {}, "capacity.estimator"),
        ("[capacity]\nfloor = -1\n", {}, "capacity.floor"),
        ("[capacity.delay]\ntarget = 0\n", {}, "capacity.delay.target"),
        ('[capacity]\nestimator = "bdp"\n[capacity.bdp]\ntolerance = 0\n', {}, "capacity.bdp.tolerance"),
        ("[capacity]\nflor = 1\n", {}, "capacity.flor"),
        ("[gate]\nburst = 'x'\n", {}, "gate.burst"),
        ("[gaet]\n", {}, "gaet"),
        ('[capacity]\ncapacity_probes = ["no.such.module:f"]\n', {}, "capacity.capacity_probes[0]"),
        ("not = [toml", {}, "config"),
    ],
)
def test_errors_name_the_field(tmp_path, text, env, field) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path, env=env)
    assert info.value.field == field


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load("/nonexistent/admitgate.toml", env={})


def test_capacity_defaults_to_the_delay_estimator() -> None:
    assert isinstance(capacity_from_config({}).estimator, QueueDelay)
    assert isinstance(capacity_from_config({"estimator": "bdp"}).estimator, BandwidthDelay)


def test_everything_code_can_pass_can_be_set_from_the_environment(caplog) -> None:
    from admitgate import HeaderPolicy, Identity, Priority

    env = {
        "ADMITGATE_TICKET": "a shared secret of enough bytes",  # a string is the secret itself
        "ADMITGATE_EXEMPT": "/health,/ready",
        "ADMITGATE_HEADERS_STATUS": "503",
        "ADMITGATE_HEADERS_LEGACY": "true",
        "ADMITGATE_CLASSES": '{"batch": {"reserve": 0.5}, "default": {}}',
        "ADMITGATE_BURST": "7",
        "ADMITGATE_RATE": "100",
    }
    options = load(env=env)
    assert options["exempt"] == ["/health", "/ready"] and options["rate"] == 100
    identity, headers = options["identity"], options["headers"]
    assert isinstance(identity, Identity) and identity.secret == b"a shared secret of enough bytes"
    assert isinstance(headers, HeaderPolicy) and headers.status == 503 and headers.legacy
    assert options["classes"]["batch"] == Priority("batch", reserve=0.5)
    assert options["settings"] == Settings(burst=7)
    gate = AdmitGate(app, **options)  # the objects code builds
    assert gate.gate.pacer.burst == 7 and gate.headers.status == 503


def test_a_capacity_setting_beside_a_static_rate_is_ignored_with_a_warning(caplog) -> None:
    assert load(env={"ADMITGATE_RATE": "100", "ADMITGATE_CAPACITY_FLOOR": "5"}) == {"rate": 100}
    assert "nothing is learnt" in caplog.text


def test_a_variable_that_names_no_setting_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"BRUST: names no admitgate setting \(did you mean ADMITGATE_BURST"):
        load(env={"ADMITGATE_BRUST": "5"})


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"ADMITGATE_BURST": "x"}, "must be a number (got 'x')"),
        ({"ADMITGATE_HEADERS_LEGACY": "maybe"}, "ADMITGATE_HEADERS_LEGACY"),
        ({"ADMITGATE_CLASSES": "{not json"}, "ADMITGATE_CLASSES"),
    ],
)
def test_environment_errors_are_in_words(env, words) -> None:
    with pytest.raises(ConfigError) as info:
        load(env=env)
    assert words in str(info.value) and "<class" not in str(info.value)


def test_classes_and_headers_from_a_file(tmp_path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text('[headers]\nstatus = 503\n[classes.batch]\nreserve = 0.5\n[classes.default]\n'
                    '[settings]\nburst = 3\n[identity]\nkey = "header:x-api-key"\n')  # fmt: skip
    options = load(path, env={})
    gate = AdmitGate(app, rate=10, **options)
    assert gate.headers.status == 503 and gate.gate.pacer.burst == 3 and set(options["classes"]) == {"batch", "default"}


def test_the_names_of_0_1_0_for_the_capacity_settings_are_refused_with_the_new_name(tmp_path) -> None:
    """[headroom] and ADMITGATE_HEADROOM_* (0.1.0) are [capacity] and ADMITGATE_CAPACITY_* now: start-up fails
    saying so, rather than learning with settings silently dropped."""
    path = tmp_path / "old.toml"
    path.write_text("[headroom]\nfloor = 5\n")
    with pytest.raises(ConfigError, match=r"headroom.*\[capacity\]"):
        load(path, env={})
    with pytest.raises(ConfigError, match=r"ADMITGATE_HEADROOM_FLOOR.*ADMITGATE_CAPACITY_FLOOR"):
        load(env={"ADMITGATE_HEADROOM_FLOOR": "5"})


def test_the_0_1_0_class_name_still_imports_with_a_deprecation_warning() -> None:
    import admitgate

    with pytest.warns(DeprecationWarning, match="admitgate.LiveHeadroom is now admitgate.LiveCapacity"):
        assert admitgate.LiveHeadroom is LiveCapacity
