"""Beyond the reference, over real HTTP: keep-alive bytes (empty lines) while the first token is
pending (STREAM_KEEPALIVE_*) and transient upstream failures retried before the first byte
(UPSTREAM_RETRY_*). Both are off by default, and then change no byte."""

from __future__ import annotations

import asyncio
import re


from mlpa_aiohttp import keys
from mlpa_aiohttp.errors import GENERIC_UPSTREAM_MESSAGE
from mlpa_aiohttp.relay.sse import event as sse_frame
from mlpa_aiohttp.testing.fake_litellm import Scenario
from tests.support.relay_state import streams_waiting_for_keepalive, streams_with_upstream_open

from tests.support.metrics import sample
from tests.support.streams import direct_stream_bytes
from tests.support.waiting import wait_for

from ..conftest import Service, chat_body, events, open_streams

COMMENT = b"\n"  # the keep-alive bytes: one empty line (relay/keepalive.py says why not a comment)
OPT_IN = {"X-MLPA-Keepalive": "1"}
COMPLETIONS = "/v1/chat/completions"


def _normalised(raw: bytes) -> bytes:
    """Ids and timestamps differ per upstream response; every other byte must match."""
    return re.sub(rb'"id":"chatcmpl-[0-9a-f]+","created":\d+', b"", raw)


def _headers(service: Service, extra: dict[str, str]) -> dict[str, str]:
    return {**service.headers(), **extra}


# -- keep-alive comments -----------------------------------------------------------------


async def test_keepalive_comments_arrive_at_the_interval_until_the_first_byte(make_service) -> None:
    service = await make_service(STREAM_KEEPALIVE_SECONDS="0.2")
    service.litellm.slow_delay = 1.0
    service.litellm.next_scenarios.append(Scenario.SLOW_FIRST_BYTE)
    response = await service.chat(chat_body(stream=True), headers=_headers(service, OPT_IN))
    assert response.status == 200
    raw = await response.read()
    comments = 0
    while raw.startswith(COMMENT):
        raw, comments = raw[len(COMMENT):], comments + 1
    # 1.0 s of silence at a 0.2 s interval: keep-alive lines came (how regularly is
    # tests/load/test_timing.py's concern), and none after the first upstream byte.
    assert comments >= 1, comments
    assert raw.startswith(b"data: "), "keep-alive bytes are only sent before the first upstream byte"
    sent_upstream = service.litellm.requests_to(COMPLETIONS)[-1].json
    assert _normalised(raw) == _normalised(await direct_stream_bytes(service, sent_upstream))
    assert sample(service, "mlpa_stream_keepalive_comments_total", {}) == comments
    assert streams_waiting_for_keepalive(service.app) == 0


async def test_comments_go_on_after_headers_until_a_byte_and_stop_when_the_client_leaves(make_service) -> None:
    service = await make_service(STREAM_KEEPALIVE_SECONDS="0.1")
    service.litellm.next_scenarios.append(Scenario.HANG_AFTER_HEADERS)  # headers, then no byte
    response = await service.chat(chat_body(stream=True), headers=_headers(service, OPT_IN))
    await wait_for(lambda: streams_with_upstream_open(service.app) > 0, timeout=5)
    for _ in range(2):  # LiteLLM's headers are in; its first byte is not: comments go on
        assert await asyncio.wait_for(response.content.readexactly(len(COMMENT)), 2) == COMMENT
    response.close()
    await wait_for(lambda: not open_streams(service))
    assert streams_waiting_for_keepalive(service.app) == 0


async def test_service_type_opts_in_without_the_header(make_service) -> None:
    service = await make_service(STREAM_KEEPALIVE_SECONDS="0.1", STREAM_KEEPALIVE_SERVICE_TYPES="ai")
    service.litellm.slow_delay = 0.5
    service.litellm.next_scenarios.append(Scenario.SLOW_FIRST_BYTE)
    body = await (await service.chat(chat_body(stream=True))).read()
    assert body.startswith(COMMENT + COMMENT)
    assert body.rstrip(b"\n").endswith(b"data: [DONE]")


