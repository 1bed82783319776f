"""The fake LiteLLM, driven over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from mlpa_aiohttp.testing.fake_litellm import (
    ALL_SCENARIOS,
    ERROR_RESPONSES,
    ERROR_SCENARIOS,
    SCENARIO_HEADER,
    FakeLiteLLM,
    MemoryCustomerTable,
    Scenario,
    run_fake_upstream,
)

VIRTUAL = {"Authorization": "Bearer sk-test-virtual"}
MASTER = {"Authorization": "Bearer sk-test-master"}

ServerFactory = Callable[..., Awaitable[TestServer]]


def chat_body(
    content: str = "hi", *, stream: bool = True, include_usage: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "mozilla/test-model",
        "messages": [{"role": "user", "content": content}],
    }
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    return body


def sse_payloads(raw: bytes) -> list[str]:
    """The `data:` payloads of a complete SSE body; fails on anything that isn't a data frame."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-40:]
    frames = text[:-2].split("\n\n")
    assert all(frame.startswith("data: ") for frame in frames), frames
    return [frame[len("data: ") :] for frame in frames]


def sse_chunks(raw: bytes) -> list[dict[str, Any]]:
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


@pytest.fixture
def fake() -> FakeLiteLLM:
    return FakeLiteLLM()


@pytest.fixture
async def server(fake: FakeLiteLLM, aiohttp_server: ServerFactory) -> TestServer:
    return await aiohttp_server(fake.make_app())


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # One pooled connection, so the second request reuses the first one's connection.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as client_session:
        yield client_session


async def post_chat(
    session: aiohttp.ClientSession, server: TestServer, body: dict[str, Any], **headers: str
) -> tuple[int, CIMultiDictProxy[str], bytes]:
    async with session.post(
        server.make_url("/v1/chat/completions"), json=body, headers={**VIRTUAL, **headers}
    ) as response:
        return response.status, response.headers, await response.read()


# ---- happy paths --------------------------------------------------------------------------------


async def test_stream_ok_sends_role_content_finish_usage_and_done(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    status, headers, raw = await post_chat(session, server, chat_body())
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["x-litellm-model-api-base"] == "https://api.fake-provider.test/v1"
    assert headers["x-litellm-attempted-retries"] == "0"
    assert float(headers["x-litellm-response-cost"]) >= 0

    chunks = sse_chunks(raw)
    role, *contents, finish, usage = chunks
    assert role["object"] == "chat.completion.chunk"
    assert role["model"] == "mozilla/test-model"
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}}]
    assert len(contents) == 5
    assert "".join(c["choices"][0]["delta"]["content"] for c in contents) == fake.completion_text()
    assert finish["choices"] == [{"finish_reason": "stop", "index": 0, "delta": {}}]
    # LiteLLM's usage chunk keeps one empty choice (a provider's own has `choices: []`).
    assert usage["choices"] == [{"index": 0, "delta": {}}]
    assert usage["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
        "completion_tokens_details": {"reasoning_tokens": 0, "text_tokens": 5},
    }
    assert len({chunk["id"] for chunk in chunks}) == 1


