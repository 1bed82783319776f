"""What each client makes of the per-user stream cap (MAX_CONCURRENT_STREAMS_PER_USER, ours):
429 `{"detail": {"error": 10}}` with `Retry-After: 5` while the caller holds its streams."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Awaitable

import aiohttp
import pytest

from tests.conftest import Service
from tests.support.app_attest_device import TestDevice

from . import android, desktop, ios
from .android import AndroidApp
from .conftest import IOS_BUNDLE, TEAM, Cell, ClientServiceFactory, base_url
from .ios import IOSApp

CAP = {"MAX_CONCURRENT_STREAMS_PER_USER": "1"}
HOLD = "Keep this open [fake:hang_after_headers]"


async def _while_one_stream_is_held(service: Service, hold: Awaitable[Any], second: Awaitable[Any]) -> Any:
    held = asyncio.ensure_future(hold)
    deadline = time.monotonic() + 10
    while not service.litellm.requests_to("/v1/chat/completions"):
        assert time.monotonic() < deadline and not held.done()
        await asyncio.sleep(0.01)
    try:
        return await second
    finally:
        held.cancel()  # the first client gives up: its stream ends
        await asyncio.gather(held, return_exceptions=True)


async def _capped_service(client_service: ClientServiceFactory, service_type: str) -> Service:
    return await client_service(Cell(fast_path=False, keepalive=False), "success", service_type, **CAP)


async def test_android_shows_a_parse_error_for_the_stream_cap(client_service, google) -> None:
    service = await _capped_service(client_service, android.SERVICE_TYPE)
    app = AndroidApp(base_url(service), google)
    async with aiohttp.ClientSession() as session:
        await app.verify(session)
        answer = await _while_one_stream_is_held(service, app.summarize(session, HOLD), app.summarize(session))
    # 429 whose body has no top-level integer `error`: the app cannot decode it.
    assert (answer.status, answer.error) == (429, android.PARSE_ERROR)


async def test_ios_shows_rate_limited_for_the_stream_cap(client_service, attestation_ca) -> None:
    service = await _capped_service(client_service, ios.SERVICE_TYPE)
    app = IOSApp(base_url(service), TestDevice(attestation_ca, TEAM, IOS_BUNDLE))
    async with aiohttp.ClientSession() as session:
        await app.perform_attestation(session)
        answer = await _while_one_stream_is_held(service, app.summarize(session, HOLD), app.summarize(session))
    assert (answer.status, answer.shown) == (429, ios.RATE_LIMITED)


async def test_desktop_sdk_raises_rate_limit_error_for_the_stream_cap(client_service, tmp_path: Path) -> None:
    if (reason := desktop.missing_reason()) is not None:
        pytest.skip(reason)
    service = await _capped_service(client_service, desktop.SERVICE_TYPE)
    token = service.fxa.issue_jwt("desktop-uid")
    request = desktop.chat_request(base_url(service), token, "hello")
    # The SDK would retry a 429 twice by itself, waiting Retry-After (5 s) each time; one try here.
    request["maxRetries"] = 0
    held_request = desktop.chat_request(base_url(service), token, HOLD)

    async def hold(session: aiohttp.ClientSession) -> None:
        async with session.post(
            f"{base_url(service)}/v1/chat/completions",
            data=json.dumps(held_request["body"]),
            headers={**held_request["defaultHeaders"], "authorization": f"Bearer {token}"},
        ) as response:
            await response.read()

    worker = desktop.SdkWorker(tmp_path / "node-stderr.log")
    try:
        async with aiohttp.ClientSession() as session:
            result = await _while_one_stream_is_held(service, hold(session), worker.call(request))
    finally:
        worker.close()
    assert (result["error"]["class"], result["error"]["status"]) == ("RateLimitError", 429), result
