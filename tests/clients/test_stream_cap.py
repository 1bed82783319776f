"""What each client makes of the per-user stream cap (MAX_CONCURRENT_STREAMS_PER_USER, ours):
429 `{"detail": {"error": 11}}` with `Retry-After: 5` while the caller holds its streams (code 11
since the reference took 10 for its global budget: compatibility.md D42; each client reads it
as it read 10, by status or as an unknown code)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Service
from tests.support.app_attest_device import TestDevice

from . import android, desktop, ios
from .android import AndroidApp
from .conftest import HOLD_TEXT, IOS_BUNDLE, TEAM, Cell, ClientServiceFactory, base_url, while_one_stream_is_held
from .ios import IOSApp

CAP = {"MAX_CONCURRENT_STREAMS_PER_USER": "1"}


async def _capped_service(client_service: ClientServiceFactory, service_type: str) -> Service:
    return await client_service(Cell(fast_path=False, keepalive=False), "success", service_type, **CAP)


async def test_android_shows_a_parse_error_for_the_stream_cap(client_service, google) -> None:
    service = await _capped_service(client_service, android.SERVICE_TYPE)
    app = AndroidApp(base_url(service), google)
    async with aiohttp.ClientSession() as session:
        await app.verify(session)
        answer = await while_one_stream_is_held(service, app.summarize(session, HOLD_TEXT), app.summarize(session))
    # 429 whose body has no top-level integer `error`: the app cannot decode it.
    assert (answer.status, answer.error) == (429, android.PARSE_ERROR)


async def test_ios_shows_rate_limited_for_the_stream_cap(client_service, attestation_ca) -> None:
    service = await _capped_service(client_service, ios.SERVICE_TYPE)
    app = IOSApp(base_url(service), TestDevice(attestation_ca, TEAM, IOS_BUNDLE))
    async with aiohttp.ClientSession() as session:
        await app.perform_attestation(session)
        answer = await while_one_stream_is_held(service, app.summarize(session, HOLD_TEXT), app.summarize(session))
    assert (answer.status, answer.shown) == (429, ios.RATE_LIMITED)


async def test_desktop_sdk_raises_rate_limit_error_for_the_stream_cap(client_service, tmp_path: Path) -> None:
    if (reason := desktop.missing_reason()) is not None:
        pytest.skip(reason)
    service = await _capped_service(client_service, desktop.SERVICE_TYPE)
    token = service.fxa.issue_jwt("desktop-uid")
    request = desktop.chat_request(base_url(service), token, "hello")
    # The SDK would retry a 429 twice by itself, waiting Retry-After (5 s) each time; one try here.
    request["maxRetries"] = 0
    worker = desktop.SdkWorker(tmp_path / "node-stderr.log")
    try:
        async with aiohttp.ClientSession() as session:
            held = desktop.hold_stream(session, base_url(service), token, HOLD_TEXT)
            result = await while_one_stream_is_held(service, held, worker.call(request))
    finally:
        worker.close()
    assert (result["error"]["class"], result["error"]["status"]) == ("RateLimitError", 429), result
