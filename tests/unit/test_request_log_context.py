"""Each request's log line carries its own context only, also on a kept-alive connection
(the middleware no longer clears the context after the line: each request's handler runs in
a task of its own, whose copy of the context ends with it)."""

from __future__ import annotations

import pytest

from ..conftest import Service, chat_body, events


async def test_a_request_on_the_same_connection_does_not_inherit_the_previous_context(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    first = await service.chat(chat_body(stream=True))
    assert first.status == 200
    await first.read()
    second = await service.client.get("/health/liveness")
    assert second.status == 200
    await second.read()
    # The test client keeps its connection alive: both handlers' tasks were started by
    # the same connection task, from its context.

    lines = [event for event in events(caplog) if event.get("event") == "request"]
    chat_line, health_line = lines[-2], lines[-1]
    assert chat_line["user"] == "test-uid:ai" and chat_line["model"] == "gpt-oss-120b"
    assert health_line["route"] == "/health/liveness"
    for key in ("user", "model", "auth_method", "result", "completion_tokens"):
        assert key not in health_line, f"{key} leaked into the next request's line: {health_line}"
    assert health_line["request_id"] != chat_line["request_id"]
