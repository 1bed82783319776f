"""Firefox for Android against the service: its Play Integrity grant, its streams, its line
reader and error mapping (tests/clients/android.py), in every matrix cell and every case."""

from __future__ import annotations

import time

import aiohttp
import pytest

from mlpa_aiohttp.auth.access_token import issue_access_token
from tests.conftest import TEST_SECRETS, Service

from . import android
from .android import AndroidAnswer, AndroidApp
from .conftest import CASES, Cell, ClientServiceFactory, base_url, block_user, case_text, cell_params, during_shutdown

# case -> (the error the app raises, its ServerError status); None: the summary is shown
SHOWN: dict[str, tuple[str | None, int | None]] = {
    "success": (None, None),
    "budget_exceeded": (android.BUDGET_EXCEEDED, None),
    "rate_limited": (android.RATE_LIMITED, None),
    # A provider's 429 wrapped by LiteLLM is error 2: "try again later", not a server error.
    "provider_throttling": (android.RATE_LIMITED, None),
    # In-band codes other than 1 and 2 are a server error to this client (as with the reference).
    "context_too_large": (android.SERVER_ERROR, 429),
    "request_too_large": (android.REQUEST_TOO_LARGE, None),
    "blocked_user": (android.USER_BLOCKED, None),
    "signup_cap_reached": (android.USER_BLOCKED, None),
    "bad_model": (android.SERVER_ERROR, 429),
    "bad_credentials": (android.INVALID_TOKEN, None),
    "expired_credentials": (android.INVALID_TOKEN, None),
    # `{"code": 503/502, "error": "<text>"}` is neither an Event nor an error code.
    "server_shutdown": (android.PARSE_ERROR, None),
    "upstream_cut": (android.PARSE_ERROR, None),
    "upstream_error_event": (android.PARSE_ERROR, None),
    # The in-band code 10 is neither 1 nor 2: a server error, like 3 and 8.
    "global_budget_exceeded": (android.SERVER_ERROR, 429),
}
assert set(SHOWN) == set(CASES)


async def run_case(service: Service, app: AndroidApp, session: aiohttp.ClientSession, case: str) -> AndroidAnswer:
    text = case_text(case)
    if case == "bad_credentials":
        return await app.summarize(session, text, token="not-a-grant-token")
    if case == "expired_credentials":
        expired = issue_access_token(TEST_SECRETS["MLPA_ACCESS_TOKEN_SECRET"], app.user_id, 60, time.time() - 3600)
        return await app.summarize(session, text, token=expired)
    if case == "blocked_user":
        assert (await app.summarize(session)).error is None
        await block_user(service, service.litellm.requests_to("/v1/chat/completions")[-1].json["user"])
    if case == "server_shutdown":
        return await during_shutdown(service, app.summarize(session, text))
    return await app.summarize(session, text)


@cell_params()
@pytest.mark.parametrize("case", CASES)
async def test_android_app(client_service: ClientServiceFactory, google, cell: Cell, case: str) -> None:
    service = await client_service(cell, case, android.SERVICE_TYPE)
    app = AndroidApp(base_url(service), google)
    async with aiohttp.ClientSession() as session:
        answer = await run_case(service, app, session, case)
    error, error_status = SHOWN[case]
    assert (answer.error, answer.error_status) == (error, error_status), answer
    if case == "success":
        assert answer.text == service.litellm.completion_text()
        # The keep-alive bytes came before the first event, and the reader dropped them.
        assert (answer.lines[0] == "") is cell.keepalive, answer.lines[:3]
    if case == "upstream_cut":
        assert answer.text, "the text before the cut was shown"
    sent = service.litellm.requests_to("/v1/chat/completions")
    if sent and case not in ("request_too_large", "bad_credentials", "expired_credentials", "signup_cap_reached"):
        assert sent[-1].json["user"] == f"{app.user_id}:{android.SERVICE_TYPE}"


@pytest.mark.parametrize("send_defaults", [True, False], ids=["defaults-sent", "defaults-omitted"])
@pytest.mark.parametrize("service_type", [android.SERVICE_TYPE, android.LEGACY_SERVICE_TYPE])
async def test_android_request_shapes_in_its_history(
    client_service: ClientServiceFactory, google, service_type: str, send_defaults: bool
) -> None:
    service = await client_service(Cell(fast_path=False, keepalive=True), "success", service_type)
    app = AndroidApp(base_url(service), google, service_type=service_type, send_defaults=send_defaults)
    async with aiohttp.ClientSession() as session:
        answer = await app.summarize(session)
        again = await app.summarize(session)  # the cached grant
    assert (answer.error, again.error) == (None, None)
    assert answer.text == again.text == service.litellm.completion_text()
    assert len(google.decode_requests) == 1
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].json
    assert sent["model"] == android.MODEL and sent["stream"] is True
