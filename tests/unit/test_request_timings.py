"""Opt-in timing spans (`debug-timing: true`, compatibility.md D48) over real HTTP: JSON 200
objects gain `spans`, streams ending in `data: [DONE]` one more event, every timed request one
INFO `Request timings` line; a request without the header is untouched, and its stream keeps
the relay fast path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.observability.timing import (
    RequestTimings,
    StreamTail,
    json_with_spans,
    requested,
)
from mlpa_aiohttp.testing.fake_privacy_filter import FakePrivacyFilter

from ..conftest import Service, ServiceFactory, chat_body, events, make_settings

TIMED = {"debug-timing": "true"}
SPAN_KEYS = {"name", "start_ms", "duration_ms"}


def names(spans: list[dict[str, Any]]) -> list[str]:
    return [span["name"] for span in spans]


def check_shape(spans: list[dict[str, Any]]) -> None:
    assert spans[0]["name"] == "total" and spans[0]["start_ms"] == 0.0
    assert all(set(span) == SPAN_KEYS for span in spans)
    starts = [span["start_ms"] for span in spans[1:]]
    assert starts == sorted(starts)
    total = spans[0]["duration_ms"]
    assert all(0 <= span["start_ms"] <= total and span["duration_ms"] >= 0 for span in spans)


def timing_lines(caplog) -> list[dict[str, Any]]:
    return events(caplog, "Request timings")


def sse_events(raw: bytes) -> list[bytes]:
    return [event for event in raw.replace(b"\r\n", b"\n").split(b"\n\n") if event]


# -- the header ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value, on", [("true", True), ("TRUE", True), (" true ", True), ("True", True),
                                       ("1", False), ("yes", False), ("false", False), ("invalid", False), ("", False)])  # fmt: skip
def test_only_true_turns_the_spans_on(value: str, on: bool) -> None:
    assert requested(value) is on
    assert requested(None) is False


@pytest.mark.parametrize("value", ["1", "yes", "false", ""])
async def test_without_true_nothing_changes(service: Service, caplog, value: str) -> None:
    response = await service.chat(headers=service.headers(**{"debug-timing": value}))
    assert response.status == 200
    assert "spans" not in await response.json()
    assert timing_lines(caplog) == []


# -- JSON ------------------------------------------------------------------------------------------


async def test_a_completion_gains_its_spans(service: Service, caplog) -> None:
    plain = await (await service.chat()).json()
    response = await service.chat(headers=service.headers(**TIMED))
    assert response.status == 200
    raw = await response.read()
    assert int(response.headers["Content-Length"]) == len(raw)
    body = json.loads(raw)
    spans = body.pop("spans")
    assert body.keys() == plain.keys()
    check_shape(spans)
    assert names(spans) == ["total", "auth", "traffic_contract", "db", "upstream"]
    [line] = timing_lines(caplog)
    assert line["level"] == "INFO"
    assert (line["method"], line["path"], line["status_code"], line["response_complete"]) == (
        "POST", "/v1/chat/completions", 200, True,
    )  # fmt: skip
    assert names(line["spans"]) == names(spans)
    # The logged total runs to the body's send: never shorter than the one in the body.
    assert line["spans"][0]["duration_ms"] >= spans[0]["duration_ms"]


async def test_search_spans(service: Service) -> None:
    response = await service.client.post(
        "/v1/search", json={"query": "q", "max_results": 1}, headers=service.headers(service_type="search", **TIMED)
    )
    assert response.status == 200
    assert names((await response.json())["spans"]) == ["total", "auth", "traffic_contract", "db", "upstream"]


async def test_a_search_refused_at_its_service_type_has_no_contract_span(service: Service, caplog) -> None:
    response = await service.client.post(
        "/v1/search", json={"query": "q", "max_results": 1}, headers=service.headers(service_type="ai", **TIMED)
    )
    assert response.status == 400
    assert "spans" not in json.dumps(await response.json())
    [line] = timing_lines(caplog)
    assert line["status_code"] == 400
    assert names(line["spans"]) == ["total", "auth"]


async def test_errors_pass_untouched_but_are_logged(service: Service, caplog) -> None:
    response = await service.chat(headers=service.headers(authorization="Bearer nope", **TIMED))
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid FxA auth"}
    [line] = timing_lines(caplog)
    assert (line["status_code"], line["response_complete"]) == (401, True)
    assert names(line["spans"]) == ["total", "auth"]


async def test_a_413_is_logged_too(make_service: ServiceFactory, caplog) -> None:
    service = await make_service(MAX_REQUEST_SIZE_BYTES="100")
    response = await service.chat(chat_body(messages=[{"role": "user", "content": "x" * 500}]), headers=service.headers(**TIMED))
    assert response.status == 413
    [line] = timing_lines(caplog)
    assert line["status_code"] == 413 and names(line["spans"]) == ["total"]


async def test_any_json_200_object_gains_spans(service: Service) -> None:
    response = await service.client.get("/health/liveness", headers=TIMED)
    body = await response.json()
    assert body["status"] == "alive" and names(body["spans"]) == ["total"]


def test_only_a_json_object_is_rewritten() -> None:
    timings = RequestTimings()
    assert json_with_spans(b"[1, 2]", timings) is None
    assert json_with_spans(b"not json", timings) is None
    assert json_with_spans(b'"text"', timings) is None
    assert json.loads(json_with_spans(b'{"a": "\\u00e9"}', timings))["a"] == "é"
    # A lone surrogate escape survives as an escape.
    assert json.loads(json_with_spans(b'{"a": "\\ud800"}', timings))["a"] == "\ud800"


async def test_privacy_filter_spans(make_service: ServiceFactory, aiohttp_server, caplog) -> None:
    fake = FakePrivacyFilter(api_key="k")
    server: TestServer = await aiohttp_server(fake.make_app())
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true", PRIVACY_FILTER_MASTER_KEY="k", PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/")
    )
    response = await service.client.post("/privacy-filter", json={"items": ["a"]}, headers={"authorization": f"Bearer {service.token}", **TIMED})
    assert names((await response.json())["spans"]) == ["total", "auth", "upstream"]


async def test_the_disabled_filters_503_is_inside_the_auth_span(service: Service, caplog) -> None:
    response = await service.client.post("/privacy-filter", json={"items": ["a"]}, headers={"authorization": "Bearer x", **TIMED})
    assert response.status == 503
    [line] = timing_lines(caplog)
    assert names(line["spans"]) == ["total", "auth"]


# -- streams ---------------------------------------------------------------------------------------


async def test_a_stream_ends_with_one_spans_event_after_done(service: Service, caplog) -> None:
    response = await service.chat(chat_body(stream=True), headers=service.headers(**TIMED))
    assert response.status == 200
    assert "Content-Length" not in response.headers
    events_seen = sse_events(await response.read())
    assert events_seen[-2] == b"data: [DONE]"
    assert events_seen[-1].startswith(b"data: ")
    spans = json.loads(events_seen[-1][len(b"data: "):])["spans"]
    check_shape(spans)
    assert names(spans) == ["total", "auth", "traffic_contract", "db", "upstream"]
    [line] = timing_lines(caplog)
    assert line["status_code"] == 200 and line["response_complete"] is True


async def test_a_stream_without_the_header_is_byte_identical_and_ends_at_done(service: Service) -> None:
    response = await service.chat(chat_body(stream=True))
    events_seen = sse_events(await response.read())
    assert events_seen[-1] == b"data: [DONE]"


async def test_a_stream_ending_in_an_error_gets_no_spans_event(service: Service) -> None:
    response = await service.chat(chat_body(stream=True, scenario="mid_stream_error_event"), headers=service.headers(**TIMED))
    raw = await response.read()
    assert b"[DONE]" not in raw and b'"spans"' not in raw


async def test_the_mock_stream_gets_its_spans(make_service: ServiceFactory) -> None:
    service = await make_service(MLPA_MOCK_ROUTES="true", MOCK_TTFT_MS="0", MOCK_STREAMING_CHUNK_LATENCY_MS="0")
    response = await service.client.post(
        "/mock/chat/completions", data=json.dumps(chat_body(stream=True)), headers=service.headers(**TIMED)
    )
    events_seen = sse_events(await response.read())
    assert events_seen[-2] == b"data: [DONE]"
    assert names(json.loads(events_seen[-1][len(b"data: "):])["spans"]) == ["total", "auth"]


async def test_the_fast_path_serves_untimed_streams_and_not_timed_ones(aiohttp_client, fake_litellm_server, fake_fxa_server) -> None:
    litellm, litellm_server = fake_litellm_server
    fxa, fxa_server = fake_fxa_server
    litellm.interval = 0.01  # the body still arriving when the headers are in: the fast path takes it
    settings = make_settings(str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), RELAY_FAST_PATH="true")
    app = create_app(settings)
    take_over = app[keys.RELAY_FAST_PATH]
    assert take_over is not None
    taken: list[bool] = []

    def counting_take_over(*args: Any) -> Any:
        relay = take_over(*args)
        taken.append(relay is not None)
        return relay

    app[keys.RELAY_FAST_PATH] = counting_take_over
    client = await aiohttp_client(app)
    service = Service(client=client, litellm=litellm, fxa=fxa, app=app, token=fxa.issue_jwt("uid"))
    untimed = await service.chat(chat_body(stream=True))
    assert sse_events(await untimed.read())[-1] == b"data: [DONE]"
    assert taken == [True]
    timed = await service.chat(chat_body(stream=True), headers=service.headers(**TIMED))
    assert b'"spans"' in await timed.read()
    assert taken == [True], "a timed stream takes the regular relay"


# -- the stream's tail ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chunks, separator",
    [
        ([b'data: {"a": 1}\n\n', b"data: [DONE]\n\n"], b""),
        ([b'data: {"a": 1}\r\n\r\n', b"data: [DONE]\r\n\r\n"], b""),
        ([b"data: [DO", b"NE]\n"], b"\n"),
        ([b"data:[DONE]"], b"\n\n"),
        ([b"x" * 500 + b"\n\n", b"data: [DONE]\n\n"], b""),
        ([b"data: [DONE]\n\n", b'data: {"error": 1}\n\n'], None),
        ([b"data: x" + b"y" * 200 + b"data: [DONE]\n\n"], None),
        ([b": comment\ndata: [DONE]\n\n"], None),
        ([b""], None),
    ],
)
def test_the_tail_tells_a_done_ending(chunks: list[bytes], separator: bytes | None) -> None:
    tail = StreamTail()
    for chunk in chunks:
        tail.add(chunk)
    assert tail.spans_event_separator() == separator


# -- the middleware on any route ----------------------------------------------------------------


async def test_validators_are_dropped_and_only_json_objects_change(aiohttp_client, fake_litellm_server, fake_fxa_server) -> None:
    """Routes of the test's own, mounted beside the service's: the middleware is generic."""
    from aiohttp import web

    _, litellm_server = fake_litellm_server
    _, fxa_server = fake_fxa_server
    app = create_app(make_settings(str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1"))))
    validators = {"ETag": '"abc"', "Content-MD5": "x", "Digest": "sha-256=x", "Content-Digest": "sha-256=:x:"}

    async def with_validators(request: web.Request) -> web.Response:
        return web.Response(body=b'{"a": 1}', content_type="application/problem+json", headers=validators)

    async def array(request: web.Request) -> web.Response:
        return web.Response(body=b"[1, 2]", content_type="application/json", headers=validators)

    async def created(request: web.Request) -> web.Response:
        return web.json_response({"a": 1}, status=201)

    app.router.add_get("/test-validators", with_validators)
    app.router.add_get("/test-array", array)
    app.router.add_get("/test-created", created)
    client = await aiohttp_client(app)

    response = await client.get("/test-validators", headers=TIMED)
    raw = await response.read()
    assert json.loads(raw)["a"] == 1 and names(json.loads(raw)["spans"]) == ["total"]
    assert int(response.headers["Content-Length"]) == len(raw)
    assert not set(validators) & set(response.headers)

    response = await client.get("/test-array", headers=TIMED)
    assert await response.read() == b"[1, 2]"
    assert response.headers["ETag"] == '"abc"'

    response = await client.get("/test-created", headers=TIMED)
    assert await response.json() == {"a": 1}

    response = await client.head("/test-validators", headers=TIMED)
    assert response.status == 200 and response.headers["ETag"] == '"abc"'
