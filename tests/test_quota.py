"""Per-key quotas: GCRA on the injected clock, the 429 before the gate, config, and one count for a fleet in Redis."""

from __future__ import annotations

import copy
import json
import logging
import math

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import AdmitGate, ConfigError, HeaderPolicy, Identity, ManualClock, Quota, Settings
from admitgate.asgi.quota import parse_limit
from admitgate.config import load
from admitgate.core.quota import QuotaLimiter, QuotaRate, digest, spread
from tests.test_middleware import Recorder, call, http_scope


@pytest.fixture
def anyio_backend():
    return "asyncio"


def keyed(key: str | None, path: str = "/x") -> dict[str, object]:
    return http_scope(path, headers=[] if key is None else [(b"x-api-key", key.encode())])


# -- the limit ------------------------------------------------------------------------------------
def test_the_limits_syntax_parses_to_requests_per_seconds() -> None:
    assert parse_limit("100/minute") == QuotaRate(100, 60.0)
    assert parse_limit("5 per 10 seconds", burst=2) == QuotaRate(5, 10.0, 2)
    assert parse_limit("1000/day").window == 86_400.0


@pytest.mark.parametrize("spec", ["lots", "", "100/fortnight", "0/minute", "10/second;20/second", 100, None])
def test_a_bad_limit_is_a_config_error_naming_the_field(spec: object) -> None:
    with pytest.raises(ConfigError) as error:
        Quota(spec)  # type: ignore[arg-type]
    assert error.value.field == "limit"


def test_bad_quota_fields_are_config_errors_naming_them() -> None:
    for kwargs, field in (({"burst": 101}, "burst"), ({"burst": 0}, "burst"), ({"key": "bogus"}, "key"),
                          ({"name": ""}, "name"), ({"max_keys": 0}, "max_keys")):  # fmt: skip
        with pytest.raises(ConfigError) as error:
            Quota("100/minute", **kwargs)  # type: ignore[arg-type]
        assert error.value.field == field
    with pytest.raises(ConfigError, match="quota"):
        AdmitGate(Recorder(), rate=10, quota="100/minute")  # type: ignore[arg-type]


# -- GCRA -----------------------------------------------------------------------------------------
def test_exactly_n_in_a_burst_then_one_per_interval() -> None:
    clock = ManualClock(1000.0)
    limiter = QuotaLimiter(QuotaRate(100, 60.0), clock)
    assert [limiter.check("k").wait for _ in range(100)] == [0.0] * 100
    assert limiter.check("k").wait == pytest.approx(0.6)  # the 101st waits one interval, W/N
    clock.advance(0.3)
    assert limiter.check("k").wait == pytest.approx(0.3)
    clock.advance(0.3)
    assert limiter.check("k").wait == 0.0  # spaced at T = 0.6 s after the burst
    assert limiter.check("k").wait == pytest.approx(0.6)
    assert limiter.check("other").wait == 0.0  # keys are independent


