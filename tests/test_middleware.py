"""The ASGI contract of AdmitGate, driven in-process with an injected clock."""

from __future__ import annotations

import json

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admitgate import AdmitGate, ConfigError, HeaderPolicy, Identity, ManualClock, Settings
from admitgate.core.gate import Gate


def http_scope(path="/x", client=("127.0.0.1", 4000), headers=(), method="GET"):
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": client,
            "server": ("127.0.0.1", 8000), "headers": list(headers)}  # fmt: skip


async def call(app, scope, messages=None):
    """Run one request through ``app``; return (status, headers dict, body)."""
    inbox = list(messages or [{"type": "http.request", "body": b"", "more_body": False}])
    sent = []

    async def receive():
        if inbox:
            return inbox.pop(0)
        await anyio.sleep_forever()

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


class Recorder:
    """An ASGI app that records calls and echoes the request body."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]})
        await send({"type": "http.response.body", "body": body or b"ok"})


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_admits_then_rejects_with_the_full_header_set(clock: ManualClock, sleep) -> None:
    inner = Recorder()
    app = AdmitGate(
        inner, rate=10, clock=clock, sleep=sleep, wall_clock=lambda: 1e9, settings=Settings(burst=2, max_pacing_delay=0)
    )
    assert (await call(app, http_scope()))[0] == 200
    assert (await call(app, http_scope()))[0] == 200
    status, headers, body = await call(app, http_scope())
    assert status == 429 and inner.calls == 2
    assert headers["retry-after"] == "1"
    assert headers["ratelimit"] == '"admitgate";r=0;t=1'
    assert headers["ratelimit-policy"] == '"admitgate";q=10;w=1'
    assert headers["content-type"] == "application/problem+json"
    assert headers["set-cookie"].startswith("admitgate_rt=")
    assert json.loads(body)["status"] == 429


@pytest.mark.anyio
async def test_503_and_legacy_headers_are_configurable(clock: ManualClock, sleep) -> None:
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        sleep=sleep,
        headers=HeaderPolicy(status=503, legacy=True),
        settings=Settings(burst=1, max_pacing_delay=0),
        identity=Identity(ticket=False),
    )
    await call(app, http_scope())
    status, headers, _ = await call(app, http_scope())
    assert status == 503 and headers["x-ratelimit-reset"] == headers["retry-after"]
    assert "set-cookie" not in headers


@pytest.mark.anyio
async def test_rate_limit_fields_on_admitted_responses(clock: ManualClock, sleep) -> None:
    app = AdmitGate(
        Recorder(), rate=5, clock=clock, sleep=sleep, headers=HeaderPolicy(on_admit=True), settings=Settings(burst=3)
    )
    _, headers, _ = await call(app, http_scope())
    assert headers["ratelimit"] == '"admitgate";r=2' and headers["x-app"] == "1"
    assert "Retry-After" in headers["access-control-expose-headers"]


@pytest.mark.anyio
async def test_exempt_routes_and_route_costs(clock: ManualClock, sleep) -> None:
    inner = Recorder()
    app = AdmitGate(
        inner,
        rate=1,
        routes={"/heavy/{id}": {"cost": 2}},
        clock=clock,
        sleep=sleep,
        settings=Settings(burst=2, max_pacing_delay=0),
    )
    assert (await call(app, http_scope("/heavy/7")))[0] == 200
    assert (await call(app, http_scope("/x")))[0] == 429  # the heavy one took both tokens
    for _ in range(5):
        assert (await call(app, http_scope("/health")))[0] == 200


@pytest.mark.anyio
async def test_pacing_holds_then_admits_and_replays_the_body(clock: ManualClock, sleep) -> None:
    inner = Recorder()
    app = AdmitGate(inner, rate=20, clock=clock, sleep=sleep, settings=Settings(burst=1, max_pacing_delay=1.0))
    await call(app, http_scope())
    start = clock()
    body = [{"type": "http.request", "body": b"hel", "more_body": True},
            {"type": "http.request", "body": b"lo", "more_body": False}]  # fmt: skip
    status, _, echoed = await call(app, http_scope(method="POST"), body)
    assert status == 200 and echoed == b"hello"
    assert clock() - start == pytest.approx(0.05)  # held for its token (1/20 s)
    assert app.gate.stats.paced == 1 and app.gate.waiters == 0


@pytest.mark.anyio
async def test_disconnect_while_paced_releases_the_slot(clock: ManualClock, sleep) -> None:
    inner = Recorder()
    app = AdmitGate(inner, rate=2, clock=clock, sleep=sleep, settings=Settings(burst=1, max_pacing_delay=1.0))
    await call(app, http_scope())
    sent = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(http_scope(), receive, send)
    assert sent == [] and inner.calls == 1
    assert app.gate.stats.abandoned == 1 and app.gate.waiters == 0
    # -1 reserved, +1 refilled over the (virtual) half second, +1 refunded: the reserved token came back
    assert app.gate.pacer.tokens(clock()) == pytest.approx(1.0)


@pytest.mark.anyio
async def test_app_exceptions_propagate_unchanged(clock: ManualClock, sleep) -> None:
    class Boom(Exception):
        pass

    async def broken(scope, receive, send):
        raise Boom("from the app")

    app = AdmitGate(broken, rate=10, clock=clock, sleep=sleep)
    with pytest.raises(Boom, match="from the app"):
        await call(app, http_scope())


@pytest.mark.anyio
async def test_lifespan_and_other_scopes_pass_straight_through(clock: ManualClock, sleep) -> None:
    seen = []

    async def inner(scope, receive, send):
        seen.append(scope["type"])

    app = AdmitGate(inner, rate=1, clock=clock, sleep=sleep, settings=Settings(burst=1))
    for kind in ("lifespan", "websocket", "custom"):
        await app({"type": kind, "path": "/"}, None, None)
    assert seen == ["lifespan", "websocket", "custom"]


@pytest.mark.anyio
async def test_returning_client_with_its_ticket_keeps_its_slot_on_a_new_connection(clock: ManualClock, sleep) -> None:
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        sleep=sleep,
        wall_clock=lambda: 1e9,
        settings=Settings(burst=1, max_pacing_delay=0, tarpit=0),
    )
    await call(app, http_scope())
    for port in range(5000, 5010):  # ten other clients queue first
        await call(app, http_scope(client=("10.0.0.9", port)))
    _, first, _ = await call(app, http_scope(client=("10.0.0.9", 6000)))
    cookie = first["set-cookie"].split(";")[0]
    clock.advance(0.5)
    _, again, _ = await call(app, http_scope(client=("10.0.0.9", 6001), headers=[(b"cookie", cookie.encode())]))
    assert again["retry-after"] == first["retry-after"] == "11"
    assert app.gate.schedule.horizon(clock()) == pytest.approx(11.5)  # not extended by the return


@pytest.mark.anyio
async def test_an_early_returner_is_held_and_told_the_remaining_wait(clock: ManualClock, sleep) -> None:
    app = AdmitGate(
        Recorder(), rate=1, clock=clock, sleep=sleep, settings=Settings(burst=1, max_pacing_delay=0, tarpit=0.2)
    )
    await call(app, http_scope())
    for port in range(5000, 5005):
        await call(app, http_scope(client=("10.0.0.9", port)))
    _, first, _ = await call(app, http_scope(client=("10.0.0.9", 6000)))
    start = clock()
    _, again, _ = await call(app, http_scope(client=("10.0.0.9", 6000)))  # same connection, right away
    assert clock() - start == pytest.approx(0.2)  # held by the tarpit
    assert first["retry-after"] == "6" and again["retry-after"] == "6"  # ceil(6 - 0.2): never early
    assert app.gate.stats.early == 1 and app.gate.tarpitted == 0


@pytest.mark.anyio
async def test_a_forged_ticket_is_not_recognised(clock: ManualClock, sleep) -> None:
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        sleep=sleep,
        wall_clock=lambda: 1e9,
        settings=Settings(burst=1, max_pacing_delay=0),
    )
    await call(app, http_scope())
    _, first, _ = await call(app, http_scope(client=("10.0.0.9", 1)))
    forged = first["set-cookie"].split(";")[0][:-2] + "xx"
    _, second, _ = await call(app, http_scope(client=("10.0.0.9", 2), headers=[(b"cookie", forged.encode())]))
    assert int(second["retry-after"]) > int(first["retry-after"])


@pytest.mark.anyio
async def test_a_failing_key_function_never_fails_the_request(clock: ManualClock, sleep) -> None:
    def bad_key(scope):
        raise KeyError("no such header")

    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        sleep=sleep,
        settings=Settings(burst=1, max_pacing_delay=0),
        identity=Identity(key=bad_key),
    )
    await call(app, http_scope())
    assert (await call(app, http_scope()))[0] == 429


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.anyio
async def test_a_key_whose_repr_raises_is_anonymous_never_a_500(clock: ManualClock, caplog) -> None:
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        settings=Settings(burst=1, max_pacing_delay=0),
        identity=Identity(key=lambda scope: Unprintable()),
    )
    await call(app, http_scope())
    statuses = [await call(app, http_scope()) for _ in range(3)]
    assert [s for s, _, _ in statuses] == [429] * 3
    assert all("set-cookie" in h for _, h, _ in statuses)  # anonymous: the ticket will recognise it
    assert len([r for r in caplog.records if "key function" in r.getMessage()]) == 1


@pytest.mark.anyio
async def test_a_connection_that_carries_another_users_request_does_not_give_it_that_users_slot(
    clock: ManualClock,
) -> None:
    # a reverse proxy (trusted_hops 0) or a client pool multiplexes users over one keep-alive connection
    app = AdmitGate(Recorder(), rate=1, clock=clock, settings=Settings(burst=1, max_pacing_delay=0, tarpit=0))
    await call(app, http_scope())
    pooled = ("10.0.0.5", 7000)
    _, alice, _ = await call(app, http_scope(client=pooled, headers=[(b"authorization", b"Bearer alice")]))
    _, bob, _ = await call(app, http_scope(client=pooled, headers=[(b"authorization", b"Bearer bob")]))
    assert int(bob["retry-after"]) > int(alice["retry-after"]) and app.gate.stats.early == 0
    _, back, _ = await call(app, http_scope(client=pooled, headers=[(b"authorization", b"Bearer alice")]))
    assert back["retry-after"] == alice["retry-after"] and app.gate.stats.early == 1


@pytest.mark.anyio
async def test_a_client_without_an_address_gets_a_ticket_and_keeps_its_slot(clock: ManualClock) -> None:
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        wall_clock=lambda: 1e9,
        settings=Settings(burst=1, max_pacing_delay=0, tarpit=0),
    )
    await call(app, http_scope(client=None))
    retry_after = []
    cookie = b""
    for _ in range(3):  # a Unix socket: no client address at all
        _, headers, _ = await call(app, http_scope(client=None, headers=[(b"cookie", cookie)] if cookie else []))
        retry_after.append(headers["retry-after"])
        cookie = headers["set-cookie"].split(";")[0].encode()
    assert retry_after == ["1", "1", "1"]


@pytest.mark.anyio
async def test_ticket_ids_are_keyed_with_the_secret() -> None:
    def ticket_id(secret: bytes) -> str:
        return cookies[secret].split("=", 1)[1].split(".")[0]

    cookies = {}
    for secret in (b"one", b"two"):
        app = AdmitGate(
            Recorder(),
            rate=1,
            clock=ManualClock(0.0),
            wall_clock=lambda: 1e9,
            settings=Settings(burst=1, max_pacing_delay=0),
            identity=Identity(key="header:authorization", ticket=secret),
        )
        await call(app, http_scope())
        _, headers, _ = await call(app, http_scope(headers=[(b"authorization", b"Bearer guessable")]))
        cookies[secret] = headers["set-cookie"]
    assert ticket_id(b"one") != ticket_id(b"two")  # an unkeyed hash of the credential would be the same


@pytest.mark.anyio
async def test_the_ticket_cookie_is_secure_over_https_or_when_forced() -> None:
    async def cookie(scheme: str, **options) -> str:
        app = AdmitGate(
            Recorder(), rate=1, clock=ManualClock(0.0), **options, settings=Settings(burst=1, max_pacing_delay=0)
        )
        await call(app, http_scope())
        return (await call(app, {**http_scope(), "scheme": scheme}))[1]["set-cookie"]

    assert "; Secure" in await cookie("https")
    assert "Secure" not in await cookie("http")
    forced = await cookie("http", identity=Identity(secure_cookie=True))
    assert "; Secure" in forced and "HttpOnly" in forced and "SameSite=Lax" in forced


@pytest.mark.anyio
@pytest.mark.parametrize("split", [True, False])
async def test_the_ticket_is_read_from_any_cookie_line_and_when_quoted(clock: ManualClock, split: bool) -> None:
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        wall_clock=lambda: 1e9,
        settings=Settings(burst=1, max_pacing_delay=0, tarpit=0),
    )
    await call(app, http_scope())
    for port in range(5000, 5005):
        await call(app, http_scope(client=("10.0.0.9", port)))
    _, first, _ = await call(app, http_scope(client=("10.0.0.9", 6000)))
    value = first["set-cookie"].split(";")[0].split("=", 1)[1]
    if split:  # as HTTP/2 sends cookies: one field line each
        cookies = [(b"cookie", b"session=1"), (b"cookie", f"admitgate_rt={value}".encode())]
    else:
        cookies = [(b"cookie", f'session=1; admitgate_rt="{value}"'.encode())]
    _, again, _ = await call(app, http_scope(client=("10.0.0.9", 6001), headers=cookies))
    assert again["retry-after"] == first["retry-after"]


HEADER_NAMES = [b"cookie", b"x-forwarded-for", b"forwarded", b"authorization", b"x-api-key"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(HEADER_NAMES), st.binary(max_size=120)), max_size=6))
def test_garbage_headers_never_turn_into_a_500(headers) -> None:
    clock = ManualClock(0.0)
    app = AdmitGate(
        Recorder(),
        rate=1,
        clock=clock,
        settings=Settings(burst=1, max_pacing_delay=0),
        identity=Identity(trusted_hops=2),
    )

    async def run():
        return [(await call(app, http_scope(headers=headers)))[0] for _ in range(3)]

    assert anyio.run(run) == [200, 429, 429]


def test_invalid_configuration_fails_at_construction_naming_the_field() -> None:
    cases = [({"rate": 0}, "rate"), ({"rate": -1}, "rate"), ({"rate": "100"}, "rate"), ({"rate": 1e308}, "rate"),
             ({"rate": 10, "settings": Settings(burst=1), "routes": {"/big": {"cost": 2}}}, "routes['/big'].cost"),
             ({"settings": {"burst": 1}}, "settings"), ({"identity": "connection"}, "identity"),
             ({"headers": "x"}, "headers"), ({"metrics": True}, "metrics"), ({"clock": "x"}, "clock"),
             ({"clock": lambda: "x"}, "clock"), ({"wall_clock": lambda: None}, "wall_clock"),
             ({"wall_clock": lambda now: now}, "wall_clock"), ({"sleep": lambda s: None}, "sleep"),
             ({"backend": "redis://h:notaport"}, "backend"), ({"backend": 5}, "backend"),
             ({"gate_websockets": "no"}, "gate_websockets"), ({"workers": 0}, "workers"),
             ({"gate": Gate(10), "rate": 10}, "gate"), ({"gate": Gate(10), "settings": Settings()}, "gate"),
             ({"gate": object()}, "gate")]  # fmt: skip
    for kwargs, field in cases:
        with pytest.raises(ConfigError) as info:
            AdmitGate(Recorder(), **kwargs)
        assert info.value.field == field, kwargs


def test_identity_settings_fail_where_they_are_written() -> None:
    cases = [({"spread": "lifo"}, Settings, "spread"), ({"tarpit": -1}, Settings, "tarpit"),
             ({"max_tarpitted": -1}, Settings, "max_tarpitted"), ({"key": "ip-address"}, Identity, "key"),
             ({"key": "header:日本"}, Identity, "key"), ({"key": "header: x api"}, Identity, "key"),
             ({"trusted_hops": -1}, Identity, "trusted_hops"), ({"forwarded": "both"}, Identity, "forwarded"),
             ({"trusted_hops": "x", "key": "header:x"}, Identity, "trusted_hops"),
             ({"ticket": None}, Identity, "ticket"), ({"ticket": b""}, Identity, "ticket"),
             ({"secure_cookie": 1}, Identity, "secure_cookie")]  # fmt: skip
    for kwargs, kind, field in cases:
        with pytest.raises(ConfigError) as info:
            kind(**kwargs)
        assert info.value.field == field, kwargs


def test_a_prebuilt_gate_gives_the_backend_its_own_rate() -> None:
    from admitgate.backends.shared import RedisBudget

    class Client:  # no Redis needed: attach only reads the gate
        def register_script(self, script):
            return None

    budget = RedisBudget("redis://localhost", client=Client())
    AdmitGate(Recorder(), gate=Gate(40, Settings(burst=4)), backend=budget)
    assert budget.fleet_rate == 40  # was the default rate of 100: gate= dropped the rate


@pytest.mark.anyio
async def test_probes_record_latency_to_the_last_body_chunk_and_outcomes(clock: ManualClock, sleep) -> None:
    from admitgate.limit.capacity import LiveCapacity
    from admitgate.limit.estimators import BandwidthDelay

    async def streaming(scope, receive, send):
        if scope["path"] == "/boom":
            raise RuntimeError("app bug")
        status = 503 if scope["path"] == "/busy" else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        clock.advance(0.25)  # the body streams for a quarter of a second
        await send({"type": "http.response.body", "body": b"b"})

    source = LiveCapacity(BandwidthDelay(seed=1), initial=100, now=clock())
    gate = AdmitGate(streaming, rate=source, clock=clock, sleep=sleep)
    probes = gate.gate.probes
    assert probes is source.probes
    assert (await call(gate, http_scope("/ok")))[0] == 200
    assert (probes.total, probes.inflight, probes.total_latency) == (1, 0, pytest.approx(0.25))
    await call(gate, http_scope("/busy"))
    assert probes.total_drops == 1
    with pytest.raises(RuntimeError):
        await call(gate, http_scope("/boom"))
    assert (probes.total, probes.total_errors, probes.inflight) == (2, 1, 0)


@pytest.mark.anyio
async def test_a_cancelled_or_silent_request_leaves_flight_and_gives_no_sample(clock: ManualClock, sleep) -> None:
    """A request cancelled after its response began, one cancelled before, and one whose app returned without a
    response: each is out of flight (and out of the answered count) at its end, and none gives a latency sample; rate-
    limit fields on admission (an exchange of its own) report to the probes as a plain request does."""
    from admitgate.limit.capacity import LiveCapacity
    from admitgate.limit.estimators import Static

    async def service(scope, receive, send):
        if scope["path"] == "/silent":
            return
        if scope["path"] == "/streaming":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        started.set()
        await anyio.sleep_forever()

    for headers in (None, HeaderPolicy(on_admit=True)):
        source = LiveCapacity(Static(100.0), initial=100.0, now=clock())
        app = AdmitGate(service, rate=source, clock=clock, sleep=sleep, headers=headers)
        probes = source.probes
        for path in ("/streaming", "/waiting"):
            started = anyio.Event()
            async with anyio.create_task_group() as group:
                group.start_soon(app, http_scope(path), None, _discard)
                await started.wait()
                assert (probes.inflight, probes.answered) == (1, int(path == "/streaming"))
                group.cancel_scope.cancel()
            assert (probes.inflight, probes.answered, probes.total) == (0, 0, 0)
        await app(http_scope("/silent"), None, _discard)
        assert (probes.inflight, probes.answered, probes.total, probes.total_errors) == (0, 0, 0, 0)


async def _discard(message) -> None:
    """A client's end of ``send`` that keeps nothing."""


