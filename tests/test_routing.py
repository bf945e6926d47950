import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.routing import Router as Router_

from admitgate import ConfigError, Priority
from admitgate.asgi.routing import Router
from admitgate.core.priority import Rule


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
    assert len(r.cache) <= 4096


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
        ({"routes": {"a": {}}}, "routes['a']"),
        ({"routes": {"/a": 5}}, "routes['/a']"),  # was a TypeError
        ({"routes": ["/a"]}, "routes"),  # was an AttributeError
        ({"routes": {"/a/{x:nope}": {}}}, "routes['/a/{x:nope}']"),  # was Starlette's AssertionError
        ({"routes": {"/a/{x": {}}}, "routes['/a/{x']"),  # was taken as a plain path
        ({"routes": {"/a": {"exempt": "no"}}}, "routes['/a'].exempt"),  # made the route exempt
        ({"exempt": None}, "exempt"),
        ({"exempt": "/health"}, "exempt"),
        ({"exempt": [5]}, "exempt[0]"),
        ({"classes": {"default": 5}}, "classes['default']"),
        ({"classes": {}}, "classes"),
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


@pytest.mark.parametrize("template", ["/metrics", "/metrics/"])
def test_an_exempt_template_covers_what_is_mounted_below_it(template) -> None:
    r = Router({"/metrics/costly": {"cost": 3}}, exempt=[template, "/health"])
    for path in ("/metrics", "/metrics/", "/metrics/x/y", "/health", "/health/live"):
        assert r.resolve(path).exempt, path
    for path in ("/metricsfoo", "/metric", "/x/metrics", "/healthz", "/"):
        assert not r.resolve(path).exempt, path
    assert r.resolve("/metrics/costly").cost == 3.0  # an exact template still wins


def test_exempt_root_is_only_the_root_and_parameterised_exempt_covers_below() -> None:
    r = Router(exempt=["/"], routes={"/t/{tenant}/health": {"exempt": True}})
    assert r.resolve("/").exempt and not r.resolve("/anything").exempt
    assert r.resolve("/t/a/health").exempt and r.resolve("/t/a/health/deep").exempt
    assert not r.resolve("/t/a/healthy").exempt


segment = st.text(alphabet="abmetrics-_.%", min_size=0, max_size=8)


@given(st.lists(segment, min_size=1, max_size=4))
def test_exempt_prefix_is_on_a_segment_boundary(segments) -> None:
    path = "/" + "/".join(segments)
    r = Router(exempt=["/metrics"])
    assert r.resolve(path).exempt == (path == "/metrics" or path.startswith("/metrics/"))


async def endpoint(request):  # pragma: no cover - never called
    return PlainTextResponse("")


async def plain_asgi(scope, receive, send):  # pragma: no cover - never called
    pass


def app_with_routes() -> Starlette:
    api = Router_([Route("/orders/{order_id:int}", endpoint), Route("/orders", endpoint)])
    return Starlette(routes=[
        Route("/items/{item_id}", endpoint, methods=["GET"]),
        Route("/items/new", endpoint),  # shadowed by the route above, as in Starlette
        Route("/users/{user_id}/posts/{post_id}", endpoint),
        Mount("/api", routes=[Mount("/v1", app=api)]),
        Mount("/static", app=plain_asgi),
        Route("/api/v1/fallthrough", endpoint),  # unreachable: /api is a mount
        Route("/", endpoint),
    ])  # fmt: skip


@pytest.mark.parametrize("fastapi_helper", [True, False])
def test_paths_no_rule_names_are_labelled_by_the_apps_templates(fastapi_helper, monkeypatch) -> None:
    if not fastapi_helper:  # without FastAPI, or one older than its iter_route_contexts (0.137.2)
        monkeypatch.setitem(sys.modules, "fastapi.routing", None)
    r = Router({"/users/{uid}/posts/{pid}": {"cost": 2}}, app=app_with_routes())
    labels = {path: r.resolve(path).template for path in (
        "/items/1", "/items/new", "/users/7/posts/9", "/api/v1/orders/12", "/api/v1/orders", "/static/css/a.css",
        "/api/v1/orders/x", "/api/v1/fallthrough", "/nope", "/", "/metrics")}  # fmt: skip
    assert labels == {
        "/items/1": "/items/{item_id}", "/items/new": "/items/{item_id}",
        "/users/7/posts/9": "/users/{uid}/posts/{pid}",  # a rule's own template comes first
        "/api/v1/orders/12": "/api/v1/orders/{order_id:int}", "/api/v1/orders": "/api/v1/orders",
        "/static/css/a.css": "/static/{path:path}",
        "/api/v1/orders/x": "*", "/api/v1/fallthrough": "*", "/nope": "*", "/": "/", "/metrics": "*",
    }  # fmt: skip
    assert r.resolve("/items/1").cost == r.default.cost and r.resolve("/items/1").priority is r.default.priority


def test_the_route_table_is_found_behind_middleware_and_read_again_when_it_grows() -> None:
    app = app_with_routes()
    app.add_middleware(GZipMiddleware)
    stack = app.build_middleware_stack()  # ServerErrorMiddleware -> GZip -> ExceptionMiddleware -> Router
    r = Router(app=stack)
    assert r.resolve("/items/3").template == "/items/{item_id}"
    assert r.resolve("/later/1").template == "*"
    app.router.routes.append(Route("/later/{n}", endpoint))
    assert r.resolve("/later/2").template == "/later/{n}"


def test_without_a_route_table_everything_is_the_catch_all() -> None:
    r = Router(app=plain_asgi)
    assert r.resolve("/a/1").template == "*"
    scoped = Router(app=plain_asgi)  # an outer Starlette app puts itself in the scope
    assert scoped.resolve("/items/1", {"app": app_with_routes()}).template == "/items/{item_id}"


def test_the_root_path_is_stripped_before_matching_the_apps_templates() -> None:
    r = Router(app=app_with_routes())
    assert r.resolve("/prefix/items/1", {"root_path": "/prefix"}).template == "/items/{item_id}"


def test_distinct_labels_from_the_app_are_capped(monkeypatch) -> None:
    monkeypatch.setattr("admitgate.asgi.routing.MAX_TEMPLATES", 5)
    app = Starlette(routes=[Route(f"/r{i}/{{x}}", endpoint) for i in range(8)])
    r = Router(app=app)
    labels = [r.resolve(f"/r{i}/1").template for i in range(8)]
    assert labels == [f"/r{i}/{{x}}" for i in range(5)] + ["*"] * 3


def test_a_route_table_that_cannot_be_read_costs_the_label_not_the_request() -> None:
    class BrokenMount(Mount):  # a route class whose table raises, as a plugin's might
        @property
        def routes(self):
            raise RuntimeError("no table")

    r = Router(app=Starlette(routes=[BrokenMount("/m", routes=[]), Route("/a/{x}", endpoint)]))
    assert r.resolve("/a/1").template == "*" and not r.resolve("/a/1").exempt