async def test_streams_not_opted_in_get_todays_bytes(make_service) -> None:
    for env, extra in (
        ({}, OPT_IN),  # the feature is off: the header does nothing
        ({"STREAM_KEEPALIVE_SECONDS": "0.1", "STREAM_KEEPALIVE_SERVICE_TYPES": "memories"}, {}),
    ):
        service = await make_service(**env)
        service.litellm.slow_delay = 0.5
        service.litellm.next_scenarios.append(Scenario.SLOW_FIRST_BYTE)
        relayed = await (await service.chat(chat_body(stream=True), headers=_headers(service, extra))).read()
        assert relayed.startswith(b"data: ")
        sent_upstream = service.litellm.requests_to(COMPLETIONS)[-1].json
        assert _normalised(relayed) == _normalised(await direct_stream_bytes(service, sent_upstream))
        assert sample(service, "mlpa_stream_keepalive_comments_total", {}) == 0
    off = await make_service()
    assert keys.STREAM_KEEPALIVE not in off.app


async def test_error_status_after_comments_is_an_in_band_error_event(make_service) -> None:
    # The client already has its 200 and comments; a 503 arriving after them (here: after
    # retries spent their budget) is the same error event a stream without comments gets.
    service = await make_service(
        STREAM_KEEPALIVE_SECONDS="0.1",
        UPSTREAM_RETRY_ATTEMPTS="1",
        UPSTREAM_RETRY_BACKOFF_SECONDS="0.6",
        UPSTREAM_RETRY_BUDGET_SECONDS="5",
    )
    service.litellm.scenario = Scenario.SERVICE_UNAVAILABLE_503
    response = await service.chat(chat_body(stream=True), headers=_headers(service, OPT_IN))
    assert response.status == 200
    raw = await response.read()
    comments = len(raw) - len(raw.lstrip(COMMENT))
    assert comments >= 2
    assert raw == COMMENT * comments + sse_frame({"code": 503, "error": GENERIC_UPSTREAM_MESSAGE})


# -- retries before the first byte -------------------------------------------------------

RETRIES_ON = {"UPSTREAM_RETRY_ATTEMPTS": "3", "UPSTREAM_RETRY_BACKOFF_SECONDS": "0.01", "UPSTREAM_RETRY_BUDGET_SECONDS": "5"}


async def test_transient_failures_are_retried_until_an_answer(make_service) -> None:
    # No pooled connection is reused, so the reset lands on a fresh connection (a reset on
    # a reused one is the stale keep-alive re-send's case, tested in test_chat_streaming).
    service = await make_service(UPSTREAM_KEEPALIVE_TIMEOUT_SECONDS="0", **RETRIES_ON)
    service.litellm.next_scenarios.extend(
        [Scenario.RESET_BEFORE_RESPONSE, Scenario.SERVICE_UNAVAILABLE_503, Scenario.BAD_GATEWAY_502]
    )
    response = await service.chat(chat_body(stream=True))
    raw = await response.read()
    assert raw.startswith(b"data: ") and raw.endswith(b"data: [DONE]\n\n")
    records = service.litellm.requests_to(COMPLETIONS)
    assert len(records) == 4
    assert records[0].nth_on_connection == 1
    for reason in ("status_503", "status_502", "connection_reset"):
        assert sample(service, "mlpa_upstream_retries_total", {"reason": reason}) == 1
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "success", "reason": "valid_response", **labels}) == 1


async def test_stale_keep_alive_resend_is_part_of_the_one_log_line(make_service, caplog) -> None:
    service = await make_service(**RETRIES_ON)
    await (await service.chat(chat_body(stream=True))).read()  # leaves a pooled connection
    service.litellm.next_scenarios.extend([Scenario.DROP_ON_REUSE, Scenario.SERVICE_UNAVAILABLE_503])
    raw = await (await service.chat(chat_body(stream=True))).read()
    assert raw.endswith(b"data: [DONE]\n\n")
    assert service.litellm.dropped == 1
    assert sample(service, "mlpa_upstream_retries_total", {"reason": "stale_connection"}) == 1
    assert sample(service, "mlpa_upstream_retries_total", {"reason": "status_503"}) == 1
    [line] = events(caplog, "upstream_retried")
    assert (line["retries"], line["reasons"]) == (1, ["stale_connection", "status_503"])
    assert events(caplog, "upstream_stale_connection_retry") == []


async def test_non_streaming_completions_are_retried_too(make_service) -> None:
    service = await make_service(**RETRIES_ON)
    service.litellm.next_scenarios.extend([Scenario.SERVICE_UNAVAILABLE_503, Scenario.SERVICE_UNAVAILABLE_503])
    response = await service.chat(chat_body(stream=False))
    assert response.status == 200
    assert (await response.json())["choices"][0]["message"]["content"]
    assert sample(service, "mlpa_upstream_retries_total", {"reason": "status_503"}) == 2


