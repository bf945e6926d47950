import json

import httpx
import pytest
from http_sfv import List
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from admitgate import AdmitGate, ConfigError, HeaderPolicy, Settings
from admitgate.asgi.headers import QUOTA_EXCEEDED, REDUCED_CAPACITY, quota


def as_dict(headers):
    return {k.decode(): v.decode() for k, v in headers}


def test_golden_rejection_headers() -> None:
    headers, body = HeaderPolicy().rejection(7, 180.0)
    assert headers[:4] == [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"7"),
        (b"cache-control", b"no-store"),
    ]
    h = as_dict(headers)
    assert h["ratelimit-policy"] == '"admitgate";q=180;w=1'
    assert h["ratelimit"] == '"admitgate";r=0;t=7'
    assert h["access-control-expose-headers"] == "Retry-After, RateLimit, RateLimit-Policy"
    assert "x-ratelimit-limit" not in h


def test_golden_legacy_headers() -> None:
    h = as_dict(HeaderPolicy(legacy=True, policy_name="api").rejection(3, 2.5)[0])
    assert h["ratelimit-policy"] == '"api";q=2;w=1'
    assert (h["x-ratelimit-limit"], h["x-ratelimit-remaining"], h["x-ratelimit-reset"]) == ("2", "0", "3")
    assert h["access-control-expose-headers"].endswith("X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset")


def test_problem_body_follows_rfc_9457() -> None:
    _, body = HeaderPolicy().rejection(4, 10.0)
    doc = json.loads(body)
    assert doc["type"] == QUOTA_EXCEEDED and doc["status"] == 429 and doc["title"] == "Too Many Requests"
    assert doc["violated-policies"] == ["admitgate"]
    _, body = HeaderPolicy(status=503).rejection(4, 10.0)
    assert json.loads(body)["type"] == REDUCED_CAPACITY


def test_admitted_fields() -> None:
    p = HeaderPolicy()
    assert as_dict(p.limit_fields(50.0, 12, None)) == {"ratelimit-policy": '"admitgate";q=50;w=1',
                                                       "ratelimit": '"admitgate";r=12'}  # fmt: skip
    assert as_dict(p.limit_fields(50.0, 0, 1))["ratelimit"] == '"admitgate";r=0;t=1'


@pytest.mark.parametrize(("rate", "expected"), [(200.0, (200, 1)), (1.0, (1, 1)), (0.5, (1, 2)), (0.3, (1, 4)),
                                                (1.9, (1, 1))])  # fmt: skip
def test_quota_is_integral_with_a_non_zero_window(rate: float, expected: tuple[int, int]) -> None:
    assert quota(rate) == expected


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="status"):
        HeaderPolicy(status=500)
    with pytest.raises(ConfigError, match="policy_name"):
        HeaderPolicy(policy_name="caf\u00e9")


@given(
    retry_after=st.integers(1, 10**6),
    rate=st.floats(0.001, 1e6),
    name=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=30),
)
def test_fields_are_valid_structured_fields_and_retry_after_is_not_before_t(retry_after, rate, name) -> None:
    headers = as_dict(HeaderPolicy(policy_name=name).rejection(retry_after, rate)[0])
    policy, limit = List(), List()
    policy.parse(headers["ratelimit-policy"].encode())
    limit.parse(headers["ratelimit"].encode())
    assert policy[0].value == name and limit[0].value == name
    assert policy[0].params["q"] >= 1 and policy[0].params["w"] >= 1
    assert limit[0].params["r"] == 0
    assert int(headers["retry-after"]) >= limit[0].params["t"]
    assert headers["retry-after"].isdigit() and int(headers["retry-after"]) >= 1


names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=20)


@given(windows=st.lists(st.tuples(names, st.integers(1, 10**6), st.integers(1, 86_400), st.integers(0, 10**6),
                                  st.integers(1, 86_400)), min_size=1, max_size=4))  # fmt: skip
def test_quota_fields_parse_as_draft_11_lists(windows) -> None:
    """Each quota window a request was counted in is one item of each field's list, read back by an independent
    structured-field parser (http_sfv): the policy name a String, ``q``, ``w``, ``r`` and ``t`` Integers."""
    headers = as_dict(HeaderPolicy().quota_fields(windows))
    policy, limit = List(), List()
    policy.parse(headers["ratelimit-policy"].encode())
    limit.parse(headers["ratelimit"].encode())
    assert [(i.value, i.params["q"], i.params["w"]) for i in policy] == [(n, q, w) for n, q, w, _, _ in windows]
    assert [(i.value, i.params["r"], i.params["t"]) for i in limit] == [(n, r, t) for n, _, _, r, t in windows]


