"""Sentry reporting: the real SDK sends real envelopes to a loopback fake (compatibility.md D17)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from typing import Any, Iterator

import aiohttp
import pytest
import sentry_sdk
from aiohttp import web

from mlpa_aiohttp import __version__
from mlpa_aiohttp.errors import ApiError
from mlpa_aiohttp.observability.sentry import (
    FILTERED,
    PrivacyFilter,
    init_sentry,
    is_reportable,
    secret_values,
    withheld_event,
)
from mlpa_aiohttp.settings import Settings
from tests.support.fake_sentry import EnvelopeError, FakeSentry, parse_envelope

MASTER_KEY = "sk-master-7f3a9c1e5b"
UI_ACCESS_KEY = "sk-ui-2b8d4f6a0c"
BEARER_TOKEN = "fxa-token-9e8d7c6b5a"
DEV_TOKEN = "dev-token-1a2b3c4d5e"
# A client's own LiteLLM key (`litellm-virtual-key`): no setting knows it, so only the header's
# name can hide it (MLPA 1.0.39 §A.10).
CUSTOM_VIRTUAL_KEY = "sk-custom-4c5d6e7f8a"
USER_CONTENT = "my private medical question"
SECRETS = (MASTER_KEY, UI_ACCESS_KEY, DEV_TOKEN)


@pytest.fixture
def sentry_isolation() -> Iterator[None]:
    """sentry_sdk.init is process-wide: leave the SDK disabled after each test."""
    yield
    sentry_sdk.flush(timeout=2)
    sentry_sdk.init(dsn=None)


@pytest.fixture
async def fake_sentry(aiohttp_server: Any, sentry_isolation: None) -> FakeSentry:
    fake = FakeSentry()
    server = await aiohttp_server(fake.make_app())
    assert init_sentry(fake.dsn(server.port), release=__version__, environment="test", secrets=SECRETS)
    return fake


async def flush() -> None:
    # The SDK sends from its own thread; keep the loop free to serve the fake meanwhile.
    await asyncio.to_thread(sentry_sdk.flush, 5)


def assert_private(event: dict[str, Any]) -> None:
    text = json.dumps(event)
    for secret in (*SECRETS, BEARER_TOKEN, CUSTOM_VIRTUAL_KEY, USER_CONTENT):
        assert secret not in text


# --- the SDK end to end -------------------------------------------------------------------

async def unhandled_error(request: web.Request) -> web.Response:
    body = await request.json()
    local_master_key = MASTER_KEY  # noqa: F841 - a secret in a frame's locals
    raise RuntimeError(f"upstream refused key {MASTER_KEY} for model {body['model']}")


async def client_error(request: web.Request) -> web.Response:
    await request.read()
    raise ApiError({"error": 4}, status=403)


async def http_bad_request(request: web.Request) -> web.Response:
    raise web.HTTPBadRequest(text="bad")


def reporting_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", unhandled_error)
    app.router.add_post("/client-error", client_error)
    app.router.add_get("/bad-request", http_bad_request)
    return app


CHAT_BODY = {
    "model": "mistral-small",
    "messages": [{"role": "user", "content": USER_CONTENT}],
    "tools": [{"type": "function", "function": {"name": USER_CONTENT}}],
    "stream": True,
}
CREDENTIALS = {
    "Authorization": f"Bearer {BEARER_TOKEN}",
    "x-dev-authorization": DEV_TOKEN,
    "master_key": MASTER_KEY,
    "mlpa-ui-access-key": UI_ACCESS_KEY,
    # In any letter case.
    "Litellm-Virtual-Key": CUSTOM_VIRTUAL_KEY,
}


async def test_unhandled_error_reaches_sentry_without_content_or_secrets(
    fake_sentry: FakeSentry, aiohttp_client: Any
) -> None:
    client = await aiohttp_client(reporting_app())
    response = await client.post("/v1/chat/completions", json=CHAT_BODY, headers=CREDENTIALS)
    assert response.status == 500
    await flush()

    [event] = fake_sentry.events
    assert_private(event)
    assert event["release"] == __version__
    assert event["environment"] == "test"
    [exception] = event["exception"]["values"]
    assert exception["type"] == "RuntimeError"
    assert exception["value"] == f"upstream refused key {FILTERED} for model mistral-small"
    request = event["request"]
    assert request["data"]["messages"] == FILTERED
    assert request["data"]["tools"] == FILTERED
    assert request["data"]["model"] == "mistral-small"
    headers = {k.lower(): v for k, v in request["headers"].items()}
    for name in ("authorization", "x-dev-authorization", "master_key", "mlpa-ui-access-key", "litellm-virtual-key"):
        assert headers[name] == FILTERED, name
    assert "env" not in request  # no client address
    frame_vars = [f.get("vars", {}) for f in exception["stacktrace"]["frames"]]
    assert any("local_master_key" in v for v in frame_vars)


async def test_client_errors_are_not_reported(fake_sentry: FakeSentry, aiohttp_client: Any) -> None:
    client = await aiohttp_client(reporting_app())
    assert (await client.post("/client-error", json=CHAT_BODY)).status == 500  # no error middleware here
    assert (await client.get("/bad-request")).status == 400
    await flush()
    assert fake_sentry.events == []


async def test_client_disconnect_is_not_reported(fake_sentry: FakeSentry, aiohttp_server: Any) -> None:
    started = asyncio.Event()
    outcome: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def slow_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        started.set()
        try:
            while True:
                await response.write(b"data: {}\n\n")
                await asyncio.sleep(0.01)
        except BaseException as exc:
            outcome.set_result(exc)
            # What a careless handler might do: log the abort at error level with a traceback.
            logging.getLogger("mlpa_aiohttp.test").exception("stream aborted")
            raise

    app = web.Application()
    app.router.add_get("/stream", slow_stream)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        response = await session.get(server.make_url("/stream"))
        await started.wait()
        response.close()  # the client goes away mid-stream
    exc = await asyncio.wait_for(outcome, 5)
    assert isinstance(exc, (asyncio.CancelledError, ConnectionResetError))
    await flush()
    assert fake_sentry.events == []


async def test_logged_error_event_is_scrubbed(fake_sentry: FakeSentry) -> None:
    logging.getLogger("mlpa_aiohttp.test").error(
        "admin call failed with %s", MASTER_KEY, extra={"messages": [USER_CONTENT]}
    )
    await flush()
    [event] = fake_sentry.events
    assert_private(event)


def test_empty_dsn_leaves_sentry_off(sentry_isolation: None) -> None:
    assert init_sentry("", release=__version__) is False
    assert init_sentry("  ", release=__version__) is False
    assert sentry_sdk.get_client().dsn is None


# --- the hooks on their own ---------------------------------------------------------------

def hint_for(exc: BaseException) -> dict[str, Any]:
    return {"exc_info": (type(exc), exc, None)}


@pytest.mark.parametrize(
    "exc",
    [
        asyncio.CancelledError(),
        ConnectionResetError(),
        aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
        web.HTTPNotFound(),
        web.HTTPTooManyRequests(),
        ApiError("nope", status=401),
    ],
)
def test_not_reportable(exc: BaseException) -> None:
    assert not is_reportable(hint_for(exc))
    assert PrivacyFilter().before_send({"exception": {}}, hint_for(exc)) is None


@pytest.mark.parametrize(
    "exc", [RuntimeError("boom"), web.HTTPInternalServerError(), ApiError("db down", status=503)]
)
def test_reportable(exc: BaseException) -> None:
    assert is_reportable(hint_for(exc))
    assert is_reportable({})  # a message without an exception


def test_body_as_json_string_is_scrubbed_field_by_field() -> None:
    body = json.dumps({"query": USER_CONTENT, "input": USER_CONTENT, "prompt": USER_CONTENT, "n": 1})
    event = PrivacyFilter().before_send({"request": {"data": body}}, {})
    assert event is not None
    assert event["request"]["data"] == {"query": FILTERED, "input": FILTERED, "prompt": FILTERED, "n": 1}


def test_body_that_is_not_json_is_withheld_whole() -> None:
    event = PrivacyFilter().before_send({"request": {"data": f"messages={USER_CONTENT}"}}, {})
    assert event is not None
    assert event["request"]["data"] == FILTERED


def test_secrets_hidden_everywhere() -> None:
    privacy = PrivacyFilter.from_secrets([MASTER_KEY, "", "ab", f"{MASTER_KEY}-longer"])
    event = {
        "exception": {"values": [{"value": f"key {MASTER_KEY}-longer bad", "stacktrace": {"frames": [
            {"vars": {"key": repr(MASTER_KEY), "cookie": "session=1"}}]}}]},
        "breadcrumbs": {"values": [{"message": f"called with {MASTER_KEY}"}]},
        "extra": {"nested": [{"deep": MASTER_KEY}]},
        "tags": {"ab": "ab"},
    }
    scrubbed = privacy.before_send(event, {})
    assert scrubbed is not None
    assert MASTER_KEY not in json.dumps(scrubbed)
    assert scrubbed["exception"]["values"][0]["value"] == f"key {FILTERED} bad"
    assert scrubbed["exception"]["values"][0]["stacktrace"]["frames"][0]["vars"]["cookie"] == FILTERED
    assert scrubbed["tags"] == {"ab": "ab"}  # too-short secrets are ignored


def test_secret_values_come_from_settings() -> None:
    settings = Settings.from_environ(
        {"MASTER_KEY": "m" * 8, "MLPA_VIRTUAL_KEY": "v" * 8, "MLPA_UI_ACCESS_KEY": "u" * 8,
         "MLPA_ACCESS_TOKEN_SECRET": "t" * 32, "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": "",
         "DB_PASSWORD": "p" * 8, "SENTRY_DSN": "https://k@sentry.test/1", "PRIVACY_FILTER_MASTER_KEY": "f" * 8,
         "APP_ATTEST_ENABLED": "false", "PLAY_INTEGRITY_ENABLED": "false"}
    )
    assert set(secret_values(settings)) == {
        "m" * 8, "v" * 8, "u" * 8, "t" * 32, "", "p" * 8, "https://k@sentry.test/1", "f" * 8
    }


def test_breadcrumb_bodies_and_secrets_are_filtered() -> None:
    privacy = PrivacyFilter.from_secrets([MASTER_KEY])
    crumb = {
        "category": "httplib",
        "message": f"POST with {MASTER_KEY}",
        "data": {"url": "http://litellm/v1/chat/completions", "body": USER_CONTENT, "messages": [USER_CONTENT]},
    }
    filtered = privacy.before_breadcrumb(crumb, {})
    assert filtered is not None
    assert filtered["data"] == {"url": "http://litellm/v1/chat/completions", "body": FILTERED, "messages": FILTERED}
    assert filtered["message"] == f"POST with {FILTERED}"


def test_scrubbing_failure_sends_a_logged_stub(caplog: pytest.LogCaptureFixture) -> None:
    class Unscrubbable(PrivacyFilter):
        def scrub_event(self, event: dict[str, Any]) -> dict[str, Any]:
            raise TypeError("cannot scrub")

    event = {
        "event_id": "abc",
        "level": "error",
        "exception": {"values": [{"type": "RuntimeError", "value": MASTER_KEY}]},
        "request": {"data": {"messages": USER_CONTENT}},
    }
    with caplog.at_level(logging.ERROR):
        stub = Unscrubbable().before_send(event, {})
    assert stub is not None
    assert stub["event_id"] == "abc"
    assert stub["exception"]["values"] == [{"type": "RuntimeError", "value": FILTERED}]
    assert "request" not in stub
    assert "scrubbing failed" in caplog.text
    assert withheld_event(event) == stub


# --- the fake's envelope parser -----------------------------------------------------------

def test_envelope_parser_handles_lengths_and_lines() -> None:
    event = json.dumps({"event_id": "e1"}).encode()
    body = b'{"event_id":"e1"}\n' + b'{"type":"event","length":%d}\n' % len(event) + event + b"\n"
    body += b'{"type":"attachment"}\n' + b"line payload\n"
    envelope = parse_envelope(body, project="1")
    assert [i.type for i in envelope.items] == ["event", "attachment"]
    assert envelope.items[0].json() == {"event_id": "e1"}
    assert envelope.items[1].payload == b"line payload"
    with pytest.raises(EnvelopeError):
        parse_envelope(b'{"event_id":"e1"}\n{"type":"event","length":99}\n{}')


async def test_fake_accepts_gzip_and_rejects_garbage(aiohttp_client: Any) -> None:
    fake = FakeSentry()
    client = await aiohttp_client(fake.make_app())
    body = b'{}\n{"type":"event"}\n{"event_id":"e2"}\n'
    ok = await client.post("/api/1/envelope/", data=gzip.compress(body), headers={"Content-Encoding": "gzip"})
    assert ok.status == 200
    assert fake.events == [{"event_id": "e2"}]
    bad = await client.post("/api/1/envelope/", data=b"not json\n")
    assert bad.status == 400
    assert fake.rejected
