"""The SSE relay over real HTTP: byte-identical, unbuffered, accounted, disconnect-aware.
Every test runs on both relays, the regular one and RELAY_FAST_PATH's (tests/support/relays.py)."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc

import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM, Scenario
from tests.support.relay_state import streams_with_upstream_open
from tests.support.relays import make_service_on_both_relays  # noqa: F401 (fixture: every test on both relays)

from tests.support.metrics import sample
from tests.support.waiting import wait_for

from ..conftest import Service, chat_body, events, open_streams, tracebacks

# Between LiteLLM's events: its body is still arriving when its headers are in, so the fast
# path takes the stream over (a test that needs another pace sets its own).
PACE_SECONDS = 0.005


@pytest.fixture(autouse=True)
def paced_litellm(fake_litellm_server: tuple[FakeLiteLLM, object]) -> None:
    fake_litellm_server[0].interval = PACE_SECONDS


def frames(text: str) -> list[str]:
    return [event for event in text.split("\n\n") if event]


@pytest.mark.parametrize("scenario", [None, "split_event", "tool_calls", "mid_stream_error_event"])
async def test_stream_is_relayed_byte_for_byte(service: Service, scenario: str | None) -> None:
    service.litellm.record_sent_streams = True
    tools = {"tools": [{"type": "function", "function": {"name": "f"}}]} if scenario == "tool_calls" else {}
    response = await service.chat(chat_body(stream=True, scenario=scenario, **tools))
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert response.headers["Transfer-Encoding"] == "chunked"
    relayed = await response.read()
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].sent
    assert relayed == bytes(sent or b"")
    assert relayed.endswith(b"data: [DONE]\n\n") == (scenario != "mid_stream_error_event")


async def test_first_chunk_reaches_client_before_upstream_sends_the_second(service: Service) -> None:
    service.litellm.interval = 0.5
    service.litellm.record_sent_streams = True
    response = await service.chat(chat_body(stream=True))
    first = await response.content.readany()
    assert b"data: " in first
    # LiteLLM is still between its first chunks: what arrived cannot have waited for the rest.
    sent = bytes(service.litellm.requests_to("/v1/chat/completions")[-1].sent or b"")
    assert b"data: [DONE]" not in sent, "the relay buffered the whole stream"
    assert sent.count(b"\n\ndata: ") < service.litellm.chunks
    response.close()


@pytest.mark.parametrize("scenario", [None, "split_event", "usage_empty_choices", "delta_null"])
async def test_usage_is_accounted(service: Service, scenario: str | None, caplog) -> None:
    response = await service.chat(chat_body(stream=True, scenario=scenario))
    body = await response.read()
    assert response.status == 200
    assert b"data: [DONE]" in body
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_tokens_total", {"type": "prompt", **labels}) == service.litellm.prompt_tokens
    assert sample(service, "mlpa_chat_tokens_total", {"type": "completion", **labels}) > 0
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "success", "reason": "valid_response", **labels}) == 1
    assert sample(service, "mlpa_relayed_bytes_total", {}) == len(body)
    assert sample(service, "mlpa_chat_completion_ttft_seconds_count", {"model": "gpt-oss-120b"}) == 1
    assert open_streams(service) == 0
    [line] = events(caplog, "request")
    assert (line["status"], line["result"]) == (200, "success")


async def test_tool_calls_are_counted_even_when_events_are_split(service: Service) -> None:
    service.litellm.next_scenarios.append("tool_calls")
    response = await service.chat(chat_body(stream=True, tools=[{"type": "function", "function": {"name": "f"}}]))
    await response.read()
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_tool_calls_total", labels) == 2
    assert sample(service, "mlpa_chat_requests_with_tools_total", labels) == 1


async def test_upstream_body_carries_user_and_forced_usage(service: Service) -> None:
    response = await service.chat(chat_body(stream=True, max_tokens=100, purpose="ignored", service_type="x"))
    await response.read()
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].json
    assert sent["user"] == "test-uid:ai"
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["max_tokens"] == 100 and sent["max_completion_tokens"] == 100
    assert "purpose" not in sent and "service_type" not in sent


async def test_open_streams_do_not_keep_the_conversation(service: Service) -> None:
    """A stream lives for minutes; the raw body, the parsed request and the upstream body
    must all be gone once the upstream request is sent (each would be one more copy of a
    conversation that can be hundreds of KiB)."""
    conversation_size, streams = 256 * 1024, 4
    body = json.dumps(chat_body(stream=True) | {
        "messages": [{"role": "user", "content": "[fake:hang_after_headers] " + "x" * conversation_size}]
    })
    responses = []
    tracemalloc.start(32)
    try:
        for _ in range(streams):
            responses.append(await service.client.post("/v1/chat/completions", data=body, headers=service.headers()))
        # Every upstream answered: the bodies were sent.
        await wait_for(lambda: streams_with_upstream_open(service.app) == streams)
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        for response in responses:
            response.close()
    # Blocks of about the conversation's size, allocated on the service's side (the fake
    # LiteLLM in this process keeps its own copies, which are not the service's).
    held = [
        trace for trace in snapshot.traces
        if trace.size >= conversation_size // 2
        and any("/mlpa_aiohttp/" in frame.filename for frame in trace.traceback)
        and not any("/mlpa_aiohttp/testing/" in frame.filename or "/tests/" in frame.filename
                    for frame in trace.traceback)
    ]
    assert [response.status for response in responses] == [200] * streams
    assert held == [], [f"{t.size} B at {t.traceback.format(limit=3)}" for t in held]


async def _assert_upstream_abandoned(service: Service) -> None:
    """LiteLLM sees its connection close while it still had a stream to send: the client's
    hang-up closed it (how fast is tests/load/test_disconnect_latency.py's concern)."""
    record = service.litellm.requests_to("/v1/chat/completions")[-1]
    await wait_for(record.disconnected.is_set)
    # (None: LiteLLM never got as far as its headers.)
    assert record.sent is None or b"data: [DONE]" not in record.sent


@pytest.mark.parametrize("scenario", ["hang_before_headers", "hang_after_headers"])
async def test_client_disconnect_while_upstream_silent(service: Service, scenario: str, caplog) -> None:
    service.litellm.next_scenarios.append(scenario)
    service.litellm.record_sent_streams = True
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    assert open_streams(service) == 1
    response.close()
    await _assert_upstream_abandoned(service)
    await wait_for(lambda: open_streams(service) == 0)
    await wait_for(lambda: events(caplog, "client_disconnected"))
    _assert_logged_once_as_disconnect(service, caplog)


async def test_client_disconnect_mid_stream(service: Service, caplog) -> None:
    service.litellm.interval = 0.2
    service.litellm.chunks = 50
    service.litellm.record_sent_streams = True
    response = await service.chat(chat_body(stream=True))
    assert b"data: " in await response.content.readany()
    response.close()
    await _assert_upstream_abandoned(service)
    await wait_for(lambda: events(caplog, "client_disconnected"))
    _assert_logged_once_as_disconnect(service, caplog)


def _assert_logged_once_as_disconnect(service: Service, caplog) -> None:
    lines = events(caplog, "client_disconnected")
    assert len(lines) == 1
    assert lines[0]["level"] == "INFO"
    assert lines[0]["result"] == "abort"
    assert not [e for e in events(caplog) if e["level"] in ("ERROR", "CRITICAL")]
    assert not tracebacks(caplog)
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "abort", "reason": "client_disconnect", **labels}) == 1
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", {"result": "abort", **labels}) == 1


