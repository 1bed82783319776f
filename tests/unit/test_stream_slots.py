"""MAX_CONCURRENT_STREAMS_PER_USER over real HTTP: the cap, its 429, and every way a slot
comes back (normal end, upstream error, client hang-up, shutdown)."""

from __future__ import annotations

import asyncio
import re

import pytest

from mlpa_aiohttp import keys

from tests.support.metrics import sample
from tests.support.store_seeding import slots_held
from tests.support.waiting import wait_for

from ..conftest import Service, chat_body, events

LABELS = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
# compatibility.md D42: code 11 (10 is the reference's global budget since 1.0.39).
TOO_MANY_STREAMS = {"detail": {"error": 11}}


def held(service: Service, user_id: str = "test-uid:ai") -> int:
    return slots_held(service.app[keys.STREAM_SLOTS], user_id)


async def open_hanging_stream(service: Service, **headers: str):
    """A stream whose upstream answered its headers and then stays silent."""
    service.litellm.next_scenarios.append("hang_after_headers")
    response = await service.chat(chat_body(stream=True), headers=service.headers(**headers) if headers else None)
    assert response.status == 200
    return response


async def test_the_cap_plus_first_stream_of_one_user_gets_429_others_are_unaffected(make_service, caplog) -> None:
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="2")
    held_open = [await open_hanging_stream(service) for _ in range(2)]
    assert held(service) == 2

    refused = await service.chat(chat_body(stream=True))
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "5"
    assert await refused.json() == TOO_MANY_STREAMS
    # Refused before any upstream call: LiteLLM saw only the two open streams.
    assert len(service.litellm.requests_to("/v1/chat/completions")) == 2

    # Another user, and the same user under another service type, are other identities.
    other_user = service.fxa.issue_jwt("other-uid")
    other = await service.chat(chat_body(stream=True), headers=service.headers(authorization=f"Bearer {other_user}"))
    assert other.status == 200 and (await other.read()).endswith(b"data: [DONE]\n\n")
    other_type = await service.chat(chat_body(stream=True), headers=service.headers(service_type="s2s"))
    assert other_type.status == 200 and (await other_type.read()).endswith(b"data: [DONE]\n\n")
    # Non-streamed completions are not counted (compatibility.md D32).
    json_answer = await service.chat(chat_body(stream=False))
    assert json_answer.status == 200

    [line] = events(caplog, "concurrent_stream_limit")
    assert line["level"] == "WARNING" and line["limit"] == 2 and line["user"] == "test-uid:ai"
    assert sample(service, "mlpa_chat_request_rejections_total", {"reason": "concurrent_stream_limit", **LABELS}) == 1
    assert sample(
        service, "mlpa_chat_availability_total", {"outcome": "excluded", "reason": "concurrent_stream_limit", **LABELS}
    ) == 1
    for response in held_open:
        response.close()
    await wait_for(lambda: len(service.app[keys.STREAM_SLOTS]) == 0)


async def test_concurrent_requests_never_exceed_the_cap(make_service) -> None:
    """Many requests of one identity at once: exactly `cap` get a stream."""
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="3")
    service.litellm.scenario = "hang_after_headers"
    responses = await asyncio.gather(*(service.chat(chat_body(stream=True)) for _ in range(10)))
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * 3 + [429] * 7
    assert held(service) == 3
    for response in responses:
        response.close()
    await wait_for(lambda: held(service) == 0)


async def test_a_client_that_hangs_up_frees_its_slot_at_once(make_service, caplog) -> None:
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="1")
    response = await open_hanging_stream(service)
    assert (await service.chat(chat_body(stream=True))).status == 429
    [upstream] = service.litellm.requests_to("/v1/chat/completions")
    response.close()
    await wait_for(lambda: held(service) == 0)
    # LiteLLM is still silent and the silence watch is STREAMING_TIMEOUT_SECONDS (300 s)
    # away: only the hang-up (the connection-lost callback) can have ended the stream, and
    # it also closed the upstream request.
    await wait_for(upstream.disconnected.is_set)
    assert len(events(caplog, "client_disconnected")) == 1
    following = await service.chat(chat_body(stream=True))
    assert following.status == 200
    assert (await following.read()).endswith(b"data: [DONE]\n\n")
    assert held(service) == 0


@pytest.mark.parametrize(
    ("scenario", "final_frame"),
    [
        ("server_500", b'data: {"code": 500, "error": "Upstream service returned an error"}\n\n'),
        ("budget_429", b'data: {"error": 1}\n\n'),
        ("mid_stream_error", b'data: {"code": 502, "error": "Upstream service returned an error"}\n\n'),
    ],
)
async def test_an_upstream_error_frees_the_slot(make_service, scenario: str, final_frame: bytes) -> None:
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="1")
    service.litellm.next_scenarios.append(scenario)
    failed = await service.chat(chat_body(stream=True))
    assert failed.status == 200 and (await failed.read()).endswith(final_frame)
    assert held(service) == 0
    following = await service.chat(chat_body(stream=True))
    assert following.status == 200 and (await following.read()).endswith(b"data: [DONE]\n\n")


async def test_streams_that_end_normally_give_their_slot_back(make_service) -> None:
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="1")
    for _ in range(3):
        response = await service.chat(chat_body(stream=True))
        assert response.status == 200 and (await response.read()).endswith(b"data: [DONE]\n\n")
        assert held(service) == 0


async def test_shutdown_frees_the_slots_of_the_streams_it_ends(make_service) -> None:
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="2", SHUTDOWN_DRAIN_SECONDS="0.1")
    response = await open_hanging_stream(service)
    assert held(service) == 1
    await service.app.shutdown()
    assert await response.text() == 'data: {"code": 503, "error": "Server shutting down"}\n\n'
    assert held(service) == 0


_PER_RESPONSE = re.compile(rb'chatcmpl-[0-9a-f]{32}|"created":\d+')


async def stream_exchange(service: Service) -> tuple[int, list[tuple[str, str]], bytes]:
    response = await service.chat(chat_body(stream=True))
    body = await response.read()
    headers = [(k, v) for k, v in response.headers.items() if k.lower() != "date"]
    # The fake LiteLLM mints a completion id and timestamp per response; all else is compared byte for byte.
    return response.status, headers, _PER_RESPONSE.sub(b"<per-response>", body)


async def test_off_by_default_the_wire_is_byte_identical(make_service) -> None:
    without_setting = await stream_exchange(await make_service())
    set_to_zero = await stream_exchange(await make_service(MAX_CONCURRENT_STREAMS_PER_USER="0"))
    capped = await stream_exchange(await make_service(MAX_CONCURRENT_STREAMS_PER_USER="4"))
    assert without_setting[0] == 200 and without_setting[2].endswith(b"data: [DONE]\n\n")
    assert set_to_zero == without_setting
    # A stream the cap admits is the same stream too.
    assert capped == without_setting


async def test_off_by_default_nothing_is_counted(make_service) -> None:
    service = await make_service()
    responses = [await open_hanging_stream(service) for _ in range(5)]
    assert len(service.app[keys.STREAM_SLOTS]) == 0
    for response in responses:
        response.close()


async def test_a_negative_cap_is_a_configuration_error(make_service) -> None:
    from mlpa_aiohttp.settings import SettingsError

    with pytest.raises(SettingsError, match="MAX_CONCURRENT_STREAMS_PER_USER: must be at least 0"):
        await make_service(MAX_CONCURRENT_STREAMS_PER_USER="-1")
