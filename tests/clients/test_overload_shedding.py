"""What each client makes of a shed request (OVERLOAD_PROTECTION, ours; compatibility.md
D39): 503 `{"detail": "Service Unavailable"}` with `Retry-After` while the worker is
overloaded. The overload here is the open-stream bound at one stream, held by another
request of the same client, so the 503 comes at a known moment and nothing else (loop lag,
the accept queue) decides it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Service
from tests.support.app_attest_device import TestDevice
from tests.support.metrics import sample

from . import android, desktop, ios
from .android import AndroidApp
from .conftest import HOLD_TEXT, IOS_BUNDLE, TEAM, Cell, ClientServiceFactory, base_url, while_one_stream_is_held
from .ios import AppAttestServiceError, IOSApp

RETRY_AFTER_SECONDS = 1
SHEDDING = {
    "OVERLOAD_PROTECTION": "true",
    "OVERLOAD_MAX_OPEN_STREAMS": "1",
    "OVERLOAD_LAG_ENTER_MS": "600000",  # the bound decides, never a stall of the test machine
    "OVERLOAD_MAX_ACCEPT_QUEUE": "0",
    "OVERLOAD_RETRY_AFTER_SECONDS": str(RETRY_AFTER_SECONDS),
}


async def _shedding_service(client_service: ClientServiceFactory, service_type: str) -> Service:
    return await client_service(Cell(fast_path=True, keepalive=False), "success", service_type, **SHEDDING)


def _shed(service: Service) -> float:
    return sample(service, "mlpa_shed_requests_total", {"reason": "open_streams"})


async def test_android_shows_a_server_error_503_when_shed(client_service, google) -> None:
    service = await _shedding_service(client_service, android.SERVICE_TYPE)
    app = AndroidApp(base_url(service), google)
    async with aiohttp.ClientSession() as session:
        await app.verify(session)  # before the overload: its grant is cached
        answer = await while_one_stream_is_held(service, app.summarize(session, HOLD_TEXT), app.summarize(session))
    # Not 401/403/413/429/502: `ServerError(status)`, the app's "something went wrong".
    assert (answer.status, answer.error, answer.error_status) == (503, android.SERVER_ERROR, 503), answer
    assert _shed(service) == 1


async def test_ios_fails_at_its_fresh_challenge_when_shed(client_service, attestation_ca) -> None:
    service = await _shedding_service(client_service, ios.SERVICE_TYPE)
    app = IOSApp(base_url(service), TestDevice(attestation_ca, TEAM, IOS_BUNDLE))
    async with aiohttp.ClientSession() as session:
        await app.perform_attestation(session)
        with pytest.raises(AppAttestServiceError) as refused:
            await while_one_stream_is_held(service, app.summarize(session, HOLD_TEXT), app.summarize(session))
    # Every request starts with GET /verify/challenge: that is the request shed, so the
    # completion is never sent and no challenge is spent; errors are read by status only.
    assert refused.value.status == 503
    assert ios.shown_for_status(refused.value.status) == ios.GENERIC
    assert len(service.litellm.requests_to("/v1/chat/completions")) == 1  # the held one
    assert _shed(service) == 1


@pytest.fixture
def sdk(tmp_path: Path):
    if (reason := desktop.missing_reason()) is not None:
        pytest.skip(reason)
    worker = desktop.SdkWorker(tmp_path / "node-stderr.log")
    yield worker
    worker.close()


async def test_desktop_sdk_raises_internal_server_error_when_shed_without_retries(client_service, sdk) -> None:
    service = await _shedding_service(client_service, desktop.SERVICE_TYPE)
    token = service.fxa.issue_jwt("desktop-uid")
    request = desktop.chat_request(base_url(service), token, "hello")
    request["maxRetries"] = 0
    async with aiohttp.ClientSession() as session:
        held = desktop.hold_stream(session, base_url(service), token, HOLD_TEXT)
        result = await while_one_stream_is_held(service, held, sdk.call(request))
    assert (result["error"]["class"], result["error"]["status"]) == ("InternalServerError", 503), result
    assert _shed(service) == 1


async def test_desktop_sdk_retries_a_shed_request_after_retry_after_and_gets_its_answer(client_service, sdk) -> None:
    """The desktop engine keeps the SDK's own retries (503 is retryable there): shed once,
    it waits `Retry-After` and asks again; by then the overload is over."""
    service = await _shedding_service(client_service, desktop.SERVICE_TYPE)
    token = service.fxa.issue_jwt("desktop-uid")
    async with aiohttp.ClientSession() as session:
        held = asyncio.ensure_future(desktop.hold_stream(session, base_url(service), token, HOLD_TEXT))
        deadline = time.monotonic() + 10
        while not service.litellm.requests_to("/v1/chat/completions"):
            assert time.monotonic() < deadline and not held.done()
            await asyncio.sleep(0.01)
        started = time.monotonic()
        asked = asyncio.ensure_future(sdk.call(desktop.chat_request(base_url(service), token, "hello")))
        while _shed(service) < 1:
            assert time.monotonic() < deadline and not asked.done()
            await asyncio.sleep(0.01)
        held.cancel()  # the overload ends: the held stream's client gives up
        await asyncio.gather(held, return_exceptions=True)
        result = await asyncio.wait_for(asked, 30)
    assert "error" not in result, result.get("error")
    assert desktop.streamed_text(result) == service.litellm.completion_text()
    assert time.monotonic() - started >= RETRY_AFTER_SECONDS  # it waited as told
    assert _shed(service) == 1
