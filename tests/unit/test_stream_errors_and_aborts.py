"""Over real HTTP: LiteLLM's in-band errors inside a 200 stream are classified (bytes
untouched), and a stream the client leaves counts the tokens it was sent (compatibility.md D36,
D37)."""

from __future__ import annotations


import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.testing.fake_litellm import IN_BAND_ERROR_EVENT, Scenario, in_band_error_event

from tests.support.metrics import recorded
from tests.support.waiting import wait_for

from ..conftest import Service, chat_body, events, tracebacks

LABELS = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}


def sent_upstream(service: Service) -> bytes:
    """The body bytes the fake LiteLLM wrote for the service's last chat request."""
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].sent
    assert sent is not None, "set litellm.record_sent_streams first"
    return bytes(sent)


# ---- item 3: errors inside a 200 stream --------------------------------------------------------

IN_BAND_CASES = {
    # scenario whose error body LiteLLM sends in-band -> (availability outcome, reason, rejection, log level)
    "budget": (Scenario.BUDGET_429, "excluded", "budget_exceeded", "budget_exceeded", "WARNING", "Budget limit exceeded"),
    "budget_422": (Scenario.BUDGET_422, "excluded", "budget_exceeded", "budget_exceeded", "WARNING", "Budget limit exceeded"),
    "rate_limit": (Scenario.RATE_LIMIT_429, "excluded", "rate_limited_platform", "rate_limited", "WARNING", "Rate limit exceeded"),
    "provider_throttling": (
        Scenario.THROTTLING_429, "excluded", "rate_limited_upstream", "rate_limited", "WARNING", "Upstream rate limit exceeded",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(IN_BAND_CASES))
async def test_classified_in_band_error_is_relayed_untouched_and_recorded(service: Service, caplog, case: str) -> None:
    scenario, outcome, reason, rejection, level, log_event = IN_BAND_CASES[case]
    service.litellm.in_band_error = in_band_error_event(scenario)
    service.litellm.record_sent_streams = True
    response = await service.chat(chat_body(stream=True, scenario="mid_stream_error_event"))
    assert response.status == 200
    relayed = await response.read()

    assert relayed.endswith(service.litellm.in_band_error)
    assert b"[DONE]" not in relayed
    assert relayed == sent_upstream(service)

    assert recorded(service, "mlpa_chat_availability_total", {"outcome": outcome, "reason": reason, **LABELS}) == 1
    assert recorded(service, "mlpa_chat_availability_total", {"outcome": "success", "reason": "valid_response", **LABELS}) is None
    assert recorded(service, "mlpa_chat_request_rejections_total", {"reason": rejection, **LABELS}) == 1
    assert recorded(service, "mlpa_chat_completion_latency_seconds_count", {"result": "error", **LABELS}) == 1
    [logged] = [e for e in events(caplog) if e.get("in_band")]
    assert (logged["event"], logged["level"]) == (log_event, level)
    [line] = events(caplog, "request")
    assert line["result"] == "error"
    assert not tracebacks(caplog)


async def test_generic_in_band_error_is_a_failure_with_the_captured_event(service: Service, caplog) -> None:
    assert service.litellm.in_band_error == IN_BAND_ERROR_EVENT  # the real capture's event
    service.litellm.record_sent_streams = True
    response = await service.chat(chat_body(stream=True, scenario="mid_stream_error_event"))
    relayed = await response.read()
    assert response.status == 200
    assert relayed.endswith(IN_BAND_ERROR_EVENT)
    assert relayed == sent_upstream(service)

    assert recorded(service, "mlpa_chat_availability_total", {"outcome": "failure", "reason": "upstream_error", **LABELS}) == 1
    assert recorded(service, "mlpa_chat_tokens_total", {"type": "completion", **LABELS}) is None
    [logged] = [e for e in events(caplog) if e.get("in_band")]
    assert (logged["event"], logged["level"], logged["upstream_status"]) == ("upstream_error", "ERROR", 500)
    assert "APIConnectionError" in logged["upstream_detail"]
    assert len([e for e in events(caplog) if e["level"] == "ERROR"]) == 1
    [line] = events(caplog, "request")
    assert line["result"] == "error"
    assert not tracebacks(caplog)


async def test_normal_stream_is_still_a_success(service: Service, caplog) -> None:
    service.litellm.record_sent_streams = True
    response = await service.chat(chat_body(stream=True))
    relayed = await response.read()
    assert relayed.endswith(b"data: [DONE]\n\n")
    assert relayed == sent_upstream(service)
    assert recorded(service, "mlpa_chat_availability_total", {"outcome": "success", "reason": "valid_response", **LABELS}) == 1
    assert recorded(service, "mlpa_chat_tokens_total", {"type": "completion", **LABELS}) == service.litellm.chunks
    assert not [e for e in events(caplog) if e.get("in_band")]
    [line] = events(caplog, "request")
    assert line["result"] == "success"


async def test_error_text_inside_message_content_is_not_an_error(service: Service) -> None:
    # JSON escapes every quote inside a string, so content quoting an error body cannot match.
    service.litellm.words = ('{"error": {"message": "x"}}', " fine")
    service.litellm.chunks = 2
    response = await service.chat(chat_body(stream=True))
    await response.read()
    assert recorded(service, "mlpa_chat_availability_total", {"outcome": "success", "reason": "valid_response", **LABELS}) == 1


# ---- item 5: what an aborted stream cost -------------------------------------------------------

async def read_until(response, marker: bytes, count: int) -> bytes:
    received = b""
    while received.count(marker) < count:
        chunk = await response.content.readany()
        assert chunk, "stream ended early"
        received += chunk
    return received


async def test_client_leaving_after_n_chunks_counts_the_content_deltas(service: Service, caplog) -> None:
    service.litellm.interval = 0.3
    service.litellm.chunks = 50
    response = await service.chat(chat_body(stream=True))
    content_chunks = 3
    # The role chunk's content is empty; the fake's words are not.
    received = await read_until(response, b'"content":"', content_chunks + 1)
    assert received.count(b'"content":""') == 1
    response.close()
    await wait_for(lambda: events(caplog, "client_disconnected"), timeout=3.0)

    assert recorded(service, "mlpa_aborted_stream_tokens_total", {"type": "completion", **LABELS, "kind": "content_deltas"}) == content_chunks
    assert recorded(service, "mlpa_aborted_stream_tokens_total", {"type": "prompt", **LABELS, "kind": "content_deltas"}) is None
    assert recorded(service, "mlpa_chat_tokens_total", {"type": "completion", **LABELS}) is None
    [line] = events(caplog, "client_disconnected")
    assert (line["aborted_completion_tokens"], line["aborted_tokens_kind"]) == (content_chunks, "content_deltas")


async def test_usage_wins_over_content_deltas(service: Service, caplog) -> None:
    service.litellm.chunks = 4
    service.litellm.prompt_tokens = 11
    service.litellm.pause_before_done = 5.0
    response = await service.chat(chat_body(stream=True))
    await read_until(response, b'"usage":{', 1)
    response.close()
    await wait_for(lambda: events(caplog, "client_disconnected"), timeout=3.0)

    usage = {**LABELS, "kind": "usage"}
    assert recorded(service, "mlpa_aborted_stream_tokens_total", {"type": "prompt", **usage}) == 11
    assert recorded(service, "mlpa_aborted_stream_tokens_total", {"type": "completion", **usage}) == 4
    assert recorded(service, "mlpa_aborted_stream_tokens_total", {"type": "completion", **LABELS, "kind": "content_deltas"}) is None
    [line] = events(caplog, "client_disconnected")
    assert (line["aborted_completion_tokens"], line["aborted_tokens_kind"]) == (4, "usage")


async def test_finished_stream_counts_nothing_as_aborted(service: Service) -> None:
    response = await service.chat(chat_body(stream=True))
    await response.read()
    registry = service.app[keys.METRICS].registry
    aborted = [m for m in registry.collect() if m.name == "mlpa_aborted_stream_tokens"]
    assert [s for m in aborted for s in m.samples if s.name.endswith("_total")] == []
    assert recorded(service, "mlpa_chat_tokens_total", {"type": "completion", **LABELS}) == service.litellm.chunks
