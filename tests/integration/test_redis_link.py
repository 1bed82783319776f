"""The worker's Redis link against a real Redis: bounded calls, episodes, and recovery.

Each failure mode is produced as production produces it: the server killed (connection
refused), paused with SIGSTOP (connections accepted, nothing answered) and restarted empty.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from mlpa_aiohttp.fleet.redis_link import (
    BACKING_OFF,
    CONNECTION,
    TIMEOUT,
    RedisLink,
    RedisUnavailable,
)
from mlpa_aiohttp.observability.metrics import Metrics
from mlpa_aiohttp.settings import RedisSettings
from tests.conftest import events
from tests.support.redis_server import ThrowawayRedis

pytestmark = pytest.mark.redis


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def link_to(settings: RedisSettings, clock: ManualClock | None = None) -> tuple[RedisLink, Metrics]:
    metrics = Metrics(CollectorRegistry())
    return RedisLink(settings, metrics, clock=clock or time.monotonic), metrics


def sample_value(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


async def ping(link: RedisLink) -> bool:
    return await link.run("ping", lambda client: client.ping())


async def test_a_healthy_link_answers_and_reports_up(redis_settings: RedisSettings) -> None:
    link, metrics = link_to(redis_settings)
    try:
        assert await ping(link) is True
        assert await link.run("incr", lambda client: client.incr("k")) == 1
        assert link.healthy
        assert sample_value(metrics, "mlpa_redis_up") == 1
    finally:
        await link.close()


async def test_a_stopped_redis_fails_fast_logs_once_backs_off_and_recovers(
    redis_server: ThrowawayRedis, redis_settings: RedisSettings, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    link, metrics = link_to(redis_settings, clock)
    try:
        assert await ping(link)
        redis_server.stop()
        with pytest.raises(RedisUnavailable) as first:
            await ping(link)
        assert first.value.kind == CONNECTION
        assert not link.healthy
        assert sample_value(metrics, "mlpa_redis_up") == 0
        # Within the back-off nothing is tried: the answer is immediate.
        for _ in range(50):
            with pytest.raises(RedisUnavailable) as skipped:
                await ping(link)
            assert skipped.value.kind == BACKING_OFF
        counted = sample_value(
            metrics, "mlpa_redis_failures_total", {"operation": "ping", "kind": BACKING_OFF}
        )
        assert counted == 50
        # The probe after the back-off fails again while the server is down: no second WARNING.
        clock.now += redis_settings.retry_seconds
        with pytest.raises(RedisUnavailable):
            await ping(link)
        warnings = [e for e in events(caplog, "redis_unavailable") if e["level"] == "WARNING"]
        assert len(warnings) == 1
        assert warnings[0]["kind"] == CONNECTION

        redis_server.start()
        clock.now += redis_settings.retry_seconds
        assert await ping(link)
        assert link.healthy
        assert sample_value(metrics, "mlpa_redis_up") == 1
        (recovered,) = events(caplog, "redis_recovered")
        assert recovered["failures"] == 52  # the first, fifty skipped, the failed probe
    finally:
        await link.close()


async def test_a_paused_redis_costs_a_request_at_most_the_bound(
    redis_server: ThrowawayRedis, redis_settings: RedisSettings
) -> None:
    settings = RedisSettings(
        host=redis_settings.host, port=redis_settings.port, timeout_ms=150, retry_seconds=redis_settings.retry_seconds
    )
    link, _ = link_to(settings)
    try:
        assert await ping(link)  # the pooled connection exists before the pause
        with redis_server.paused():
            started = time.monotonic()
            with pytest.raises(RedisUnavailable) as slow:
                await ping(link)
            waited = time.monotonic() - started
            # Concurrent requests during the episode do not wait at all.
            started_many = time.monotonic()
            results = await asyncio.gather(*(ping(link) for _ in range(20)), return_exceptions=True)
            waited_many = time.monotonic() - started_many
        assert slow.value.kind == TIMEOUT
        assert 0.15 <= waited < 0.15 + 0.5  # the bound, plus scheduling slack on a loaded machine
        assert all(isinstance(r, RedisUnavailable) and r.kind == BACKING_OFF for r in results)
        assert waited_many < 0.1
    finally:
        await link.close()


async def test_a_restarted_redis_is_empty_and_the_link_reconnects(
    redis_server: ThrowawayRedis, redis_settings: RedisSettings
) -> None:
    clock = ManualClock()
    link, _ = link_to(redis_settings, clock)
    try:
        await link.run("set", lambda client: client.set("lease", "1"))
        redis_server.restart()
        # The pooled connection died with the old server: one failure, then back after the back-off.
        with pytest.raises(RedisUnavailable):
            await link.run("get", lambda client: client.get("lease"))
        clock.now += redis_settings.retry_seconds
        assert await link.run("get", lambda client: client.get("lease")) is None
        assert link.healthy
    finally:
        await link.close()
