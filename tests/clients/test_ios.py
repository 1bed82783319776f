"""Firefox for iOS against the service: App Attest (attestation once, an assertion with a fresh
challenge per request), its SSE parser and status handling (tests/clients/ios.py), in every
matrix cell and every case; and two requests of one device in flight at once."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest

from tests.conftest import Service
from tests.support.app_attest_device import TestAttestationCA, TestDevice

from . import ios
from .conftest import (
    CASES,
    IOS_BUNDLE,
    TEAM,
    Cell,
    ClientServiceFactory,
    base_url,
    block_user,
    case_text,
    cell_params,
    during_shutdown,
)
from .ios import IOSAnswer, IOSApp

# case -> (status, what the app tells its user; None: the summary)
SHOWN: dict[str, tuple[int, str | None]] = {
    "success": (200, None),
    # In-band error events are not chunks: the strict decode fails, a generic error.
    "budget_exceeded": (200, ios.GENERIC),
    "rate_limited": (200, ios.GENERIC),
    "provider_throttling": (200, ios.GENERIC),
    "context_too_large": (200, ios.GENERIC),
    "request_too_large": (413, ios.TOO_LARGE),
    # The app words every 403 as "maximum users reached", a blocked user's too.
    "blocked_user": (403, ios.MAX_USERS),
    "signup_cap_reached": (403, ios.MAX_USERS),
    "bad_model": (200, ios.GENERIC),
    "bad_credentials": (401, ios.GENERIC),
    "expired_credentials": (401, ios.GENERIC),
    "server_shutdown": (200, ios.GENERIC),
    "upstream_cut": (200, ios.GENERIC),
    "upstream_error_event": (200, ios.GENERIC),
    "global_budget_exceeded": (200, ios.GENERIC),
}
assert set(SHOWN) == set(CASES)


async def run_case(service: Service, app: IOSApp, session: aiohttp.ClientSession, case: str) -> IOSAnswer:
    text = case_text(case)
    if case == "bad_credentials":
        return await app.summarize(session, text, wrong_key=True)
    if case == "expired_credentials":
        # A request re-sent with its challenge: spent by the first send, so no longer valid.
        body, headers = await app.signed_request(session, app.summary_payload(text))
        assert (await app.send(session, body, headers)).error is None
        return await app.send(session, body, headers)
    if case == "blocked_user":
        assert (await app.summarize(session)).error is None
        await block_user(service, service.litellm.requests_to("/v1/chat/completions")[-1].json["user"])
    if case == "server_shutdown":
        return await during_shutdown(service, app.summarize(session, text))
    return await app.summarize(session, text)


@cell_params()
@pytest.mark.parametrize("case", CASES)
async def test_ios_app(client_service: ClientServiceFactory, attestation_ca: TestAttestationCA, cell: Cell, case: str) -> None:
    service = await client_service(cell, case, ios.SERVICE_TYPE)
    app = IOSApp(base_url(service), TestDevice(attestation_ca, TEAM, IOS_BUNDLE))
    async with aiohttp.ClientSession() as session:
        answer = await run_case(service, app, session, case)
    assert (answer.status, answer.shown) == SHOWN[case], answer
    if case == "success":
        assert answer.text == service.litellm.completion_text()
        assert answer.raw.startswith(b"\n") is cell.keepalive, answer.raw[:20]
        sent = service.litellm.requests_to("/v1/chat/completions")[-1].json
        assert sent["user"] == f"{app.device.key_id_b64}:{ios.SERVICE_TYPE}"
    if case == "upstream_cut":
        assert answer.text, "the text before the cut was shown"
    if answer.shown == ios.GENERIC and answer.status == 200:
        assert answer.error == ios.INVALID_DATA


async def test_key_ids_with_plus_and_slash_travel_unescaped(client_service: ClientServiceFactory, attestation_ca) -> None:
    service = await client_service(Cell(fast_path=False, keepalive=False), "success", ios.SERVICE_TYPE)
    device = TestDevice(attestation_ca, TEAM, IOS_BUNDLE)
    while "+" not in device.key_id_b64 or "/" not in device.key_id_b64:
        device = TestDevice(attestation_ca, TEAM, IOS_BUNDLE)
    app = IOSApp(base_url(service), device)
    async with aiohttp.ClientSession() as session:
        answer = await app.summarize(session, "Slashes / and non-ASCII: Füchse")
    assert (answer.status, answer.error, answer.text) == (200, None, service.litellm.completion_text())
    assert all(f"key_id_b64={device.key_id_b64}" in url for url in app.challenge_urls)
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == f"{device.key_id_b64}:{ios.SERVICE_TYPE}"


async def test_two_requests_in_flight_from_one_device(client_service: ClientServiceFactory, attestation_ca) -> None:
    """Each request fetches its own challenge, but there is one challenge per key: both
    fetches get the one in force, the first assertion to arrive spends it, the other is a
    clean 401 "Invalid or expired challenge" (or, when its counter was overtaken, 401
    "Invalid App Attest assertion"). Never a 5xx; both succeed when they do not overlap."""
    service = await client_service(Cell(fast_path=False, keepalive=False), "success", ios.SERVICE_TYPE)
    app = IOSApp(base_url(service), TestDevice(attestation_ca, TEAM, IOS_BUNDLE))
    async with aiohttp.ClientSession() as session:
        await app.perform_attestation(session)
        # Both requests sign before either is sent: their challenge fetches overlap.
        first, second = await asyncio.gather(
            app.signed_request(session, app.summary_payload("first tab")),
            app.signed_request(session, app.summary_payload("second tab")),
        )
        challenges = {envelope_challenge(headers) for _, headers in (first, second)}
        assert len(challenges) == 1, "one challenge per key: both fetches got the one in force"
        answers = await asyncio.gather(
            *(session.post(f"{app.base_url}/v1/chat/completions", data=body, headers=headers) for body, headers in (first, second))
        )
        results = sorted([(response.status, await response.read()) for response in answers])
        # One after the other, each with its own fresh challenge: both succeed.
        sequential = [await app.summarize(session, f"tab {n}") for n in range(2)]
    assert results[0][0] == 200 and results[0][1].endswith(b"data: [DONE]\n\n")
    assert results[1][0] == 401
    assert results[1][1] in (b'{"detail": "Invalid or expired challenge"}', b'{"detail": "Invalid App Attest assertion"}')
    assert [(a.status, a.error) for a in sequential] == [(200, None), (200, None)]


def envelope_challenge(headers: dict[str, str]) -> str:
    """The challenge a request's assertion envelope carries."""
    claims = headers["Authorization"].split(" ", 1)[1].split(".")[1]
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    return base64.b64decode(decoded["challenge_b64"]).decode()
