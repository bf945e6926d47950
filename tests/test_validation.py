"""Every keyword, wrong types and out-of-range values: a ConfigError naming it at construction, or a gate whose
requests are answered (200 or 429), never another exception and never a later 500."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admitgate import AdmitGate, ConfigError, HeaderPolicy, Identity, ManualClock, Priority, Settings
from admitgate.core.gate import Gate

#: Values of the wrong type or out of any range, for every keyword alike.
HOSTILE = st.sampled_from([
    None, True, False, 0, -1, 1, 2, 0.5, -0.0, 1e-300, 5e-324, 1e308, 10**30, math.nan, math.inf, -math.inf,
    "", "x", "100", "no", "日本", "connection", "header:x", "header: x api", "header:日本", "/a/{x", "redis://h:notaport",
    b"", b"x", [], [5], ["/a"], ["/a/{x:nope}"], (), {}, {"a": 5}, {"/a": 5}, {"/a": {"cost": "x"}},
    {"/a": {"exempt": "no"}}, {"default": 5}, object(), print, lambda: 1.0, lambda scope: None,
])  # fmt: skip
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**12), 10**12))
TEXT = st.text(max_size=12)
TEMPLATES = st.lists(st.one_of(TEXT, st.sampled_from(["/", "/a", "/a/{x}", "/a/{x:int}", "/{", "/a}"])), max_size=3)
SPECS = st.dictionaries(st.sampled_from(["cost", "class", "exempt", "weight"]),
                        st.one_of(NUMBERS, TEXT, st.booleans()), max_size=3)  # fmt: skip
#: Plausible values of each keyword, right or wrong.
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "rate": NUMBERS,
    "routes": st.dictionaries(
        st.one_of(TEXT, st.sampled_from(["/a", "/b/{id}"])), st.one_of(SPECS, NUMBERS), max_size=3
    ),
    "exempt": TEMPLATES,
    "classes": st.dictionaries(TEXT, st.builds(Priority, st.sampled_from(["default", "x"]), st.booleans()), max_size=2),
    "default_class": TEXT,
    "workers": st.integers(-2, 2000),
    "gate_websockets": st.one_of(st.booleans(), TEXT),
    "clock": st.sampled_from([lambda: 1.0, lambda: math.nan, lambda: "1", lambda: 1 / 0]),
    "wall_clock": st.sampled_from([lambda: 1e9, lambda: None, lambda now: now]),
    "sleep": st.sampled_from([anyio.sleep, lambda s: None]),
    "backend": st.one_of(TEXT, st.sampled_from(["memory://", "http://x", "redis://h:99999", "redis+cluster://h:x"])),
}
#: Fields a keyword's value may fail on together with another: a class list without the default class.
ALSO = {"classes": ("default_class",)}


CLOCK = ManualClock(0.0)
#: Sleeping advances the clock the gate reads, so a paced request is held for virtual time only.
virtual_sleep = CLOCK.sleep


def requests(gate: AdmitGate, n: int = 3) -> list[int]:
    """Send ``n`` GET requests through ``gate``; the statuses it answered."""

    async def hello(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> list[int]:
        statuses = []
        for _ in range(n):
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
                sent.append(message)

            scope = {"type": "http", "method": "GET", "path": "/x", "raw_path": b"/x", "query_string": b"",
                     "headers": [], "client": ("127.0.0.1", 4000), "scheme": "http", "root_path": ""}  # fmt: skip
            await gate(scope, receive, send)
            statuses.append(next(m["status"] for m in sent if m["type"] == "http.response.start"))
        return statuses

    gate.app = hello
    return anyio.run(run)


def named(error: ConfigError, name: str) -> bool:
    """Whether ``error`` names ``name`` (itself, or a part of it: ``routes['/a'].cost``, ``exempt[0]``)."""
    return any(error.field == n or error.field.startswith((n + "[", n + ".")) for n in (name, *ALSO.get(name, ())))


def construct_and_serve(name: str, build: Any) -> None:
    try:
        gate = build()
    except ConfigError as error:
        assert named(error, name), (name, error.field, str(error))
        return
    statuses = requests(gate)
    assert set(statuses) <= {200, 429} and statuses[0] == 200, statuses


@pytest.mark.parametrize("name", sorted(PLAUSIBLE))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_admitgate_keyword(name: str, data: st.DataObject) -> None:
    value = data.draw(st.one_of(HOSTILE, PLAUSIBLE[name]), label=name)
    options: dict[str, Any] = {"rate": 10, "clock": CLOCK, "sleep": virtual_sleep, name: value}
    if name in ("clock", "sleep"):  # the clock and the sleep no longer move together: nothing may be held
        options["settings"] = Settings(max_pacing_delay=0)
    construct_and_serve(name, lambda: AdmitGate(lambda scope, receive, send: None, **options))


@pytest.mark.parametrize("name", ["settings", "identity", "headers", "metrics", "gate"])
@settings(max_examples=30, deadline=None)
@given(value=HOSTILE)
def test_every_object_keyword_takes_only_its_object(name: str, value: Any) -> None:
    options: dict[str, Any] = {"clock": CLOCK, "sleep": virtual_sleep, name: value}
    construct_and_serve(name, lambda: AdmitGate(lambda scope, receive, send: None, **options))


def fields_of(kind: type) -> list[str]:
    import inspect

    return [p.name for p in inspect.signature(kind).parameters.values()]


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in (Settings, Identity, HeaderPolicy) for n in fields_of(k)])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(HOSTILE, NUMBERS, TEXT))
def test_every_field_of_settings_identity_and_headers(kind: type, name: str, value: Any) -> None:
    group = {Settings: "settings", Identity: "identity", HeaderPolicy: "headers"}[kind]

    def build() -> AdmitGate:
        return AdmitGate(lambda scope, receive, send: None, rate=10, clock=CLOCK, sleep=virtual_sleep,
                         **{group: kind(**{name: value})})  # fmt: skip

    construct_and_serve(name, build)


@settings(max_examples=100, deadline=None)
@given(rate=NUMBERS, burst=st.one_of(st.none(), NUMBERS), pacing=NUMBERS, retry=NUMBERS)
def test_a_gate_built_from_any_numbers_answers_or_names_the_field(rate, burst, pacing, retry) -> None:
    def build() -> AdmitGate:
        knobs = Settings(burst=burst, max_pacing_delay=pacing, max_retry_after=retry)
        return AdmitGate(lambda scope, receive, send: None, rate=rate, settings=knobs, clock=CLOCK,
                         sleep=virtual_sleep)  # fmt: skip

    try:
        gate = build()
    except ConfigError as error:
        assert error.field in ("rate", "burst", "max_pacing_delay", "max_retry_after"), error
        return
    assert set(requests(gate, 5)) <= {200, 429}


def test_the_gate_keyword_still_takes_a_prebuilt_gate() -> None:
    gate = AdmitGate(lambda scope, receive, send: None, gate=Gate(5, Settings(burst=1, max_pacing_delay=0)),
                     clock=CLOCK, sleep=virtual_sleep)  # fmt: skip
    assert requests(gate) == [200, 429, 429]