CLASSIFIED = {
    "budget_400": 1,
    "budget_429": 1,
    "rate_limit_429": 2,
    "throttling_429": 2,  # a provider 429 wrapped by LiteLLM: error 2, as the reference
    "context_window_400": 3,
    "invalid_model_400": 8,
    "invalid_argument_400": 9,
}


@pytest.mark.parametrize("scenario,code", sorted(CLASSIFIED.items()))
async def test_classified_upstream_error_is_one_frame(service: Service, scenario: str, code: int) -> None:
    response = await service.chat(chat_body(stream=True, scenario=scenario))
    assert response.status == 200
    assert await response.text() == f'data: {{"error": {code}}}\n\n'


@pytest.mark.parametrize(
    "scenario,status", [("unclassified_400", 400), ("unclassified_429", 429), ("generate_400", 400), ("server_500", 500)]
)
async def test_unclassified_upstream_error_frame(service: Service, scenario: str, status: int) -> None:
    response = await service.chat(chat_body(stream=True, scenario=scenario))
    assert await response.text() == f'data: {{"code": {status}, "error": "Upstream service returned an error"}}\n\n'


async def test_empty_stream_gets_error_frame(service: Service) -> None:
    response = await service.chat(chat_body(stream=True, scenario="empty_stream"))
    assert await response.text() == 'data: {"code": 502, "error": "Upstream service returned an error"}\n\n'
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "failure", "reason": "empty_response", **labels}) == 1


