import pytest

from admitgate import ConfigError, Priority, Router, Rule


def test_templates_not_raw_paths() -> None:
    r = Router({"/items/{item_id}": {"cost": 2}, "/files/{p:path}": {"class": "sheddable"}})
    a, b = r.resolve("/items/1"), r.resolve("/items/2")
    assert a is b and a.template == "/items/{item_id}" and a.cost == 2.0
    assert r.resolve("/files/a/b/c").priority.name == "sheddable"
    assert r.resolve("/other") is r.default


def test_exempt_and_static_routes() -> None:
    r = Router({"/login": {"class": "critical"}}, exempt=["/health", "/metrics"])
    assert r.resolve("/health").exempt
    assert r.resolve("/login").priority.critical
    assert not r.resolve("/x").exempt


def test_resolution_cache_is_bounded() -> None:
    r = Router({"/items/{i}": {}})
    for i in range(20_000):
        r.resolve(f"/x/{i}")
    assert len(r._cache) <= 4096


def test_custom_classes_and_rules() -> None:
    classes = {"gold": Priority("gold", critical=True), "bronze": Priority("bronze", reserve=0.3)}
    r = Router({"/a": Rule("/a", 3.0, classes["gold"])}, default_class="bronze", classes=classes)
    assert r.resolve("/a").cost == 3.0 and r.resolve("/b").priority.reserve == 0.3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"routes": {"/a": {"cost": 0}}}, "routes['/a'].cost"),
        ({"routes": {"/a": {"cost": -1}}}, "routes['/a'].cost"),
        ({"routes": {"/a": {"class": "vip"}}}, "routes['/a'].class"),
        ({"routes": {"/a": {"weight": 1}}}, "routes['/a']"),
        ({"routes": {"a": {}}}, "routes"),
        ({"default_class": "nope"}, "default_class"),
    ],
)
def test_bad_config_names_the_field(kwargs, field) -> None:
    with pytest.raises(ConfigError) as info:
        Router(**kwargs)
    assert info.value.field == field


def test_priority_validation() -> None:
    with pytest.raises(ConfigError, match="reserve"):
        Priority("x", reserve=1.0)
    with pytest.raises(ConfigError, match="reserve"):
        Priority("x", critical=True, reserve=0.1)