async def test_budget_exhausted_gives_todays_error_answer(make_service) -> None:
    service = await make_service(
        UPSTREAM_RETRY_ATTEMPTS="10", UPSTREAM_RETRY_BACKOFF_SECONDS="0.1", UPSTREAM_RETRY_BUDGET_SECONDS="0.5"
    )
    service.litellm.scenario = Scenario.SERVICE_UNAVAILABLE_503
    raw = await (await service.chat(chat_body(stream=True))).read()
    assert raw == sse_frame({"code": 503, "error": GENERIC_UPSTREAM_MESSAGE})
    attempts = len(service.litellm.requests_to(COMPLETIONS))
    # Backoffs of 0.05-0.1, 0.1-0.2, 0.2-0.4 s fit in 0.5 s at most three times; never all ten.
    assert 2 <= attempts <= 4, attempts
    assert sample(service, "mlpa_upstream_retries_total", {"reason": "status_503"}) == attempts - 1
    # The same answer, byte for byte, as with retries off (the same fake LiteLLM serves both).
    off = await make_service()
    before = len(off.litellm.requests_to(COMPLETIONS))
    assert await (await off.chat(chat_body(stream=True))).read() == raw
    assert len(off.litellm.requests_to(COMPLETIONS)) == before + 1


async def test_connection_refused_is_retried_then_answered_as_today(make_service, fake_litellm_server) -> None:
    service = await make_service(**RETRIES_ON)
    await (await service.chat(chat_body(stream=True))).read()  # provisions the user
    await fake_litellm_server[1].close()  # nothing listens on LiteLLM's port any more
    raw = await (await service.chat(chat_body(stream=True))).read()
    assert raw == sse_frame({"code": 502, "error": GENERIC_UPSTREAM_MESSAGE})
    assert sample(service, "mlpa_upstream_retries_total", {"reason": "connect_error"}) == 3


async def test_4xx_is_never_retried(make_service) -> None:
    service = await make_service(**RETRIES_ON)
    service.litellm.scenario = Scenario.BUDGET_429
    raw = await (await service.chat(chat_body(stream=True))).read()
    assert raw.startswith(b'data: {"error": ')
    assert len(service.litellm.requests_to(COMPLETIONS)) == 1
    assert service.app[keys.METRICS].registry.get_sample_value("mlpa_upstream_retries_total", {"reason": "status_429"}) is None


async def test_failure_after_bytes_were_relayed_is_not_retried(make_service) -> None:
    service = await make_service(**RETRIES_ON)
    service.litellm.next_scenarios.append(Scenario.MID_STREAM_ERROR)
    raw = await (await service.chat(chat_body(stream=True))).read()
    assert raw.startswith(b"data: {") and raw.endswith(sse_frame({"code": 502, "error": GENERIC_UPSTREAM_MESSAGE}))
    assert len(service.litellm.requests_to(COMPLETIONS)) == 1


async def test_client_hang_up_during_backoff_cancels_at_once(make_service) -> None:
    service = await make_service(
        UPSTREAM_RETRY_ATTEMPTS="3", UPSTREAM_RETRY_BACKOFF_SECONDS="10", UPSTREAM_RETRY_BUDGET_SECONDS="60"
    )
    service.litellm.scenario = Scenario.SERVICE_UNAVAILABLE_503
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200  # the stream's headers leave before LiteLLM is asked
    await wait_for(lambda: sample(service, "mlpa_upstream_retries_total", {"reason": "status_503"}) >= 1, timeout=5)
    response.close()  # in the backoff sleep now
    # The backoff is 10 s: the handler ends long before it unless the hang-up cancelled it.
    await wait_for(lambda: not open_streams(service))
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_availability_total", {"outcome": "abort", "reason": "client_disconnect", **labels}) == 1
    assert len(service.litellm.requests_to(COMPLETIONS)) == 1


async def test_retries_off_by_default(service: Service) -> None:
    service.litellm.next_scenarios.append(Scenario.SERVICE_UNAVAILABLE_503)
    raw = await (await service.chat(chat_body(stream=True))).read()
    assert raw == sse_frame({"code": 503, "error": GENERIC_UPSTREAM_MESSAGE})
    assert len(service.litellm.requests_to(COMPLETIONS)) == 1


async def test_the_keepalive_header_is_in_the_openapi_document(service: Service) -> None:
    document = await (await service.client.get("/openapi.json")).json()
    parameters = document["paths"]["/v1/chat/completions"]["post"]["parameters"]
    [header] = [p for p in parameters if p["name"] == "X-MLPA-Keepalive"]
    assert header["in"] == "header" and "STREAM_KEEPALIVE_SECONDS" in header["description"]
