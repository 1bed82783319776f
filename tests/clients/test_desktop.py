"""Firefox desktop (Smart Window) against the service: the real OpenAI JS SDK under node,
called with the desktop's defaultHeaders and body (tests/clients/desktop.py), in every matrix
cell and every case. One node process serves the whole module."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import Service

from . import desktop
from .conftest import CASES, Cell, ClientServiceFactory, base_url, block_user, case_text, cell_params, during_shutdown
from .desktop import SdkWorker

if (_missing := desktop.missing_reason()) is not None:
    pytest.skip(_missing, allow_module_level=True)

UID = "desktop-uid"
GENERIC = "Upstream service returned an error"

# case -> (the SDK error class, its status, its `error`) of the last call; None: the chat shows
# the answer. In-band error events reach the SDK as `data.error`: an APIError without a status.
RAISED: dict[str, tuple[str, int | None, Any] | None] = {
    "success": None,
    "budget_exceeded": ("APIError", None, 1),
    "rate_limited": ("APIError", None, 2),
    "provider_throttling": ("APIError", None, 2),
    "context_too_large": ("APIError", None, 3),
    "request_too_large": ("APIError", 413, 3),
    "blocked_user": ("PermissionDeniedError", 403, None),
    "signup_cap_reached": ("PermissionDeniedError", 403, None),
    "bad_model": ("APIError", None, 8),
    # A 401 makes the engine fetch a fresh FxA token and retry once: the retry succeeds.
    "bad_credentials": None,
    "expired_credentials": None,
    "server_shutdown": ("APIError", None, "Server shutting down"),
    "upstream_cut": ("APIError", None, GENERIC),
    "upstream_error_event": ("APIError", None, "error-object"),
    "global_budget_exceeded": ("APIError", None, 10),
}
assert set(RAISED) == set(CASES)


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SdkWorker]:
    worker = SdkWorker(Path(tmp_path_factory.mktemp("sdk")) / "node-stderr.log")
    yield worker
    worker.close()


async def run_engine(sdk: SdkWorker, service: Service, token: str, text: str, **kw: Any) -> list[dict[str, Any]]:
    """openAIEngine._runWithGeneratorAuth: on a 401, a fresh FxA token and one retry."""
    results = [await sdk.call(desktop.chat_request(base_url(service), token, text, **kw))]
    if desktop.is_401(results[0]):
        fresh = service.fxa.issue_jwt(UID)
        results.append(await sdk.call(desktop.chat_request(base_url(service), fresh, text, **kw)))
    return results


async def run_case(sdk: SdkWorker, service: Service, case: str) -> list[dict[str, Any]]:
    text = case_text(case)
    token = service.fxa.issue_jwt(UID)
    if case == "bad_credentials":
        token = "not-an-fxa-token"
    if case == "expired_credentials":
        token = service.fxa.issue_jwt(UID, expires_in=-60)
    if case == "blocked_user":
        assert "error" not in (await run_engine(sdk, service, token, "hello"))[-1]
        await block_user(service, f"{UID}:{desktop.SERVICE_TYPE}")
    if case == "server_shutdown":
        return await during_shutdown(service, run_engine(sdk, service, token, text))
    return await run_engine(sdk, service, token, text)


@cell_params()
@pytest.mark.parametrize("case", CASES)
async def test_desktop_smart_window(client_service: ClientServiceFactory, sdk: SdkWorker, cell: Cell, case: str) -> None:
    service = await client_service(cell, case, desktop.SERVICE_TYPE)
    results = await run_case(sdk, service, case)
    last = results[-1]
    expected = RAISED[case]
    if expected is None:
        assert "error" not in last, last.get("error")
        assert desktop.streamed_text(last) == service.litellm.completion_text()
        assert last["chunks"][-1]["usage"]["completion_tokens"] > 0  # stream_options.include_usage
    else:
        error = last.get("error")
        assert error is not None, last
        class_, status, code = expected
        assert (error["class"], error["status"]) == (class_, status), error
        if code == "error-object":  # LiteLLM's in-band event, forwarded as it came
            assert isinstance(error["error"], dict) and error["error"]["code"] == "500"
        elif code is not None:
            assert error["error"] == code, error
    if case in ("bad_credentials", "expired_credentials"):
        assert len(results) == 2 and results[0]["error"]["class"] == "AuthenticationError"
    if case == "upstream_cut":
        assert desktop.streamed_text(last), "the text before the cut was shown"
    if case not in ("bad_credentials", "expired_credentials", "request_too_large", "signup_cap_reached"):
        sent = service.litellm.requests_to("/v1/chat/completions")[-1]
        assert sent.json["user"] == f"{UID}:{desktop.SERVICE_TYPE}"


@pytest.mark.parametrize("tools_always", [True, False], ids=["tools-always", "tools-when-set"])
async def test_desktop_body_shapes_in_its_history(client_service: ClientServiceFactory, sdk: SdkWorker, tools_always: bool) -> None:
    service = await client_service(Cell(fast_path=True, keepalive=True), "success", desktop.SERVICE_TYPE)
    [result] = await run_engine(sdk, service, service.fxa.issue_jwt(UID), "hello", tools_always=tools_always)
    assert "error" not in result, result.get("error")
    assert desktop.streamed_text(result) == service.litellm.completion_text()
    sent = service.litellm.requests_to("/v1/chat/completions")[-1]
    assert sent.json["stream"] is True and sent.json["stream_options"] == {"include_usage": True}