async def test_stream_without_include_usage_has_no_usage_chunk(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    _, _, raw = await post_chat(session, server, chat_body(include_usage=False))
    chunks = sse_chunks(raw)
    assert all("usage" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_chunk_count_is_a_knob(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeLiteLLM(chunks=20, prompt_tokens=3)
    server = await aiohttp_server(fake.make_app())
    _, _, raw = await post_chat(session, server, chat_body())
    chunks = sse_chunks(raw)
    assert len(chunks) == 1 + 20 + 1 + 1
    assert chunks[-1]["usage"]["completion_tokens"] == 20
    assert chunks[-1]["usage"]["prompt_tokens"] == 3


async def test_non_stream_returns_chat_completion_json(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    status, headers, raw = await post_chat(session, server, chat_body(stream=False))
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert headers["x-litellm-attempted-fallbacks"] == "0"
    payload = json.loads(raw)
    assert payload["object"] == "chat.completion"
    assert payload["choices"][0]["message"] == {
        "provider_specific_fields": {"refusal": None},
        "role": "assistant",
        "content": fake.completion_text(),
    }
    assert payload["usage"]["total_tokens"] == payload["usage"]["prompt_tokens"] + 5


async def test_routing_headers_are_configurable(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.response_headers = {
        "x-litellm-attempted-fallbacks": "2",
        "x-litellm-model-api-base": " https://b ",
    }
    _, headers, _ = await post_chat(session, server, chat_body())
    assert headers["x-litellm-attempted-fallbacks"] == "2"
    assert headers["x-litellm-model-api-base"] == "https://b"  # HTTP strips outer whitespace
    assert "x-litellm-response-cost" not in headers


async def test_interval_paces_chunks(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeLiteLLM(chunks=4, interval=0.05, ttft=0.05)
    server = await aiohttp_server(fake.make_app())
    started = time.monotonic()
    async with session.post(
        server.make_url("/v1/chat/completions"), json=chat_body(), headers=VIRTUAL
    ) as resp:
        first_read = await resp.content.readany()
        first_at = time.monotonic()
        rest = await resp.read()
    done_at = time.monotonic()
    assert first_at - started >= 0.05
    assert done_at - first_at >= 0.15
    assert len(sse_chunks(first_read + rest)) == 1 + 4 + 2


# ---- auth and records ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer nope"}, MASTER, {"Authorization": "sk-test-virtual"}]
)
async def test_chat_requires_the_virtual_key(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    async with session.post(
        server.make_url("/v1/chat/completions"), json=chat_body(), headers=headers
    ) as resp:
        assert resp.status == 401
        payload = await resp.json()
    assert payload["error"]["type"] == "auth_error"
    assert payload["error"]["code"] == "401"
    assert len(fake.requests) == 1


async def test_other_virtual_keys_are_accepted_and_the_bearer_recorded(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    """A client's own key (`litellm-virtual-key` through the service) works once LiteLLM knows it."""
    own = {"Authorization": "Bearer sk-client-own"}
    for path, body in (("/v1/chat/completions", chat_body(stream=False)), ("/v1/search/exa-search", {"query": "q"})):
        async with session.post(server.make_url(path), json=body, headers=own) as resp:
            assert resp.status == 401
        fake.other_virtual_keys.add("sk-client-own")
        async with session.post(server.make_url(path), json=body, headers=own) as resp:
            assert resp.status == 200
        fake.other_virtual_keys.clear()
    assert [r.bearer for r in fake.requests] == ["sk-client-own"] * 4
    async with session.post(server.make_url("/v1/chat/completions"), json=chat_body(), headers=VIRTUAL) as resp:
        assert resp.status == 200
    assert fake.requests[-1].bearer == "sk-test-virtual"


async def test_requests_are_recorded(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    before = time.monotonic()
    await post_chat(session, server, chat_body("hello"), **{"X-Custom": "yes"})
    await post_chat(session, server, chat_body(stream=False))
    first, second = fake.requests_to("/v1/chat/completions")
    assert first.method == "POST"
    assert first.headers["authorization"] == "Bearer sk-test-virtual"
    assert first.headers["x-custom"] == "yes"
    assert first.json == chat_body("hello")
    assert json.loads(first.body) == first.json
    assert first.scenario is Scenario.OK
    assert first.started_at >= before
    assert first.connection_id == second.connection_id
    assert (first.nth_on_connection, second.nth_on_connection) == (1, 2)
    assert first.disconnected_at is None
    assert fake.requests_to("/customer/new") == []

    fake.next_scenarios.append(Scenario.SERVER_500)
    fake.reset()
    assert len(fake.requests) == 0
    assert fake.next_scenarios == []


# ---- scenario selection -------------------------------------------------------------------------


async def test_scenario_precedence_header_marker_fifo_default(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.scenario = Scenario.SERVER_500
    fake.next_scenarios.extend([Scenario.BUDGET_429, "unclassified_400"])

    status, _, _ = await post_chat(
        session, server, chat_body("[fake:bad_gateway_502]"), **{SCENARIO_HEADER: "throttling_429"}
    )
    assert status == 429  # header wins, FIFO untouched
    status, _, _ = await post_chat(session, server, chat_body("please [fake:bad_gateway_502] now"))
    assert status == 502  # marker next
    assert len(fake.next_scenarios) == 2
    status, _, raw = await post_chat(session, server, chat_body())
    assert (status, json.loads(raw)["error"]["type"]) == (429, "budget_exceeded")
    status, _, raw = await post_chat(session, server, chat_body())
    assert (status, json.loads(raw)["error"]["type"]) == (400, "invalid_request")
    status, _, _ = await post_chat(session, server, chat_body())
    assert status == 500  # default
    assert [r.scenario for r in fake.requests] == [
        Scenario.THROTTLING_429,
        Scenario.BAD_GATEWAY_502,
        Scenario.BUDGET_429,
        Scenario.UNCLASSIFIED_400,
        Scenario.SERVER_500,
    ]


async def test_default_scenario_may_be_a_plain_string(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.scenario = "tool_calls"
    _, _, raw = await post_chat(session, server, chat_body(stream=False))
    assert len(json.loads(raw)["choices"][0]["message"]["tool_calls"]) == 2
    assert fake.requests[0].scenario is Scenario.TOOL_CALLS


async def test_marker_in_content_parts_of_last_message(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    body = chat_body(stream=False)
    body["messages"] = [
        {"role": "user", "content": "[fake:server_500] only in an earlier message"},
        {"role": "user", "content": [{"type": "text", "text": "x [fake:budget_400]"}]},
    ]
    status, _, _ = await post_chat(session, server, body)
    assert status == 400


async def test_unknown_scenario_is_a_loud_400(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    status, _, raw = await post_chat(session, server, chat_body("[fake:nope]"))
    assert status == 400
    assert "unknown scenario" in json.loads(raw)["error"]["message"]


def test_scenario_names_are_exact() -> None:
    assert {s.value for s in ALL_SCENARIOS} == {
        "ok", "slow_first_byte", "hang_before_headers", "hang_after_headers", "endless", "mid_stream_error",
        "mid_stream_error_event", "empty_stream", "split_event", "usage_empty_choices", "delta_null", "tool_calls",
        "drop_on_reuse",
        "budget_400", "budget_429", "budget_422", "rate_limit_429", "provider_rate_limit_429", "throttling_429",
        "context_window_400", "bad_param_400", "timeout_408",
        "invalid_model_400", "invalid_argument_400", "unclassified_400", "unclassified_429",
        "generate_400", "server_500", "bad_gateway_502", "service_unavailable_503", "reset_before_response",
        "global_budget_400", "global_budget_422", "exa_overloaded_500", "exa_rate_limit_429", "internal_server_error_500",
    }  # fmt: skip
    assert set(ERROR_SCENARIOS) < set(ALL_SCENARIOS)


# ---- error scenarios ----------------------------------------------------------------------------

# scenario -> (status, substring the body must contain), independent of the fake's table
DOCUMENTED_ERRORS: dict[str, tuple[int, str]] = {
    "budget_400": (400, '"type":"budget_exceeded"'),
    "budget_429": (429, "Budget has been exceeded! Current cost: 0.11, Max budget: 0.1"),
    "budget_422": (422, '"message":"ExceededBudget: End User=uid123:ai over budget.'),
    "rate_limit_429": (429, "Rate limit exceeded. TPM: 1000/500"),
    "provider_rate_limit_429": (
        429,
        "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for gpt-4o",
    ),
    "throttling_429": (
        429,
        "litellm.RateLimitError: RateLimitError: OpenAIException - Resource exhausted.",
    ),
    "context_window_400": (400, "litellm.ContextWindowExceededError:"),
    "bad_param_400": (400, '"type":"invalid_request_error","param":"temperature","code":"400"'),
    "timeout_408": (408, "litellm.Timeout: APITimeoutError - Request timed out."),
    "invalid_model_400": (
        400,
        '"message":"/chat/completions: Invalid model name passed in model=mozilla/test-model.',
    ),
    "invalid_argument_400": (
        400,
        '"message":"Expected a valid JSON object","status":"INVALID_ARGUMENT"',
    ),
    "unclassified_400": (
        400,
        '{"error":{"type":"invalid_request","message":"Invalid request parameters"}}',
    ),
    "unclassified_429": (429, "Too Many Requests"),
    "generate_400": (400, "Could not generate a moderate response"),
    "server_500": (500, '"type":"internal_server_error"'),
    "bad_gateway_502": (502, "Bad Gateway"),
    "service_unavailable_503": (503, "Service Unavailable"),
    "global_budget_400": (400, '"message":"ExceededBudget: User=default_user_id over budget. Spend='),
    "global_budget_422": (422, '"message":"ExceededBudget: User=default_user_id over budget. Spend='),
    # Exa's object inside LiteLLM's message: its quotes JSON-escaped.
    "exa_overloaded_500": (500, 'litellm.APIConnectionError: Exa_aiException - {\\"requestId\\":'),
    "exa_rate_limit_429": (429, '\\"tag\\":\\"RATE_LIMIT_EXCEEDED\\"}'),
    "internal_server_error_500": (500, "Internal Server Error"),
}


def test_every_error_scenario_is_documented() -> None:
    assert {s.value for s in ERROR_SCENARIOS} == set(DOCUMENTED_ERRORS)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("scenario", sorted(DOCUMENTED_ERRORS))
async def test_error_scenarios_answer_like_litellm(
    server: TestServer, session: aiohttp.ClientSession, scenario: str, stream: bool
) -> None:
    status, headers, raw = await post_chat(
        session, server, chat_body(f"[fake:{scenario}]", stream=stream)
    )
    expected_status, expected_text = DOCUMENTED_ERRORS[scenario]
    assert status == expected_status
    assert expected_text in raw.decode()
    assert raw == ERROR_RESPONSES[Scenario(scenario)].body_for("mozilla/test-model", stream=stream)
    # A stream that fails before its first byte is a plain JSON (or text) error.
    assert not headers["Content-Type"].startswith("text/event-stream")


def test_error_bodies_only_trip_the_classifier_rules_they_are_meant_for() -> None:
    def type_and_message(scenario: Scenario) -> str:
        error = json.loads(ERROR_RESPONSES[scenario].body)["error"]
        return f"{error.get('type')} {error.get('message')}".lower()

    assert "maximum context length" in ERROR_RESPONSES[Scenario.CONTEXT_WINDOW_400].text
    for scenario in (
        Scenario.CONTEXT_WINDOW_400,
        Scenario.INVALID_ARGUMENT_400,
        Scenario.UNCLASSIFIED_400,
    ):
        assert "rate" not in type_and_message(scenario) and "budget" not in type_and_message(
            scenario
        )
    assert "budget" not in type_and_message(Scenario.RATE_LIMIT_429)
    assert "rate limit" not in type_and_message(Scenario.GENERATE_400)
    assert "rate" in type_and_message(Scenario.GENERATE_400)  # the trap: "generate", "moderate"
    # Every provider 429 comes wrapped by LiteLLM, named after the provider's exception.
    for scenario in (Scenario.THROTTLING_429, Scenario.PROVIDER_RATE_LIMIT_429):
        assert type_and_message(scenario).startswith("throttling_error litellm.ratelimiterror:")
        assert "openaiexception - " in type_and_message(scenario)
    assert "exception - " not in type_and_message(Scenario.RATE_LIMIT_429)
    with pytest.raises(ValueError):
        json.loads(ERROR_RESPONSES[Scenario.UNCLASSIFIED_429].body)


# ---- timing and connection scenarios ------------------------------------------------------------


async def test_slow_first_byte_delays_headers(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeLiteLLM(slow_delay=0.2)
    server = await aiohttp_server(fake.make_app())
    started = time.monotonic()
    async with session.post(
        server.make_url("/v1/chat/completions"),
        json=chat_body("[fake:slow_first_byte]"),
        headers=VIRTUAL,
    ) as resp:
        headers_at = time.monotonic()
        raw = await resp.read()
    assert headers_at - started >= 0.2
    assert len(sse_chunks(raw)) == 8


async def test_hang_before_headers_records_the_client_leaving(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    sent_at = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await session.post(
            server.make_url("/v1/chat/completions"),
            json=chat_body("[fake:hang_before_headers]"),
            headers=VIRTUAL,
            timeout=aiohttp.ClientTimeout(total=0.2),
        )
    (record,) = fake.requests
    await asyncio.wait_for(record.disconnected.wait(), 2)
    assert record.disconnected_at is not None
    # The client's 0.2 s run from before it connected, the fake's record from after.
    assert record.disconnected_at >= sent_at + 0.2
    assert record.disconnected_at > record.started_at


async def test_hang_after_headers_sends_headers_then_silence(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    resp = await session.post(
        server.make_url("/v1/chat/completions"),
        json=chat_body("[fake:hang_after_headers]"),
        headers=VIRTUAL,
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(resp.content.readany(), 0.2)
    assert fake.requests[0].disconnected_at is None
    resp.close()
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 2)
    assert fake.requests[0].disconnected_at is not None


async def test_endless_stream_runs_until_the_client_leaves(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.chunks, fake.interval = 2, 0.01
    resp = await session.post(
        server.make_url("/v1/chat/completions"), json=chat_body("[fake:endless]"), headers=VIRTUAL
    )
    assert resp.status == 200
    received = b""
    # Well past `chunks` content events, and still no finish chunk or [DONE].
    while received.count(b'"delta":{"content":') < 3 * len(fake.words):
        chunk = await asyncio.wait_for(resp.content.readany(), 2)
        assert chunk, f"the stream ended: {received[-120:]!r}"
        received += chunk
    assert b"finish_reason" not in received and b"[DONE]" not in received
    assert fake.requests[0].disconnected_at is None
    resp.close()
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 2)


async def test_mid_stream_error_cuts_the_connection_after_two_chunks(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    received = b""
    async with session.post(
        server.make_url("/v1/chat/completions"),
        json=chat_body("[fake:mid_stream_error]"),
        headers=VIRTUAL,
    ) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in resp.content.iter_any():
                received += data
    payloads = sse_payloads(received)
    assert len(payloads) == 3
    assert json.loads(payloads[0])["choices"][0]["delta"]["role"] == "assistant"
    assert [json.loads(p)["choices"][0]["delta"]["content"] for p in payloads[1:]] == [
        "Hello",
        " from",
    ]
    (record,) = fake.requests
    assert record.aborted_by_fake
    await asyncio.sleep(0.05)
    assert record.disconnected_at is None  # the fake left, not the client


async def test_mid_stream_error_without_streaming_truncates_the_json(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    async with session.post(
        server.make_url("/v1/chat/completions"),
        json=chat_body("[fake:mid_stream_error]", stream=False),
        headers=VIRTUAL,
    ) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_empty_stream_has_no_body(server: TestServer, session: aiohttp.ClientSession) -> None:
    status, headers, raw = await post_chat(session, server, chat_body("[fake:empty_stream]"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert raw == b""


async def test_split_event_arrives_in_pieces_cut_mid_json(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    reads: list[bytes] = []
    async with session.post(
        server.make_url("/v1/chat/completions"),
        json=chat_body("[fake:split_event]"),
        headers=VIRTUAL,
    ) as resp:
        async for data in resp.content.iter_any():
            reads.append(data)
    chunks = sse_chunks(b"".join(reads))
    events = len(chunks) + 1
    assert len(reads) >= 2 * events - 2  # allow for an occasional coalesced read
    cut_mid_event = [r for r in reads if not r.endswith(b"\n\n")]
    assert len(cut_mid_event) >= events - 1
    assert any(
        b'"usage"' in r and not r.startswith(b"data: ") for r in reads
    )  # usage chunk split too
    assert chunks[-1]["choices"] == [{"index": 0, "delta": {}}]
    assert chunks[-1]["usage"]["total_tokens"] > 0
    tool_deltas = [
        c for c in chunks if c["choices"] and "tool_calls" in (c["choices"][0]["delta"] or {})
    ]
    assert len(tool_deltas) == 1


async def test_usage_empty_choices(server: TestServer, session: aiohttp.ClientSession) -> None:
    _, _, raw = await post_chat(session, server, chat_body("[fake:usage_empty_choices]"))
    usage = sse_chunks(raw)[-1]
    assert usage["choices"] == []
    assert set(usage["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


async def test_delta_null(server: TestServer, session: aiohttp.ClientSession) -> None:
    _, _, raw = await post_chat(session, server, chat_body("[fake:delta_null]"))
    chunks = sse_chunks(raw)
    nulls = [c for c in chunks if c["choices"] and c["choices"][0]["delta"] is None]
    assert len(nulls) == 1
    assert '"delta":null' in raw.decode()


async def test_tool_calls_stream_builds_two_calls(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    _, _, raw = await post_chat(session, server, chat_body("[fake:tool_calls]"))
    chunks = sse_chunks(raw)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        if not chunk["choices"]:
            continue
        for delta_call in chunk["choices"][0]["delta"].get("tool_calls", []):
            call = calls.setdefault(delta_call["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] = call["id"] or delta_call.get("id", "")
            call["name"] = call["name"] or delta_call.get("function", {}).get("name", "")
            call["arguments"] += delta_call.get("function", {}).get("arguments", "")
    assert sorted(calls) == [0, 1]
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "web_search"]
    assert all(calls[i]["id"] for i in (0, 1))
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "c"}
    assert json.loads(calls[1]["arguments"]) == {"query": "aiohttp"}
    arguments_chunks = [
        c
        for c in chunks
        if c["choices"]
        and '"arguments":""' not in json.dumps(c, separators=(",", ":"))
        and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert len(arguments_chunks) >= 4  # arguments spread over several deltas
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if "finish_reason" in c["choices"][0]]
    assert finishes == ["tool_calls"]
    assert chunks[-1]["usage"]["completion_tokens"] > 0


async def test_tool_calls_json(server: TestServer, session: aiohttp.ClientSession) -> None:
    _, _, raw = await post_chat(session, server, chat_body("[fake:tool_calls]", stream=False))
    choice = json.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "web_search"]
    assert json.loads(calls[0]["function"]["arguments"])["city"] == "Paris"


# ---- stale keep-alive ---------------------------------------------------------------------------


async def test_drop_on_reuse_from_fifo_drops_once_then_fresh_connection_succeeds(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    assert (await post_chat(session, server, chat_body()))[0] == 200
    fake.next_scenarios.append(Scenario.DROP_ON_REUSE)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post_chat(session, server, chat_body())
    assert fake.dropped == 1
    status, _, raw = await post_chat(session, server, chat_body())
    assert status == 200 and sse_chunks(raw)
    first, dropped, retried = fake.requests
    assert dropped.connection_id == first.connection_id and dropped.nth_on_connection == 2
    assert dropped.dropped and dropped.scenario is Scenario.DROP_ON_REUSE
    assert retried.connection_id != first.connection_id and retried.nth_on_connection == 1
    assert not retried.dropped and retried.scenario is Scenario.OK
    assert dropped.disconnected_at is None


async def test_drop_on_reuse_on_a_fresh_connection_is_served_and_consumed(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.next_scenarios.append(Scenario.DROP_ON_REUSE)
    assert (await post_chat(session, server, chat_body()))[0] == 200
    assert (await post_chat(session, server, chat_body()))[
        0
    ] == 200  # reused, but the drop was spent
    assert fake.dropped == 0
    assert fake.requests[1].nth_on_connection == 2


async def test_drop_on_reuse_marker_lets_the_retry_through(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    body = chat_body("[fake:drop_on_reuse]")
    assert (await post_chat(session, server, body))[0] == 200  # fresh connection: served
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post_chat(session, server, body)  # reused: dropped
    assert (await post_chat(session, server, body))[0] == 200  # its retry, on a new connection
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post_chat(
            session, server, body
        )  # a new request on a reused connection: dropped again
    assert (await post_chat(session, server, body))[0] == 200
    assert [r.dropped for r in fake.requests] == [False, True, False, True, False]
    assert fake.dropped == 2


# ---- search -------------------------------------------------------------------------------------


async def test_search_honours_max_results(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    async with session.post(
        server.make_url("/v1/search/exa-search"),
        json={"query": "mozilla firefox", "max_results": 3, "user": "u:ai"},
        headers=VIRTUAL,
    ) as resp:
        assert resp.status == 200
        assert "x-litellm-model-api-base" in resp.headers
        payload = await resp.json()
    assert len(payload["results"]) == 3
    assert all(set(r) >= {"title", "url", "snippet"} for r in payload["results"])
    assert "mozilla firefox" in payload["results"][0]["title"]
    assert fake.requests_to("/v1/search/exa-search")[0].json["user"] == "u:ai"


async def test_search_scenarios_and_auth(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    url = server.make_url("/v1/search/exa-search")
    async with session.post(url, json={"query": "x [fake:budget_429]"}, headers=VIRTUAL) as resp:
        assert resp.status == 429
        assert (await resp.json())["error"]["type"] == "budget_exceeded"
    async with session.post(
        url, json={"query": "x"}, headers={**VIRTUAL, SCENARIO_HEADER: "bad_gateway_502"}
    ) as resp:
        assert resp.status == 502
    async with session.post(url, json={"query": "x"}, headers=MASTER) as resp:
        assert resp.status == 401
    async with session.post(
        url, json={"query": "x", "max_results": "many"}, headers=VIRTUAL
    ) as resp:
        assert resp.status == 400


# ---- admin endpoints ----------------------------------------------------------------------------


async def test_customer_new_and_info(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    new_url = server.make_url("/customer/new")
    info_url = server.make_url("/customer/info")
    async with session.post(
        new_url, json={"user_id": "u1:ai", "budget_id": "end-user-budget-ai"}, headers=MASTER
    ) as resp:
        assert resp.status == 200
        created = await resp.json()
    assert created["user_id"] == "u1:ai" and created["budget_id"] == "end-user-budget-ai"
    assert created["blocked"] is False

    async with session.post(
        new_url, json={"user_id": "u1:ai", "budget_id": "other"}, headers=MASTER
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert "already exists" in error["message"] and error["code"] == "400"

    async with session.get(info_url, params={"end_user_id": "u1:ai"}, headers=MASTER) as resp:
        assert resp.status == 200
        assert await resp.json() == created  # the first creation's budget: the duplicate changed nothing
    # LiteLLM 1.106.12 answers an unknown end user with a 404 ProxyException.
    async with session.get(info_url, params={"end_user_id": "nobody"}, headers=MASTER) as resp:
        assert resp.status == 404
        assert await resp.json() == {
            "error": {
                "message": "End User Id=nobody does not exist in db",
                "type": "not_found",
                "param": "end_user_id",
                "code": "404",
            }
        }

    async with session.post(new_url, json={"user_id": "u2:ai"}, headers=VIRTUAL) as resp:
        assert resp.status == 401
    async with session.get(info_url, params={"end_user_id": "u1:ai"}, headers=MASTER) as resp:
        assert resp.status == 200
    async with session.get(info_url, params={"end_user_id": "u2:ai"}, headers=MASTER) as resp:
        assert resp.status == 404  # the unauthorized creation created nothing
    async with session.get(info_url, params={"end_user_id": "u1:ai"}, headers=VIRTUAL) as resp:
        assert resp.status == 401


async def test_the_customer_table_decides_duplicates_and_refusals(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    class RefusingTable(MemoryCustomerTable):
        """Refuses one budget id as LiteLLM's database refuses a budget with no row."""

        async def insert(self, user_id: str, budget_id: str | None) -> None:
            if budget_id == "gone":
                raise RuntimeError("insert or update violates foreign key constraint")
            await super().insert(user_id, budget_id)

    fake = FakeLiteLLM(customer_table=RefusingTable())
    server = await aiohttp_server(fake.make_app())
    url = server.make_url("/customer/new")
    async with session.post(url, json={"user_id": "u:ai", "budget_id": "b"}, headers=MASTER) as resp:
        assert resp.status == 200
    async with session.post(url, json={"user_id": "u:ai", "budget_id": "b"}, headers=MASTER) as resp:
        assert resp.status == 400
    # Every other database error: LiteLLM's generic 500 with the error's text (not "already exists").
    async with session.post(url, json={"user_id": "v:ai", "budget_id": "gone"}, headers=MASTER) as resp:
        assert resp.status == 500
        assert (await resp.json())["error"] == {
            "message": "insert or update violates foreign key constraint",
            "type": "internal_server_error",
            "param": None,
            "code": "500",
        }


async def test_readiness(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    url = server.make_url("/health/readiness")
    async with session.get(url, headers=MASTER) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert (body["status"], body["db"], body["litellm_version"]) == (
        "healthy",
        "connected",
        "1.106.12",
    )

    fake.readiness_db = "Not connected"
    async with session.get(url, headers=MASTER) as resp:
        assert (await resp.json())["db"] == "Not connected"

    fake.readiness_body = {"status": "connected", "db": "connected", "litellm_version": "9.9.9"}
    async with session.get(url, headers=MASTER) as resp:
        assert await resp.json() == fake.readiness_body

    fake.readiness_down = True
    async with session.get(url, headers=MASTER) as resp:
        assert resp.status == 500

    async with session.get(url, headers=VIRTUAL) as resp:
        assert resp.status == 401


async def test_readiness_slow(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.readiness_delay = 0.5
    with pytest.raises(asyncio.TimeoutError):
        await session.get(
            server.make_url("/health/readiness"),
            headers=MASTER,
            timeout=aiohttp.ClientTimeout(total=0.1),
        )
    await asyncio.wait_for(fake.requests[0].disconnected.wait(), 2)


async def test_model_hub_info_needs_no_auth(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    server = await aiohttp_server(FakeLiteLLM(litellm_version="1.2.3").make_app())
    async with session.get(server.make_url("/public/model_hub/info")) as resp:
        assert resp.status == 200
        assert (await resp.json())["litellm_version"] == "1.2.3"


# ---- the CLI entry ------------------------------------------------------------------------------


async def test_run_fake_upstream_serves_until_cancelled(session: aiohttp.ClientSession) -> None:
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_fake_upstream(
            "127.0.0.1", 0, ttft=0.0, chunks=3, interval=0.0, on_started=started.set_result
        )
    )
    try:
        base_url = await asyncio.wait_for(started, 5)
        async with session.post(
            f"{base_url}/v1/chat/completions", json=chat_body(), headers=VIRTUAL
        ) as resp:
            chunks = sse_chunks(await resp.read())
        assert len(chunks) == 1 + 3 + 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh:
            await fresh.get(f"{base_url}/public/model_hub/info")


# ---- the fake against the real LiteLLM's captured wire ------------------------------------------

# capture (tests/data/litellm-1.106.12) -> the fake's scenario for the same request. Not
# compared: LiteLLM's own mock_response (not a provider path), answers that only exist
# without LiteLLM's database (customer_*, err_bad_key, err_no_key, readiness), a search tool
# LiteLLM does not know (search_unknown_tool), and requests LiteLLM passes on unchanged
# (err_bad_role, err_temperature_string, router RPM).
CAPTURED_CASES: dict[str, Scenario] = {
    "nonstream_ok": Scenario.OK,
    "stream_ok": Scenario.OK,
    "stream_ok_no_usage": Scenario.OK,
    "global_budget_1": Scenario.OK,  # a priced model: x-litellm-response-cost is sent
    "global_budget_stream": Scenario.OK,
    "err_midstream_stream": Scenario.MID_STREAM_ERROR_EVENT,
    "err_midstream_nonstream": Scenario.MID_STREAM_ERROR_EVENT,
    "err_ratelimit_nonstream": Scenario.PROVIDER_RATE_LIMIT_429,
    "err_ratelimit_stream": Scenario.PROVIDER_RATE_LIMIT_429,
    "err_throttle_nonstream": Scenario.THROTTLING_429,
    "err_throttle_stream": Scenario.THROTTLING_429,
    "err_ctx_nonstream": Scenario.CONTEXT_WINDOW_400,
    "err_ctx_stream": Scenario.CONTEXT_WINDOW_400,
    "err_badparam_nonstream": Scenario.BAD_PARAM_400,
    "err_badparam_stream": Scenario.BAD_PARAM_400,
    "err_e500_nonstream": Scenario.SERVER_500,
    "err_e500_stream": Scenario.SERVER_500,
    "err_slow_nonstream": Scenario.TIMEOUT_408,
    "err_slow_stream": Scenario.TIMEOUT_408,
    "err_unknown_model_nonstream": Scenario.INVALID_MODEL_400,
    "err_unknown_model_stream": Scenario.INVALID_MODEL_400,
}
# Transport-level headers, and values that differ per call or per deployment.
TRANSPORT_HEADERS = {"date", "server", "content-length", "transfer-encoding", "connection", "keep-alive"}
VARYING_HEADER_VALUES = {
    "x-litellm-call-id", "x-litellm-model-id", "x-litellm-model-api-base", "llm_provider-date",
    "llm_provider-content-length", "x-litellm-response-duration-ms", "x-litellm-overhead-duration-ms",
    "x-litellm-response-cost", "x-litellm-key-spend", "x-litellm-model-name",
}  # fmt: skip
VARYING_FIELDS = {"id", "created"}
# A timeout's message prints the time LiteLLM measured ("time taken=3.01 seconds").
MEASURED_TIME = re.compile(r"time taken=[\d.]+ seconds")


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<varies>" if k in VARYING_FIELDS else _normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    if isinstance(value, str):
        return MEASURED_TIME.sub("time taken=<measured> seconds", value)
    return value


def _json_style(text: str) -> str:
    parsed = json.loads(text)
    if text == json.dumps(parsed, separators=(",", ":")):
        return "compact"
    return "spaced" if text == json.dumps(parsed) else "other"


def _body_shape(content_type: str, body: bytes) -> list[tuple[str, Any]]:
    """Each JSON document of a body (one, or one per SSE event) normalized, with its
    serialization style; `[DONE]` as itself."""
    if content_type.startswith("text/event-stream"):
        text = body.decode()
        assert text.endswith("\n\n")
        frames = text[:-2].split("\n\n")
        assert all(frame.startswith("data: ") for frame in frames)
        payloads = [frame[len("data: ") :] for frame in frames]
        return [
            ("done", None) if p == "[DONE]" else (_json_style(p), _normalized(json.loads(p)))
            for p in payloads
        ]
    text = body.decode()
    return [(_json_style(text), _normalized(json.loads(text)))]


@pytest.mark.parametrize("name", sorted(CAPTURED_CASES))
async def test_fake_answers_like_the_captured_litellm(
    name: str, aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    from tests.real_litellm.captures import load

    capture = load(name)
    routing = {
        "x-litellm-model-api-base": "http://127.0.0.1:18200/v1",
        "x-litellm-response-duration-ms": "12.5",
        "x-litellm-attempted-retries": "0",
        "x-litellm-attempted-fallbacks": "0",
    }
    if "x-litellm-response-cost" in capture.headers:
        routing["x-litellm-response-cost"] = capture.headers["x-litellm-response-cost"]
    fake = FakeLiteLLM(chunks=3, words=("Hello", " there", "!"), prompt_tokens=11, response_headers=routing)
    if name.startswith("global_budget"):
        fake.usage_cost = 14.0  # the priced model of these captures
    server = await aiohttp_server(fake.make_app())
    status, headers, raw = await post_chat(
        session, server, capture.request_json, **{SCENARIO_HEADER: CAPTURED_CASES[name].value}
    )

    assert status == capture.status
    names = {key.lower() for key in headers} - TRANSPORT_HEADERS
    assert names == {key.lower() for key in capture.headers} - TRANSPORT_HEADERS
    for key in names - VARYING_HEADER_VALUES:
        if not key.startswith("x-litellm-response-cost-"):  # the cost's breakdown varies
            assert headers[key] == capture.headers[key], key
    assert _body_shape(headers["Content-Type"], raw) == _body_shape(capture.headers["content-type"], capture.body)
