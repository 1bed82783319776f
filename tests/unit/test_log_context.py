"""The log fields of a context: each bind is a copy, so tasks keep what they started with
and nothing a task binds reaches its parent or a sibling."""

from __future__ import annotations

import asyncio
from typing import Any

from mlpa_aiohttp.observability import log_context


def merged(**event: Any) -> dict[str, Any]:
    return dict(log_context.merge_fields(None, "info", event))


async def test_a_task_keeps_the_fields_it_started_with_and_binds_only_for_itself() -> None:
    log_context.begin(request_id="r1", route="/v1/chat/completions")
    started = asyncio.Event()
    seen: dict[str, Any] = {}

    async def child() -> None:
        log_context.bind(user="u:ai")
        started.set()
        await asyncio.sleep(0.01)
        seen.update(merged(event="child"))

    task = asyncio.create_task(child())
    await started.wait()
    log_context.bind(result="success")  # after the child started: not the child's
    await task
    assert seen == {"event": "child", "request_id": "r1", "route": "/v1/chat/completions", "user": "u:ai"}
    assert merged(event="parent") == {
        "event": "parent", "request_id": "r1", "route": "/v1/chat/completions", "result": "success"
    }


async def test_the_events_own_fields_win_and_begin_drops_the_previous_fields() -> None:
    log_context.begin(request_id="r1", status=200)
    assert merged(event="e", status=499) == {"event": "e", "status": 499, "request_id": "r1"}
    log_context.begin(request_id="r2")
    assert merged(event="e") == {"event": "e", "request_id": "r2"}
