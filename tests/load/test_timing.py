"""Wall-clock bounds, kept apart from the unit tests (which assert order and counts only).

These are the latencies the unit tests used to bound inline: how soon LiteLLM sees a
client's hang-up, how soon the per-user stream slot comes back, how regular keep-alive
comments are, and that the mock routes do wait their simulated latencies. The figures are
generous for a shared 2-core machine; a miss means a poll or a timer crept in, not noise.
Both relays (RELAY_FAST_PATH off and on) via this folder's `make_service`.
"""

from __future__ import annotations

import json
import time

import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.relay.sse import KEEPALIVE_BYTES
from mlpa_aiohttp.testing.fake_litellm import Scenario
from tests.support.store_seeding import slots_held
from tests.support.waiting import wait_for

from ..conftest import Service, chat_body

# A poll every 0.1 s (the reference's disconnect watcher) would miss this by half.
HANG_UP_SEEN_WITHIN = 0.05


@pytest.mark.parametrize("scenario", ["hang_before_headers", "hang_after_headers", "mid_stream"])
async def test_litellm_sees_the_hang_up_at_once(make_service, scenario: str) -> None:
    service: Service = await make_service()
    if scenario == "mid_stream":
        service.litellm.interval, service.litellm.chunks = 0.2, 50
    else:
        service.litellm.next_scenarios.append(scenario)
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    if scenario == "mid_stream":
        assert b"data: " in await response.content.readany()
    else:
        await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))
    closed_at = time.monotonic()
    response.close()
    record = service.litellm.requests_to("/v1/chat/completions")[-1]
    await wait_for(record.disconnected.is_set, timeout=1.0)
    latency = record.disconnected_at - closed_at
    assert latency < HANG_UP_SEEN_WITHIN, f"upstream saw the close after {latency * 1000:.1f} ms"


async def test_a_hung_up_stream_gives_its_slot_back_at_once(make_service) -> None:
    service: Service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="1")
    service.litellm.next_scenarios.append("hang_after_headers")
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    slots = service.app[keys.STREAM_SLOTS]
    assert slots_held(slots, "test-uid:ai") == 1
    closed_at = time.monotonic()
    response.close()
    await wait_for(lambda: slots_held(slots, "test-uid:ai") == 0, timeout=1.0, interval=0.001)
    freed_after = time.monotonic() - closed_at
    # The connection-lost callback cancels the handler: no poll, no timer in between.
    assert freed_after < 0.1, f"slot freed {freed_after * 1000:.1f} ms after the hang-up"


async def test_keepalive_lines_keep_their_interval(make_service) -> None:
    service: Service = await make_service(STREAM_KEEPALIVE_SECONDS="0.2")
    service.litellm.slow_delay = 1.0
    service.litellm.next_scenarios.append(Scenario.SLOW_FIRST_BYTE)
    response = await service.chat(chat_body(stream=True), headers={**service.headers(), "X-MLPA-Keepalive": "1"})
    assert response.status == 200
    started, comment_times = time.monotonic(), []
    async for chunk in response.content.iter_any():
        if chunk == KEEPALIVE_BYTES:
            comment_times.append(time.monotonic() - started)
    # 1.0 s of silence at a 0.2 s interval (the tick may be a quarter interval late).
    assert 3 <= len(comment_times) <= 5, comment_times
    gaps = [b - a for a, b in zip(comment_times, comment_times[1:])]
    assert gaps and all(0.1 <= gap <= 0.5 for gap in gaps), gaps


MOCK_TTFT_MS, MOCK_CHUNK_MS = 120, 80


async def test_the_mock_routes_wait_their_simulated_latencies(make_service) -> None:
    service: Service = await make_service(
        MLPA_MOCK_ROUTES="true", MOCK_TTFT_MS=str(MOCK_TTFT_MS), MOCK_STREAMING_CHUNK_LATENCY_MS=str(MOCK_CHUNK_MS)
    )
    started = time.monotonic()
    response = await service.client.post(
        "/mock/chat/completions", data=json.dumps(chat_body()), headers=service.headers()
    )
    assert response.status == 200
    assert time.monotonic() - started >= MOCK_TTFT_MS / 1000

    started = time.monotonic()
    response = await service.client.post(
        "/mock/chat/completions", data=json.dumps(chat_body(stream=True)), headers=service.headers()
    )
    arrivals = []
    async for _ in response.content.iter_any():
        arrivals.append(time.monotonic() - started)
    ended = time.monotonic() - started
    assert arrivals[0] >= MOCK_TTFT_MS / 1000
    # Each of the three frames is followed by the chunk latency, the last one included.
    assert ended >= (MOCK_TTFT_MS + 3 * MOCK_CHUNK_MS) / 1000
