"""Responder: the rejections it sends, and the Retry-After values it counts (what metrics export)."""

from __future__ import annotations

import pytest

from admitgate import HeaderPolicy, ManualClock, Settings
from admitgate.asgi.cors import AppCors
from admitgate.asgi.responses import Responder
from admitgate.core.gate import Gate
from admitgate.metrics import RETRY_AFTER_BOUNDS


@pytest.mark.anyio
async def test_a_rejection_is_sent_once_with_its_retry_after_and_counted_in_its_bucket() -> None:
    clock = ManualClock()
    gate = Gate(10.0, Settings())
    responder = Responder(HeaderPolicy(), AppCors(HeaderPolicy().exposed, object()), gate, None, clock, clock,
                          1.5)  # fmt: skip
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    for retry_after in (1, 7, 7, 500):
        await responder.reject({"type": "http", "headers": []}, send, retry_after, 10.0, None)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [429] * 4
    assert [dict(m["headers"])[b"retry-after"] for m in starts] == [b"1", b"7", b"7", b"500"]
    expected = [0] * (len(RETRY_AFTER_BOUNDS) + 1)
    for retry_after in (1, 7, 7, 500):
        expected[sum(1 for bound in RETRY_AFTER_BOUNDS if bound < retry_after)] += 1
    assert responder.retry_after_counts == expected and responder.retry_after_sum == 515


@pytest.mark.anyio
async def test_a_refused_handshake_is_an_http_response_where_the_server_can_send_one_else_close_1013() -> None:
    responder = Responder(HeaderPolicy(), AppCors(HeaderPolicy().exposed, object()), Gate(10.0), None,
                          ManualClock(), ManualClock(), 1.5)  # fmt: skip
    headers, body = responder.headers.rejection(3, 10.0)
    for extensions, expected in (({"websocket.http.response": {}}, "websocket.http.response.start"),
                                 ({}, "websocket.close")):  # fmt: skip
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "websocket.connect"}

        async def send(message: dict, sent: list[dict] = sent) -> None:
            sent.append(message)

        await responder.refuse_handshake({"type": "websocket", "extensions": extensions}, receive, send, headers, body)
        assert sent[0]["type"] == expected
        if expected == "websocket.close":
            assert sent[0]["code"] == 1013