@given(retry_after=st.integers(1, 10**6), limit=st.integers(1, 10**6), window=st.integers(1, 86_400), name=names)
def test_a_quota_rejection_tells_retry_after_at_the_end_of_its_effective_window(retry_after, limit, window,
                                                                                 name) -> None:  # fmt: skip
    """draft-ietf-httpapi-ratelimit-headers-11 §6: Retry-After names no time before the end of the effective
    window; it equals ``t`` here, with ``r`` 0, so a client that keeps to Retry-After (§7) loses nothing."""
    headers = as_dict(HeaderPolicy().quota_rejection(retry_after, name, limit, window)[0])
    limit_field = List()
    limit_field.parse(headers["ratelimit"].encode())
    assert limit_field[0].value == name and limit_field[0].params["r"] == 0
    assert int(headers["retry-after"]) == limit_field[0].params["t"] == retry_after


def legacy_error(status: int, retry_after: int, policy: str) -> tuple[bytes, str]:
    """An app's own error format, kept for 429s too."""
    doc = {"error": {"code": "RATE_LIMITED", "status": status, "retry_in": retry_after, "policy": policy}}
    return json.dumps(doc).encode(), "application/vnd.example.error+json"


def test_a_body_hook_renders_the_apps_own_error_format() -> None:
    calls = []

    def hook(status: int, retry_after: int, policy: str) -> tuple[bytes, str]:
        calls.append((status, retry_after, policy))
        return legacy_error(status, retry_after, policy)

    p = HeaderPolicy(body=hook, policy_name="api", status=503)
    headers, body = p.rejection(7, 20.0)
    h = as_dict(headers)
    assert json.loads(body) == {"error": {"code": "RATE_LIMITED", "status": 503, "retry_in": 7, "policy": "api"}}
    assert h["content-type"] == "application/vnd.example.error+json" and h["content-length"] == str(len(body))
    assert h["retry-after"] == "7" and h["ratelimit"] == '"api";r=0;t=7'
    assert p.rejection(7, 20.0) == (headers, body) and calls == [(503, 1, "api"), (503, 7, "api")]  # cached


@pytest.mark.parametrize(("hook", "problem"), [
    ("not callable", "must be a callable"),
    (lambda s, r, n: b"x", "must return (body bytes, content type)"),
    (lambda s, r, n: ("text", "text/plain"), "must be bytes"),
    (lambda s, r, n: (b"x", "text/plain\r\nx-injected: 1"), "printable ASCII"),
    (lambda s, r, n: 1 / 0, "ZeroDivisionError"),
])  # fmt: skip
def test_a_bad_body_hook_is_a_config_error_at_construction(hook, problem) -> None:
    with pytest.raises(ConfigError, match="body") as info:
        HeaderPolicy(body=hook)
    assert problem in str(info.value)


def test_a_hook_that_fails_later_falls_back_to_the_problem_document(caplog) -> None:
    p = HeaderPolicy(body=lambda status, retry_after, name: (b"{}", "application/json") if retry_after == 1 else None)
    headers, body = p.rejection(9, 20.0)
    assert json.loads(body)["type"] == QUOTA_EXCEEDED and as_dict(headers)["content-type"] == "application/problem+json"
    assert "body hook failed" in caplog.text


@pytest.mark.integration
def test_the_hooks_body_goes_out_through_a_real_server(serve) -> None:
    async def hello(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(
        AdmitGate,
        rate=1,
        headers=HeaderPolicy(body=legacy_error),
        settings=Settings(burst=1, max_pacing_delay=0.1, tarpit=0),
    )
    with serve(app) as base, httpx.Client(base_url=base) as c:
        assert c.get("/").status_code == 200
        rejected = c.get("/")
    assert rejected.status_code == 429
    assert rejected.headers["content-type"] == "application/vnd.example.error+json"
    assert rejected.headers["content-length"] == str(len(rejected.content))
    assert rejected.json()["error"]["retry_in"] == int(rejected.headers["retry-after"])
