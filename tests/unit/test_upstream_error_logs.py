"""Upstream (LiteLLM) error text in logs: truncated and without request content
(compatibility.md D17), while MLPA_DEBUG clients still get the text as the reference gives it."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from mlpa_aiohttp import keys
from mlpa_aiohttp.observability.upstream_text import MAX_LOGGED_CHARS, upstream_text_for_log

from tests.support.store_seeding import add_memory_row, seed_user

from ..conftest import chat_body, events

SECRET = "my private diary entry about the neighbours"


@pytest.mark.parametrize(
    "text",
    [
        # A pydantic-style echo of the offending input (Python literal, as LiteLLM relays it).
        f"litellm.BadRequestError: {{'type': 'string_type', 'loc': ('body', 'messages', 0), 'input': {{'role': 'user', 'content': '{SECRET}'}}}}",
        f'{{"error": {{"content": "{SECRET}", "code": 400}}}}',
        f'Invalid request: content="{SECRET}"',
        f"Your prompt was flagged by the provider's filter: '{SECRET} and more words'",
        f"query='{SECRET}' returned no results",
    ],
)
def test_request_content_is_scrubbed(text: str) -> None:
    logged = upstream_text_for_log(text)
    assert SECRET not in logged
    assert "[redacted]" in logged


def test_the_error_wording_stays() -> None:
    for text in (
        "litellm.BadRequestError: Invalid 'messages[0].content': string too long.",
        "Budget has been exceeded! Current cost: 0.21, Max budget: 0.2",
        "This model's maximum context length is 8192 tokens.",
    ):
        assert upstream_text_for_log(text) == text


def test_long_text_is_truncated_with_its_length() -> None:
    logged = upstream_text_for_log("e" * 5000)
    assert logged == "e" * MAX_LOGGED_CHARS + "... (5000 chars)"


@pytest.mark.parametrize("stream", [True, False])
async def test_an_upstream_error_echoing_the_prompt_is_logged_scrubbed(make_service, aiohttp_server, caplog, stream) -> None:
    """A LiteLLM stand-in whose 400 quotes the request's content back."""

    async def echoing_error(request: web.Request) -> web.Response:
        body = await request.json()
        echoed = json.dumps(body["messages"])
        message = f"litellm.BadRequestError: provider rejected input: {{'input': {echoed}}}" + " x" * 400
        return web.json_response({"error": {"message": message, "code": "400"}}, status=400)

    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", echoing_error)
    server = await aiohttp_server(upstream)
    service = await make_service(LITELLM_API_BASE=str(server.make_url("")).rstrip("/"), MLPA_DEBUG="true")
    await seed_user(service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai")

    response = await service.chat(chat_body(stream=stream, messages=[{"role": "user", "content": SECRET}]))
    text = await response.text()
    assert SECRET in text, "MLPA_DEBUG clients get the upstream text unchanged"
    [logged] = [e for e in events(caplog) if "upstream_status" in e]  # the completion's error line
    assert logged["level"] == "ERROR" and logged["upstream_status"] == 400
    assert SECRET not in caplog.text
    assert logged["upstream_detail"].startswith("litellm.BadRequestError: provider rejected input:")
    assert len(logged["upstream_detail"]) < MAX_LOGGED_CHARS + 40


@pytest.mark.parametrize(("stream", "event"), [(True, "upstream_stream_failed"), (False, "completion_proxy_failed")])
async def test_litellm_unreachable_is_one_line_with_its_cause_and_no_traceback(make_service, caplog, stream, event) -> None:
    """An operator's view (issue 25 item 6): a refused connection is not a code fault."""
    service = await make_service(LITELLM_API_BASE="http://127.0.0.1:9")
    add_memory_row(service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai")  # LiteLLM is unreachable
    response = await service.chat(chat_body(stream=stream))
    await response.read()
    [line] = events(caplog, event)
    assert (line["level"], line["error_type"]) == ("ERROR", "ClientConnectorError")
    assert line["cause"].startswith("ConnectionRefusedError: "), line["cause"]
    assert not [e for e in events(caplog) if e.get("exc_info")], "no traceback for an unreachable LiteLLM"


async def test_an_unexpected_upstream_failure_keeps_its_traceback(make_service, aiohttp_server, caplog) -> None:
    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="<html>not json</html>", content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", not_json)
    server = await aiohttp_server(app)
    service = await make_service(LITELLM_API_BASE=str(server.make_url("")).rstrip("/"))
    await seed_user(service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai")
    response = await service.chat(chat_body())
    assert response.status == 502
    [line] = events(caplog, "completion_proxy_failed")
    assert line["error_type"] == "JSONDecodeError" and "cause" not in line
    assert isinstance(line["exc_info"], ValueError)


def test_event_names_are_literal() -> None:
    """A grep for an event must find where it is logged: no f-string as a log call's event."""
    import pathlib
    import re

    package = pathlib.Path(keys.__file__).parent
    built = re.compile(r"\blog\.(?:debug|info|warning|error|exception|critical)\(\s*f[\"']")
    offenders = [str(path) for path in package.rglob("*.py") if built.search(path.read_text())]
    assert offenders == []