@pytest.mark.anyio
async def test_a_static_rate_records_no_probes(clock: ManualClock, sleep) -> None:
    gate = AdmitGate(Recorder(), rate=10, clock=clock, sleep=sleep)
    assert gate.gate.probes is None
    assert (await call(gate, http_scope()))[0] == 200


@pytest.mark.anyio
async def test_holds_woken_together_take_no_more_room_in_flight_than_the_limit_leaves(clock: ManualClock) -> None:
    """Ten requests held for room under the in-flight limit. One answer leaves room for two (the limit grows by one
    as it frees its place): two holds are woken at once and go in, the newest first; eight are held on, and when all
    wake together at their timers (a real event loop runs every timer that is due in one pass) no more goes in.
    (A hold let in was counted in flight only once its watcher's task group had exited, an await later: each of
    the ten found the same room free, and all ten went in, 13 in flight under a limit of 5.)"""
    from admitgate.limit.capacity import LiveCapacity
    from admitgate.limit.estimators import Static

    ticks = [anyio.Event()]

    async def sleep(seconds: float) -> None:  # every hold sleeps until the next tick, together
        await ticks[-1].wait()

    def tick(seconds: float) -> None:
        clock.advance(seconds)
        ticks.append(anyio.Event())
        ticks[-2].set()

    answers: list[anyio.Event] = []
    order: list[int] = []

    async def service(scope, receive, send):
        order.append(int(scope["query_string"] or b"0"))
        answered = anyio.Event()
        answers.append(answered)
        await answered.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    source = LiveCapacity(Static(100.0), initial=100.0, inflight_floor=4, now=clock())
    app = AdmitGate(service, rate=source, clock=clock, sleep=sleep, settings=Settings(burst=50, max_pacing_delay=1.0))
    probes = app.gate.probes
    async with anyio.create_task_group() as group:
        for i in range(14):
            scope = http_scope()
            scope["query_string"] = str(i).encode()
            group.start_soon(call, app, scope)
            await anyio.wait_all_tasks_blocked()
        assert (len(answers), probes.inflight, probes.limit, app.gate.waiters) == (4, 4, 4.0, 10)
        answers[0].set()  # one answer: three in flight, a limit of five, and two woken to go in
        await anyio.wait_all_tasks_blocked()
        assert (len(answers), probes.inflight, probes.limit, app.gate.waiters) == (6, 5, 5.0, 8)
        assert order[4:] == [13, 12]  # (the newest held first: adaptive LIFO)
        tick(0.02)  # every hold wakes at once: no room, held on
        await anyio.wait_all_tasks_blocked()
        assert (len(answers), probes.inflight, app.gate.waiters) == (6, 5, 8)
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_streamed_responses_leave_room_under_the_inflight_limit_once_answered(clock: ManualClock, sleep) -> None:
    """Four event streams open on a fresh server (a live capacity, the default: an in-flight limit of four): each is
    answered at once and streams on for as long as its client stays. They are answered, so they leave the limit's
    room: a plain request goes in. (Counted until their bodies ended, they filled the limit for good: nothing else
    went in, every plain request was held for room and turned away with a 429, for as long as the streams lasted.)"""
    from admitgate.limit.capacity import LiveCapacity
    from admitgate.limit.estimators import Static

    ends: list[anyio.Event] = []

    async def service(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"] == "/events":
            await send({"type": "http.response.body", "body": b"data: hello\n\n", "more_body": True})
            end = anyio.Event()
            ends.append(end)
            await end.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    app = AdmitGate(service, rate=LiveCapacity(Static(100.0), initial=100.0, inflight_floor=4, now=clock()),
                    clock=clock, sleep=sleep)  # fmt: skip
    probes = app.gate.probes
    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(call, app, http_scope("/events"))
        await anyio.wait_all_tasks_blocked()
        assert (len(ends), probes.inflight, probes.limit) == (4, 4, 4.0)
        assert [(await call(app, http_scope("/x")))[0] for _ in range(3)] == [200] * 3
        assert app.gate.stats.rejected == 0 and probes.inflight == 4  # (in flight still: their bodies stream on)
        for end in ends:
            end.set()
    assert (probes.inflight, probes.answered) == (0, 0) and not app.gate.full
