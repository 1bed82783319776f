"""Traffic contracts (docs/traffic-contracts.md; compatibility.md §1.8, D50-D52) over real HTTP against a
real Redis: the check before upstream, the count after it, the request metric's modes, Redis
stopped, restarted and paused, and the enforcing mode's admission (429, error 12)."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import redis.asyncio as redis
from aiohttp import web

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.fleet.traffic_contracts import ContractsRedisUnreachable
from mlpa_aiohttp.process.startup import EXIT_UNAVAILABLE
from mlpa_aiohttp.settings import RedisSettings
from tests.support.processes import free_port
from tests.support.redis_server import ThrowawayRedis
from tests.support.waiting import wait_for

from ..conftest import Service, ServiceFactory, chat_body, events, make_settings

pytestmark = pytest.mark.redis

PREFIX = "mlpa:traffic_contract"
# Day-long windows, so that no test's requests straddle a window's end (the window arithmetic
# is tests/unit/test_traffic_contract_rules.py's).
TEST_WINDOW_SECONDS = 86400
UNAVAILABLE = {"detail": {"error": "Traffic contract enforcement unavailable."}}


def redis_env(settings: RedisSettings, **env: str) -> dict[str, str]:
    return {
        "REDIS_HOST": settings.host,
        "REDIS_PORT": str(settings.port),
        "ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT": "true",
        "TRAFFIC_CONTRACT_RPM_WINDOW_SECONDS": str(TEST_WINDOW_SECONDS),
        "TRAFFIC_CONTRACT_TPM_WINDOW_SECONDS": str(TEST_WINDOW_SECONDS),
        **env,
    }


async def contracted(make_service: ServiceFactory, settings: RedisSettings, **env: str) -> Service:
    return await make_service(**redis_env(settings, **env))


class Counters:
    """The contract hashes of the current windows, read straight from Redis."""

    def __init__(self, settings: RedisSettings) -> None:
        self.client = redis.Redis(host=settings.host, port=settings.port, decode_responses=True)

    async def window(self, dimension: str, window: int = TEST_WINDOW_SECONDS) -> dict[str, int]:
        values = await self.client.hgetall(self.key(dimension, window))
        return {field: int(count) for field, count in values.items()}

    async def ttl(self, dimension: str, window: int = TEST_WINDOW_SECONDS) -> int:
        return await self.client.ttl(self.key(dimension, window))

    @staticmethod
    def key(dimension: str, window: int) -> str:
        return f"{PREFIX}:{dimension}:{int(time.time() // window) * window}"

    async def close(self) -> None:
        await self.client.aclose()


@pytest.fixture
async def counters(redis_settings: RedisSettings):
    reader = Counters(redis_settings)
    yield reader
    await reader.close()


async def counted(service: Service) -> None:
    """Wait until the background counts of finished requests reached Redis."""
    contracts = service.app[keys.TRAFFIC_CONTRACTS]
    await wait_for(lambda: contracts.pending_counts == 0)


def modes_of(service: Service, endpoint: str = "/v1/chat/completions", service_type: str = "ai") -> dict[tuple[str, str], float]:
    """mlpa_requests_total of one route and service type, by (RPM mode, TPM mode)."""
    found: dict[tuple[str, str], float] = {}
    for metric in service.app[keys.METRICS].registry.collect():
        if metric.name != "mlpa_requests":
            continue
        for sample in metric.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels["endpoint"] == endpoint and labels["service_type"] == service_type:
                key = (labels["traffic_contract_rpm_mode"], labels["traffic_contract_tpm_mode"])
                found[key] = found.get(key, 0) + sample.value
    return found


async def search(service: Service, service_type: str = "search") -> Any:
    return await service.client.post(
        "/v1/search", json={"query": "weather", "max_results": 3}, headers=service.headers(service_type=service_type)
    )


# ---- off: the default --------------------------------------------------------------------------


async def test_off_by_default_redis_is_never_contacted_and_modes_are_not_applicable(make_service: ServiceFactory) -> None:
    # A port nobody listens on: with contracts off the service must not care.
    service = await make_service(REDIS_HOST="127.0.0.1", REDIS_PORT=str(free_port()))
    assert keys.REDIS not in service.app and keys.TRAFFIC_CONTRACTS not in service.app
    response = await service.chat()
    assert response.status == 200
    assert modes_of(service) == {("N/A", "N/A"): 1}


# ---- the count and the layout ---------------------------------------------------------------------


async def test_a_completion_counts_one_request_and_its_total_tokens(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings)
    response = await service.chat()
    assert response.status == 200
    total = (await response.json())["usage"]["total_tokens"]
    assert total > 0
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert await counters.window("tpm") == {"smart-window": total, "__basket__": total}
    assert 0 < await counters.ttl("rpm") <= 120
    assert modes_of(service) == {("normal", "normal"): 1}


async def test_a_stream_counts_when_it_ends_with_the_usage_chunk_total(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings)
    service.litellm.prompt_tokens = 7
    service.litellm.chunks = 5
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    await response.read()
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert await counters.window("tpm") == {"smart-window": 12, "__basket__": 12}


async def test_each_service_type_counts_against_its_feature_and_the_basket(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings, FEATURE_S2S="speech")
    for service_type in ("s2s", "s2s-android", "memories", "ai"):
        response = await service.chat(headers=service.headers(service_type=service_type))
        assert response.status == 200, service_type
    await counted(service)
    assert await counters.window("rpm") == {"speech": 1, "s2s-android": 1, "smart-window": 2, "__basket__": 4}


async def test_upstream_errors_are_counted_refusals_before_the_proxy_are_not(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings)
    failed = await service.chat(chat_body(scenario="server_500"))
    assert failed.status >= 500
    refused = await service.chat(headers={**service.headers(), "authorization": "Bearer not-a-token"})
    assert refused.status == 401
    await counted(service)
    # The upstream error: one request, no tokens; the 401 never reached the check.
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert await counters.window("tpm") == {}
    assert modes_of(service) == {("normal", "normal"): 1, ("N/A", "N/A"): 1}


async def test_search_is_checked_after_its_service_type_rule_and_counted(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings)
    assert (await search(service)).status == 200
    assert (await search(service, service_type="ai")).status == 400
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert modes_of(service, "/v1/search", "search") == {("normal", "normal"): 1}
    assert modes_of(service, "/v1/search", "ai") == {("N/A", "N/A"): 1}


async def test_a_client_leaving_a_stream_counts_the_request_without_tokens(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters, caplog
) -> None:
    service = await contracted(make_service, redis_settings)
    service.litellm.interval = 0.2
    service.litellm.chunks = 50
    response = await service.chat(chat_body(stream=True))
    await response.content.readany()
    response.close()
    await wait_for(lambda: events(caplog, "client_disconnected"), timeout=3.0)
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    # The reference counts no estimate: without LiteLLM's usage, no tokens.
    assert await counters.window("tpm") == {}


async def test_counts_left_at_shutdown_are_written_before_the_link_closes(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings)
    contracts = service.app[keys.TRAFFIC_CONTRACTS]
    assert (await service.chat()).status == 200
    assert contracts.pending_counts == 1  # gathered, not yet written
    await service.client.close()  # the app's shutdown and cleanup
    assert contracts.pending_counts == 0
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}


# ---- the decision (observational) --------------------------------------------------------------


async def test_over_contract_requests_are_labelled_and_logged_but_answered(
    make_service: ServiceFactory, redis_settings: RedisSettings, caplog
) -> None:
    service = await contracted(
        make_service, redis_settings, SMART_WINDOW_TRAFFIC_CONTRACT_RPM_LIMIT="1", TOTAL_TRAFFIC_CONTRACT_RPM_LIMIT="2"
    )
    for _ in range(3):
        assert (await service.chat()).status == 200
        await counted(service)
    # 1 of 1 is within contract; the second borrows (feature 2 > 1, basket 2 = 2); the third degrades.
    assert modes_of(service) == {("normal", "normal"): 1, ("borrowed", "normal"): 1, ("degraded", "normal"): 1}
    borrowed, degraded = events(caplog, "traffic_contract_exceeded")
    assert borrowed["level"] == "WARNING"
    assert {k: borrowed[k] for k in ("dimension", "service_type", "feature", "limited_by", "mode", "ratio_over",
                                     "feature_count", "basket_count")} == {
        "dimension": "RPM", "service_type": "ai", "feature": "smart-window", "limited_by": "feature",
        "mode": "borrowed", "ratio_over": 2.0, "feature_count": 2, "basket_count": 2,
    }  # fmt: skip
    assert (degraded["limited_by"], degraded["mode"], degraded["ratio_over"]) == ("basket", "degraded", 1.5)


async def test_tokens_are_checked_against_recorded_usage(
    make_service: ServiceFactory, redis_settings: RedisSettings
) -> None:
    service = await contracted(make_service, redis_settings, SMART_WINDOW_TRAFFIC_CONTRACT_TPM_LIMIT="5")
    service.litellm.prompt_tokens = 3
    service.litellm.chunks = 3
    assert (await service.chat()).status == 200  # TPM 0 before it: within
    await counted(service)
    assert (await service.chat()).status == 200  # 6 recorded > 5
    assert modes_of(service) == {("normal", "normal"): 1, ("normal", "borrowed"): 1}


# ---- Redis failing ------------------------------------------------------------------------------


async def test_fail_open_goes_on_unchecked_with_one_warning_per_episode(
    make_service: ServiceFactory, redis_server: ThrowawayRedis, redis_settings: RedisSettings, counters: Counters, caplog
) -> None:
    service = await contracted(make_service, redis_settings, REDIS_RETRY_SECONDS="0")
    redis_server.stop()
    try:
        for _ in range(3):
            assert (await service.chat()).status == 200
        await counted(service)
        assert modes_of(service) == {("N/A", "N/A"): 3}
        assert len(events(caplog, "redis_unavailable")) == 1
        assert [e for e in events(caplog) if e["level"] == "ERROR"] == []
    finally:
        redis_server.start()  # back, empty: a restart
    assert (await service.chat()).status == 200
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert len(events(caplog, "redis_recovered")) == 1
    assert modes_of(service)[("normal", "normal")] == 1


async def test_a_restarted_redis_starts_the_windows_again_and_reloads_the_scripts(
    make_service: ServiceFactory, redis_server: ThrowawayRedis, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(make_service, redis_settings, REDIS_RETRY_SECONDS="0")
    assert (await service.chat()).status == 200
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    redis_server.restart()  # empty: no keys, no scripts cached
    for _ in range(3):
        assert (await service.chat()).status == 200
        await counted(service)
    # The first check after the restart may meet the closed connection (fail-open, N/A); the
    # scripts are loaded again (EVALSHA, then SCRIPT LOAD on NOSCRIPT) and counting goes on.
    modes = modes_of(service)
    assert modes[("normal", "normal")] >= 3 and sum(modes.values()) == 4
    rpm = await counters.window("rpm")
    assert rpm["__basket__"] == rpm["smart-window"] >= 2


async def test_fail_closed_answers_503(
    make_service: ServiceFactory, redis_server: ThrowawayRedis, redis_settings: RedisSettings
) -> None:
    service = await contracted(make_service, redis_settings, TRAFFIC_CONTRACT_FAIL_OPEN_ON_REDIS_ERROR="false")
    redis_server.stop()
    try:
        response = await service.chat()
        assert response.status == 503
        assert await response.json() == UNAVAILABLE
        searched = await search(service)
        assert searched.status == 503
        assert await searched.json() == UNAVAILABLE
        # Refused before the proxy: LiteLLM never asked.
        assert service.litellm.requests_to("/v1/chat/completions") == []
    finally:
        redis_server.start()


async def test_a_paused_redis_costs_a_request_at_most_the_timeout(
    make_service: ServiceFactory, redis_server: ThrowawayRedis, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(
        make_service,
        redis_settings,
        REDIS_TIMEOUT_MS="100",
        REDIS_RETRY_SECONDS="0",
        TRAFFIC_CONTRACT_FAIL_OPEN_ON_REDIS_ERROR="false",
    )
    assert (await service.chat()).status == 200  # connected before the pause
    await counted(service)
    with redis_server.paused():
        started = time.monotonic()
        response = await service.chat()
        waited = time.monotonic() - started
        assert response.status == 503
        # The bound is 100 ms; a hung Redis would hold the request forever.
        assert waited < 2.0
        await counted(service)
    # Resumed: the late replies of the timed-out calls are never taken for a later call's.
    for _ in range(3):
        assert (await service.chat()).status == 200
        await counted(service)
    assert await counters.window("rpm") == {"smart-window": 4, "__basket__": 4}
    # The 503 reached no decision: N/A.
    assert modes_of(service) == {("normal", "normal"): 4, ("N/A", "N/A"): 1}


async def test_start_refused_when_redis_is_unreachable(fake_litellm_server, fake_fxa_server, aiohttp_client) -> None:
    _, litellm = fake_litellm_server
    _, fxa = fake_fxa_server
    settings = make_settings(
        str(litellm.make_url("")).rstrip("/"),
        str(fxa.make_url("/v1")),
        **redis_env(RedisSettings(host="127.0.0.1", port=free_port())),
    )
    runner = web.AppRunner(create_app(settings))
    try:
        with pytest.raises(ContractsRedisUnreachable, match="did not answer PING"):
            await runner.setup()
    finally:
        await runner.cleanup()


# ---- enforcing (beyond the reference) --------------------------------------------------------------


async def test_enforcing_admits_exactly_the_limit_of_concurrent_requests(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    limit = 4
    window = 60  # the default; the window's end is the Retry-After checked
    service = await contracted(
        make_service,
        redis_settings,
        TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT="true",
        TOTAL_TRAFFIC_CONTRACT_RPM_LIMIT=str(limit),
        TRAFFIC_CONTRACT_RPM_WINDOW_SECONDS=str(window),
    )
    if 60 - time.time() % 60 < 5:
        await asyncio.sleep(6)  # all N+1 in one window: start clear of its end
    service.litellm.ttft = 0.2
    before = time.time()
    responses = await asyncio.gather(*(service.chat() for _ in range(limit + 1)))
    after = time.time()
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * limit + [429]
    [refused] = [r for r in responses if r.status == 429]
    assert await refused.json() == {"detail": {"error": 12}}
    retry_after = int(refused.headers["Retry-After"])
    # The seconds until the 60 s window ends, as seen between sending and the answer.
    assert math.ceil(window - after % window) <= retry_after <= math.ceil(window - before % window)
    await counted(service)
    # Reserved at admission, not counted again after upstream; the refused one not at all.
    assert await counters.window("rpm", window) == {"smart-window": limit, "__basket__": limit}
    assert modes_of(service) == {("normal", "normal"): limit, ("degraded", "normal"): 1}


async def test_enforcing_refuses_when_the_token_basket_is_over(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters
) -> None:
    service = await contracted(
        make_service,
        redis_settings,
        TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT="true",
        TOTAL_TRAFFIC_CONTRACT_TPM_LIMIT="5",
        TRAFFIC_CONTRACT_RPM_WINDOW_SECONDS="60",
        TRAFFIC_CONTRACT_TPM_WINDOW_SECONDS="3600",
    )
    service.litellm.prompt_tokens = 3
    service.litellm.chunks = 3
    assert (await service.chat()).status == 200  # 0 tokens recorded before it
    await counted(service)
    before = time.time()
    refused = await service.chat()
    assert refused.status == 429
    assert await refused.json() == {"detail": {"error": 12}}
    # The TPM window (an hour) is the one over: its end, not the RPM window's.
    assert abs(int(refused.headers["Retry-After"]) - math.ceil(3600 - before % 3600)) <= 1
    assert modes_of(service) == {("normal", "normal"): 1, ("normal", "degraded"): 1}


async def test_enforcing_counts_an_aborted_streams_estimate(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters, caplog
) -> None:
    service = await contracted(make_service, redis_settings, TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT="true")
    service.litellm.interval = 0.2
    service.litellm.chunks = 50
    response = await service.chat(chat_body(stream=True))
    received = b""
    while received.count(b'"content":"') < 4:  # the role chunk's empty content, then three words
        chunk = await response.content.readany()
        assert chunk
        received += chunk
    response.close()
    await wait_for(lambda: events(caplog, "client_disconnected"), timeout=3.0)
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert await counters.window("tpm") == {"smart-window": 3, "__basket__": 3}
    [line] = events(caplog, "client_disconnected")
    assert (line["traffic_contract_tokens"], line["traffic_contract_tokens_estimated"]) == (3, True)


async def test_enforcing_counts_a_finished_streams_usage_as_reported(
    make_service: ServiceFactory, redis_settings: RedisSettings, counters: Counters, caplog
) -> None:
    service = await contracted(make_service, redis_settings, TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT="true")
    service.litellm.prompt_tokens = 4
    service.litellm.chunks = 3
    response = await service.chat(chat_body(stream=True))
    await response.read()
    await counted(service)
    assert await counters.window("rpm") == {"smart-window": 1, "__basket__": 1}
    assert await counters.window("tpm") == {"smart-window": 7, "__basket__": 7}
    [line] = events(caplog, "request")
    assert (line["traffic_contract_tokens"], line["traffic_contract_tokens_estimated"]) == (7, False)


def test_serve_refuses_to_start_with_one_line_when_redis_is_unreachable() -> None:
    environ = {
        "PATH": os.environ.get("PATH", ""),
        "MLPA_DEBUG": "true",
        "MLPA_STORE": "memory",
        "ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT": "true",
        "REDIS_HOST": "127.0.0.1",
        "REDIS_PORT": str(free_port()),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", "0"],
        env=environ, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_UNAVAILABLE
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "redis_unavailable" in lines[0] and "did not answer PING" in lines[0] and "REDIS_HOST" in lines[0]