gaps = st.lists(st.floats(min_value=0.0, max_value=3.0, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=200, deadline=None)
@given(gaps=gaps, limit=st.integers(1, 20), window=st.floats(0.5, 10.0), burst=st.integers(1, 20))
def test_remaining_is_how_many_more_the_key_may_make_at_once(gaps, limit, window, burst) -> None:
    """An allowed answer's remaining() is exact: that many more requests at the same instant are allowed,
    and the next one is not."""
    rate = QuotaRate(limit, window, min(burst, limit))
    clock = ManualClock()
    limiter = QuotaLimiter(rate, clock)
    for gap in gaps:
        clock.advance(gap)
        answer = limiter.check("k")
        if answer.wait == 0.0:
            shadow = copy.deepcopy(limiter)  # the same state (and time), probed without touching the real one
            more = 0
            while shadow.check("k").wait == 0.0:
                more += 1
            assert more == answer.remaining(rate)


def test_an_idle_key_is_forgotten_and_a_full_store_stays_bounded() -> None:
    clock = ManualClock()
    limiter = QuotaLimiter(QuotaRate(2, 1.0), clock, max_keys=1_000)
    for k in range(100_000):
        limiter.check(k)
    assert len(limiter) <= 1_000
    clock.advance(1.0)
    limiter.check("fresh")
    assert limiter.check("fresh").wait == 0.0 and limiter.check("fresh").wait > 0


@settings(max_examples=200, deadline=None)
@given(gaps=gaps, limit=st.integers(1, 20), window=st.floats(0.5, 10.0), burst=st.integers(1, 20))
def test_no_interval_of_l_seconds_allows_more_than_burst_plus_l_over_t(gaps, limit, window, burst) -> None:
    burst = min(burst, limit)
    clock = ManualClock()
    limiter = QuotaLimiter(QuotaRate(limit, window, burst), clock)
    allowed = []
    for gap in gaps:
        clock.advance(gap)
        if limiter.check("k").wait == 0.0:
            allowed.append(clock.now)
    interval = window / limit
    for i, start in enumerate(allowed):
        for j in range(i, len(allowed)):
            assert j - i + 1 <= burst + (allowed[j] - start) / interval + 1e-6


@settings(max_examples=200, deadline=None)
@given(gaps=gaps, limit=st.integers(1, 20), window=st.floats(0.5, 10.0))
def test_with_a_burst_of_one_no_window_of_w_seconds_allows_more_than_n(gaps, limit, window) -> None:
    clock = ManualClock()
    limiter = QuotaLimiter(QuotaRate(limit, window, burst=1), clock)
    allowed = []
    for gap in gaps:
        clock.advance(gap)
        if limiter.check("k").wait == 0.0:
            allowed.append(clock.now)
    for i, start in enumerate(allowed):
        assert sum(1 for t in allowed[i:] if t < start + window - 1e-6) <= limit


# -- the middleware -------------------------------------------------------------------------------
def quota_app(clock: ManualClock, sleep, **quota: object) -> tuple[AdmitGate, Recorder]:
    inner = Recorder()
    limit = Quota("3/minute", **quota)  # type: ignore[arg-type]
    app = AdmitGate(inner, rate=1_000, settings=Settings(burst=1_000), clock=clock, sleep=sleep,
                    identity=Identity(ticket=False), quota=limit)  # fmt: skip
    return app, inner


@pytest.mark.anyio
async def test_a_key_over_quota_gets_the_gates_429_and_takes_no_token(clock: ManualClock, sleep) -> None:
    app, inner = quota_app(clock, sleep)
    for _ in range(3):
        assert (await call(app, keyed("alice")))[0] == 200
    tokens = app.gate.pacer.tokens(clock())
    status, headers, body = await call(app, keyed("alice"))
    assert status == 429 and inner.calls == 3
    assert app.gate.pacer.tokens(clock()) == tokens  # refused before the gate: the headroom is untouched
    told = int(headers["retry-after"])  # one interval, W/N = 60/3 s, and the key's place in the next one
    assert 20 <= told <= 40 and told == math.ceil(spread(20.0, QuotaRate(3, 60.0), digest("alice")))
    assert app.quota_refused == 1  # metrics export it (admitgate_quota_refused_requests_total)
    assert headers["ratelimit-policy"] == '"quota";q=3;w=60'
    assert headers["ratelimit"] == f'"quota";r=0;t={told}'
    assert headers["cache-control"] == "no-store"
    problem = json.loads(body)
    assert problem["status"] == 429 and problem["violated-policies"] == ["quota"]
    assert "quota" in problem["detail"]
    clock.advance(19.5)
    status, headers, _ = await call(app, keyed("alice"))
    assert status == 429 and int(headers["retry-after"]) == math.ceil(spread(0.5, QuotaRate(3, 60.0), digest("alice")))
    clock.advance(0.5)
    assert (await call(app, keyed("alice")))[0] == 200
    assert (await call(app, keyed("bob")))[0] == 200  # another key has its own quota


@pytest.mark.anyio
async def test_requests_without_the_key_and_exempt_paths_are_not_quota_limited(clock: ManualClock, sleep) -> None:
    app, _ = quota_app(clock, sleep, burst=1)
    assert (await call(app, keyed("alice")))[0] == 200
    for _ in range(10):
        assert (await call(app, keyed(None)))[0] == 200
        assert (await call(app, keyed("alice", "/health")))[0] == 200
    assert (await call(app, keyed("alice")))[0] == 429


@pytest.mark.anyio
async def test_a_failing_key_function_is_no_key_never_a_500(clock: ManualClock, sleep) -> None:
    def broken(scope: object) -> str:
        raise RuntimeError("boom")

    for key in (broken, lambda scope: ["not", "hashable"]):
        app, _ = quota_app(clock, sleep, key=key)
        for _ in range(5):
            assert (await call(app, keyed("alice")))[0] == 200


# -- configuration --------------------------------------------------------------------------------
def test_quota_from_a_file_and_the_environment(tmp_path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text('[quota]\nlimit = "100/minute"\nkey = "address"\nburst = 10\n')
    assert load(path, env={})["quota"] == Quota("100/minute", key="address", burst=10)
    env = {"ADMITGATE_QUOTA": "5/second", "ADMITGATE_QUOTA_NAME": "per-key", "ADMITGATE_QUOTA_BURST": "5"}
    assert load(path, env=env)["quota"] == Quota("5/second", key="address", burst=5, name="per-key")


@pytest.mark.parametrize(("env", "field"), [
    ({"ADMITGATE_QUOTA": "lots"}, "ADMITGATE_QUOTA"),
    ({"ADMITGATE_QUOTA": "10/minute", "ADMITGATE_QUOTA_BURST": "11"}, "ADMITGATE_QUOTA_BURST"),
    ({"ADMITGATE_QUOTA_KEY": "address"}, "quota.limit"),
])  # fmt: skip
def test_a_bad_quota_setting_is_a_config_error_naming_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(env=env)
    assert error.value.field == field


def test_a_bad_limit_in_a_file_names_the_key(tmp_path) -> None:
    path = tmp_path / "admitgate.toml"
    path.write_text('[quota]\nlimit = "100 per fortnight"\n')
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert error.value.field == "quota.limit"


# -- the fleet's count, in Redis ------------------------------------------------------------------
def test_two_replicas_sharing_redis_allow_exactly_n_for_one_key(redis_server) -> None:
    from admitgate.backends.shared import RedisBudget

    async def run() -> list[int]:
        name = redis_server.name("admitgate")  # (the quota's keys are under the budget's name)
        replicas = [AdmitGate(Recorder(), rate=1_000, backend=RedisBudget(redis_server.url, name=name),
                              identity=Identity(ticket=False), quota=Quota("5/minute")) for _ in range(2)]  # fmt: skip
        statuses = [(await call(replicas[i % 2], keyed("alice")))[0] for i in range(12)]
        assert (await call(replicas[1], keyed("bob")))[0] == 200
        for app in replicas:
            assert app._quota is not None and app._quota.shared is not None and not app._quota.shared.degraded
            await app.backend.stop()  # type: ignore[union-attr]
        return statuses

    statuses = anyio.run(run)
    assert statuses.count(200) == 5 and statuses[:5] == [200] * 5 and set(statuses[5:]) == {429}


def test_without_redis_the_quota_falls_back_to_the_local_count_and_logs_once(own_redis_server, caplog) -> None:
    redis_server = own_redis_server

    async def run() -> list[int]:
        app = AdmitGate(Recorder(), rate=1_000, backend=redis_server.url, identity=Identity(ticket=False),
                        quota=Quota("3/minute"))  # fmt: skip
        assert (await call(app, keyed("alice")))[0] == 200
        redis_server.kill()
        statuses = [(await call(app, keyed("alice")))[0] for _ in range(6)]
        await app.backend.stop()  # type: ignore[union-attr]
        return statuses

    with caplog.at_level(logging.WARNING, logger="admitgate"):
        statuses = anyio.run(run)
    assert statuses == [200, 200, 200, 429, 429, 429]  # the local limiter: 3 per minute in this process
    assert sum("quota backend failing" in r.getMessage() for r in caplog.records) == 1


def test_a_request_never_waits_for_a_redis_that_stopped_answering_in_time(own_redis_server) -> None:
    """Redis paused: the request that finds it slow waits one timeout, and then none waits for it. Before, once
    every cooldown one request waited the whole timeout to learn whether Redis was back; a PING in the
    background asks now, and once it answers the next request counts in Redis again."""
    import asyncio

    import redis
    import redis.asyncio as aioredis

    from admitgate.backends.quota import Cell, RedisQuota

    async def run() -> None:
        clock = ManualClock(1000.0)
        rate = QuotaRate(100, 60.0)
        limiter = QuotaLimiter(rate, clock, 100)
        cell = Cell(limiter, "alice", "q:{a}:alice", "a", (repr(rate.interval), repr(rate.tolerance)))
        client = aioredis.Redis.from_url(own_redis_server.url)
        quota = RedisQuota(client, clock, timeout=0.2, cooldown=0.5)
        assert (await quota.check([cell])).refused == -1 and not quota.degraded
        pause = redis.Redis.from_url(own_redis_server.url)
        pause.execute_command("CLIENT", "PAUSE", "4000")
        pause.close()
        assert (await quota.check([cell])).refused == -1 and quota.degraded  # (its one timeout)
        for _ in range(2):  # cooldowns over: decided at once, Redis asked in the background
            clock.advance(0.5)
            check = asyncio.ensure_future(quota.check([cell]))
            await asyncio.sleep(0)
            assert check.done() and check.result().refused == -1
            assert quota.degraded
            assert quota._probe is not None
            await quota._probe  # (the PING's timeout)
            assert quota.degraded
        while quota.degraded:  # until the pause ends
            clock.advance(0.5)
            await quota.check([cell])
            await quota._probe
        counted = await client.pttl("q:{a}:alice")
        assert (await quota.check([cell])).refused == -1 and await client.pttl("q:{a}:alice") > counted  # in Redis
        await client.aclose()

    asyncio.run(run())


@pytest.mark.anyio
async def test_with_on_admit_an_allowed_response_carries_the_quotas_fields_beside_the_gates(clock, sleep) -> None:
    """RateLimit and RateLimit-Policy list both policies (the draft's fields are lists): the gate's bucket and
    the key's quota, with what is left of it and its effective window (the seconds within which no more than
    that can be used: until the next request comes back, one interval of 20 s here)."""
    inner = Recorder()
    app = AdmitGate(inner, rate=1_000, settings=Settings(burst=1_000), clock=clock, sleep=sleep,
                    identity=Identity(ticket=False), quota=Quota("3/minute"),
                    headers=HeaderPolicy(on_admit=True))  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    fields = []
    for _ in range(3):
        sent.clear()
        await app(keyed("alice"), receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        fields.append([(k, v) for k, v in start["headers"] if k in (b"ratelimit", b"ratelimit-policy")])
    assert (b"ratelimit-policy", b'"quota";q=3;w=60') in fields[0]
    assert (b"ratelimit", b'"quota";r=2;t=20') in fields[0]  # two more at once, a third 20 s on
    assert (b"ratelimit", b'"quota";r=1;t=20') in fields[1]
    assert (b"ratelimit", b'"quota";r=0;t=20') in fields[2]
    assert sum(1 for k, v in fields[0] if k == b"ratelimit" and not v.startswith(b'"quota"')) == 1  # the gate's


@settings(deadline=None)
@given(limit=st.integers(1, 40), window=st.sampled_from([1.0, 10.0, 60.0, 3600.0]), burst=st.integers(1, 40),
       gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40))  # fmt: skip
def test_a_quotas_t_is_its_effective_window(limit: int, window: float, burst: int, gaps: list[float]) -> None:
    """draft-ietf-httpapi-ratelimit-headers-11 §4.1.2: ``t`` is the effective window, the seconds within which
    the key can make no more than ``r`` requests. Its ``r`` requests go in at once, and the next one comes back
    within the last second of ``t`` (whole seconds, rounded up: never sooner than ``t`` tells)."""
    rate = QuotaRate(limit, window, min(burst, limit))
    clock = ManualClock(100.0)
    limiter = QuotaLimiter(rate, clock)
    for gap in gaps:
        clock.advance(gap * rate.interval)
        limiter.check("k")
    clock.advance(max(0.0, limiter.wait("k", clock())))
    answer = limiter.check("k")
    assert answer.wait == 0.0
    r, t = answer.remaining(rate), answer.window(rate)
    for _ in range(r):
        assert limiter.check("k").wait == 0.0
    wait = limiter.wait("k", clock())
    assert t - 1 - 1e-6 < wait <= t + 1e-6