async def test_mid_stream_failure_keeps_relayed_chunks_then_error_frame(service: Service, caplog) -> None:
    response = await service.chat(chat_body(stream=True, scenario="mid_stream_error"))
    body = await response.text()
    parts = frames(body)
    assert '"role": "assistant"' in parts[0] or '"role":"assistant"' in parts[0]
    assert parts[-1] == 'data: {"code": 502, "error": "Upstream service returned an error"}'
    assert len(service.litellm.requests_to("/v1/chat/completions")) == 1, "a failure after relayed bytes must not be retried"
    errors = [e for e in events(caplog, "upstream_stream_failed") if e["level"] == "ERROR"]
    assert len(errors) == 1


async def test_stale_keep_alive_is_retried_once(service: Service) -> None:
    first = await service.chat(chat_body(stream=True))
    await first.read()
    service.litellm.next_scenarios.append(Scenario.DROP_ON_REUSE)
    second = await service.chat(chat_body(stream=True))
    assert second.status == 200
    assert (await second.read()).endswith(b"data: [DONE]\n\n")
    assert service.litellm.dropped == 1
    records = service.litellm.requests_to("/v1/chat/completions")
    assert records[-2].dropped and not records[-1].dropped


async def test_graceful_shutdown_ends_open_streams_with_shutdown_frame(make_service) -> None:
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="0.2")
    service.litellm.next_scenarios.append("hang_after_headers")
    response = await service.chat(chat_body(stream=True))
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    # LiteLLM would hang forever: shutdown returns only because the drain deadline ends the stream.
    await asyncio.wait_for(service.app.shutdown(), timeout=10)
    assert await response.text() == 'data: {"code": 503, "error": "Server shutting down"}\n\n'
    assert open_streams(service) == 0


async def test_streams_that_finish_within_the_drain_budget_complete(make_service) -> None:
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="5")
    service.litellm.interval = 0.05
    response = await service.chat(chat_body(stream=True))
    await response.content.readany()
    await service.app.shutdown()
    assert (await response.read()).endswith(b"data: [DONE]\n\n")


async def test_streams_ended_by_shutdown_are_not_counted_as_failures(make_service) -> None:
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="0.1")
    service.litellm.next_scenarios.append("hang_after_headers")
    response = await service.chat(chat_body(stream=True))
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    await service.app.shutdown()
    await response.read()
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "excluded", "reason": "server_shutdown", **labels}) == 1
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "failure", "reason": "upstream_error", **labels}) == 0


def _request_lines(caplog) -> list[dict]:
    return [e for e in events(caplog) if e.get("path") == "/v1/chat/completions" and "status" in e]


def _status_codes_counted(service: Service) -> set[str]:
    return {
        s.labels["status_code"]
        for family in service.app[keys.METRICS].registry.collect()
        if family.name == "mlpa_response_status_codes"
        for s in family.samples
        if s.name == "mlpa_response_status_codes_total"
    }


async def test_client_hang_up_before_upstream_headers_is_logged_as_499(service: Service, caplog) -> None:
    service.litellm.next_scenarios.append("hang_before_headers")
    response = await service.chat(chat_body(stream=True))
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    response.close()
    await wait_for(lambda: _request_lines(caplog))
    [line] = _request_lines(caplog)
    assert (line["event"], line["status"], line["client_disconnected"]) == ("client_disconnected", 499, True)
    assert line["disconnect_reason"] in ("client_closed", "client_reset")
    assert _status_codes_counted(service) == set(), "a request without a completed response is not counted"


async def test_stream_ended_by_shutdown_is_not_logged_as_a_client_disconnect(make_service, caplog) -> None:
    # Before LiteLLM's headers, the drain deadline cancels the handler (the only way to drop
    # the upstream request at once); the client is still connected and must not be blamed.
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="0.1")
    service.litellm.next_scenarios.append("hang_before_headers")
    response = await service.chat(chat_body(stream=True))
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    await service.app.shutdown()
    await wait_for(lambda: _request_lines(caplog))
    [line] = _request_lines(caplog)
    assert (line["event"], line["status"], line["level"]) == ("ended_by_shutdown", 503, "INFO")
    assert "client_disconnected" not in line and "disconnect_reason" not in line
    assert line["result"] == "error"
    assert not events(caplog, "client_disconnected")
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "excluded", "reason": "server_shutdown", **labels}) == 1
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "abort", "reason": "client_disconnect", **labels}) == 0
    assert _status_codes_counted(service) == set(), "a request without a completed response is not counted"
    response.close()


SHUTDOWN_TEXT = 'data: {"code": 503, "error": "Server shutting down"}\n\n'
LABELS = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}


async def test_stream_still_waiting_for_upstream_headers_at_the_deadline_gets_the_shutdown_frame(make_service) -> None:
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="0.1")
    service.litellm.next_scenarios.append("hang_before_headers")
    response = await service.chat(chat_body(stream=True))
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    # LiteLLM never sends its headers: shutdown returns only because the deadline ends the stream.
    await asyncio.wait_for(service.app.shutdown(), timeout=10)
    assert response.status == 200
    assert await response.text() == SHUTDOWN_TEXT
    # The upstream request is abandoned at once: LiteLLM sees its connection close.
    await asyncio.wait_for(service.litellm.requests_to("/v1/chat/completions")[-1].disconnected.wait(), 0.5)
    assert open_streams(service) == 0
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "excluded", "reason": "server_shutdown", **LABELS}) == 1
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "abort", "reason": "client_disconnect", **LABELS}) == 0


@pytest.mark.parametrize("open_at_shutdown", [True, False])
async def test_stream_started_after_the_drain_ends_at_once_with_the_shutdown_frame(make_service, open_at_shutdown: bool) -> None:
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="0.1")
    if open_at_shutdown:
        service.litellm.next_scenarios.append("hang_after_headers")
        first = await service.chat(chat_body(stream=True))
        await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    await service.app.shutdown()
    if open_at_shutdown:
        assert await first.text() == SHUTDOWN_TEXT
    asked = len(service.litellm.requests_to("/v1/chat/completions"))
    service.litellm.next_scenarios.append("hang_before_headers")  # were LiteLLM asked, it would hang
    late = await service.chat(chat_body(stream=True))
    assert late.status == 200
    assert await asyncio.wait_for(late.text(), 1.0) == SHUTDOWN_TEXT
    assert len(service.litellm.requests_to("/v1/chat/completions")) == asked, "LiteLLM is not asked"
    assert open_streams(service) == 0
    ended = 2 if open_at_shutdown else 1
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "excluded", "reason": "server_shutdown", **LABELS}) == ended
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "abort", "reason": "client_disconnect", **LABELS}) == 0
    service.litellm.next_scenarios.clear()


async def test_stream_started_during_the_drain_is_drained_like_the_others(make_service) -> None:
    service = await make_service(SHUTDOWN_DRAIN_SECONDS="1.5")
    service.litellm.next_scenarios.append("hang_after_headers")
    hanging = await service.chat(chat_body(stream=True))
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    shutdown = asyncio.create_task(service.app.shutdown())
    await wait_for(lambda: service.app[keys.STREAMS].shutting_down)
    service.litellm.interval = 0.05
    during = await service.chat(chat_body(stream=True))
    assert (await during.read()).endswith(b"data: [DONE]\n\n")
    assert not shutdown.done(), "the hanging stream is still being drained"
    await shutdown
    assert await hanging.text() == SHUTDOWN_TEXT
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "success", "reason": "valid_response", **LABELS}) == 1
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "excluded", "reason": "server_shutdown", **LABELS}) == 1


@pytest.mark.parametrize("scenario", ["hang_before_headers", "hang_after_headers"])
async def test_silent_upstream_ends_the_stream_with_an_error_frame(make_service, scenario: str, caplog) -> None:
    service = await make_service(STREAMING_TIMEOUT_SECONDS="0.3")
    service.litellm.next_scenarios.append(scenario)
    response = await service.chat(chat_body(stream=True))
    # LiteLLM stays silent for ever: only the silence watch can end the stream (that it
    # does not fire on a slow but steady stream is the next test).
    body = await asyncio.wait_for(response.text(), timeout=10)
    assert body == 'data: {"code": 502, "error": "Upstream service returned an error"}\n\n'
    await asyncio.wait_for(service.litellm.requests_to("/v1/chat/completions")[-1].disconnected.wait(), 1.0)
    assert len([e for e in events(caplog) if e["level"] == "ERROR"]) == 1
    assert open_streams(service) == 0


async def test_slow_but_steady_stream_is_not_cut(make_service) -> None:
    service = await make_service(STREAMING_TIMEOUT_SECONDS="0.3")
    service.litellm.interval, service.litellm.chunks = 0.15, 8  # 1.2 s in all, never 0.3 s silent
    response = await service.chat(chat_body(stream=True))
    assert (await response.read()).endswith(b"data: [DONE]\n\n")


async def test_tool_names_reach_the_log_line_even_when_events_are_split(service: Service, caplog) -> None:
    response = await service.chat(chat_body(stream=True, scenario="split_event"))
    await response.read()
    [line] = events(caplog, "request")
    assert line["tool_names"] == ["get_weather"]
    assert line["prompt_tokens"] == service.litellm.prompt_tokens and line["result"] == "success"


async def test_json_completion_tool_names_are_logged(service: Service, caplog) -> None:
    response = await service.chat(chat_body(scenario="tool_calls"))
    assert response.status == 200
    [line] = events(caplog, "request")
    assert line["tool_names"] == ["get_weather", "web_search"] and line["tool_calls"] == 2
