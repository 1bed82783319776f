"""STREAM_CAP_SCOPE=fleet over real HTTP against a real Redis: two apps on one Redis stand for
two workers (or pods); every failure of Redis is produced as production produces it (killed,
restarted empty, paused with SIGSTOP) and the cap must fall back, never fail a request, and
come back by itself."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as redis
from prometheus_client import CollectorRegistry

from mlpa_aiohttp import errors, keys
from mlpa_aiohttp.fleet.redis_link import RedisLink
from mlpa_aiohttp.fleet.stream_cap import FleetStreamCap, lease_key
from mlpa_aiohttp.observability.metrics import Metrics
from mlpa_aiohttp.settings import RedisSettings
from mlpa_aiohttp.stream_slots import StreamSlots
from tests.support.metrics import sample
from tests.support.redis_server import ThrowawayRedis
from tests.support.waiting import wait_for

from ..conftest import Service, chat_body, events

pytestmark = pytest.mark.redis

USER = "test-uid:ai"
TOO_MANY_STREAMS = {"detail": {"error": errors.CODE_TOO_MANY_STREAMS}}


def fleet_env(redis_settings: RedisSettings, cap: int = 2, **extra: str) -> dict[str, str]:
    return {
        "MAX_CONCURRENT_STREAMS_PER_USER": str(cap),
        "STREAM_CAP_SCOPE": "fleet",
        "REDIS_HOST": redis_settings.host,
        "REDIS_PORT": str(redis_settings.port),
        "STREAM_LEASE_SECONDS": "3",
        "REDIS_RETRY_SECONDS": "0.2",
        **extra,
    }


async def live_leases(redis_settings: RedisSettings, identity: str = USER) -> int:
    """Leases of `identity` not yet expired on Redis's clock, read as any client would."""
    client = redis.Redis(host=redis_settings.host, port=redis_settings.port)
    try:
        seconds, micros = await client.time()
        return await client.zcount(lease_key(identity), seconds * 1000 + micros // 1000, "+inf")
    finally:
        await client.aclose()


async def open_stream(service: Service):
    service.litellm.next_scenarios.append("hang_after_headers")
    return await service.chat(chat_body(stream=True))


async def open_held(service: Service):
    response = await open_stream(service)
    assert response.status == 200
    return response


async def assert_refused(service: Service) -> None:
    refused = await service.chat(chat_body(stream=True))
    assert refused.status == 429
    assert await refused.json() == TOO_MANY_STREAMS
    assert refused.headers["Retry-After"] == str(errors.TOO_MANY_STREAMS_RETRY_AFTER_SECONDS)


def scope_of(service: Service) -> dict[str, float]:
    return {scope: sample(service, "mlpa_stream_cap_scope", {"scope": scope}) for scope in ("fleet", "worker")}


async def test_one_user_holds_the_cap_across_workers_not_per_worker(make_service, redis_settings, caplog) -> None:
    first = await make_service(**fleet_env(redis_settings))
    second = await make_service(**fleet_env(redis_settings))
    held = [await open_held(first), await open_held(second)]
    assert await live_leases(redis_settings) == 2
    # Per worker each holds one of two; across the fleet the user is at the cap.
    await assert_refused(first)
    await assert_refused(second)
    assert len(first.litellm.requests_to("/v1/chat/completions")) == 2  # refused before any upstream call
    refusals = events(caplog, "concurrent_stream_limit")
    assert [(e["level"], e["scope"], e["limit"], e["user"]) for e in refusals] == [("WARNING", "fleet", 2, USER)] * 2
    assert sample(first, "mlpa_chat_request_rejections_total", {
        "reason": "concurrent_stream_limit", "model": "gpt-oss-120b", "service_type": "ai", "purpose": ""
    }) == 1
    assert scope_of(first) == {"fleet": 1, "worker": 0}

    # A stream that ends frees its lease at once: the other worker admits the next.
    held[0].close()
    await wait_for(lambda: first.app[keys.FLEET_STREAM_CAP].leases_held == 0)
    await wait_for_leases(redis_settings, 1)
    following = await second.chat(chat_body(stream=True))
    assert following.status == 200 and (await following.read()).endswith(b"data: [DONE]\n\n")
    held[1].close()
    await wait_for_leases(redis_settings, 0)


async def wait_for_leases(redis_settings: RedisSettings, count: int, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while (found := await live_leases(redis_settings)) != count:
        assert time.monotonic() < deadline, f"{found} leases in Redis, expected {count}"
        await asyncio.sleep(0.01)


async def test_concurrent_requests_on_two_workers_never_exceed_the_cap(make_service, redis_settings) -> None:
    services = [await make_service(**fleet_env(redis_settings, cap=3)) for _ in range(2)]
    services[0].litellm.scenario = "hang_after_headers"
    responses = await asyncio.gather(*(services[i % 2].chat(chat_body(stream=True)) for i in range(12)))
    assert sorted(r.status for r in responses) == [200] * 3 + [429] * 9
    assert await live_leases(redis_settings) == 3
    for response in responses:
        response.close()
    await wait_for_leases(redis_settings, 0)


async def test_other_users_and_service_types_are_other_identities(make_service, redis_settings) -> None:
    service = await make_service(**fleet_env(redis_settings, cap=1))
    held = await open_held(service)
    await assert_refused(service)
    other = service.fxa.issue_jwt("other-uid")
    answer = await service.chat(chat_body(stream=True), headers=service.headers(authorization=f"Bearer {other}"))
    assert answer.status == 200 and (await answer.read()).endswith(b"data: [DONE]\n\n")
    other_type = await service.chat(chat_body(stream=True), headers=service.headers(service_type="s2s"))
    assert other_type.status == 200
    await other_type.read()
    held.close()


@pytest.mark.parametrize("scenario", ["server_500", "mid_stream_error"])
async def test_an_upstream_failure_releases_the_lease(make_service, redis_settings, scenario: str) -> None:
    service = await make_service(**fleet_env(redis_settings, cap=1))
    service.litellm.next_scenarios.append(scenario)
    failed = await service.chat(chat_body(stream=True))
    assert failed.status == 200
    await failed.read()
    await wait_for_leases(redis_settings, 0)
    following = await service.chat(chat_body(stream=True))
    assert following.status == 200 and (await following.read()).endswith(b"data: [DONE]\n\n")


async def test_sequential_streams_on_one_worker_never_meet_their_own_lease(make_service, redis_settings) -> None:
    """A user at the cap opening the next stream the instant the last one ended: the worker's
    unsent release travels with the acquire."""
    service = await make_service(**fleet_env(redis_settings, cap=1))
    for _ in range(20):
        response = await service.chat(chat_body(stream=True))
        assert response.status == 200 and (await response.read()).endswith(b"data: [DONE]\n\n")


async def test_shutdown_releases_the_leases_of_the_streams_it_ends(make_service, redis_settings) -> None:
    service = await make_service(**fleet_env(redis_settings), SHUTDOWN_DRAIN_SECONDS="0.1")
    held = await open_held(service)
    assert await live_leases(redis_settings) == 1
    await service.app.shutdown()
    assert await held.text() == 'data: {"code": 503, "error": "Server shutting down"}\n\n'
    await wait_for_leases(redis_settings, 0)


async def test_a_stopped_redis_falls_back_to_the_per_worker_cap_and_comes_back(
    make_service, redis_server: ThrowawayRedis, redis_settings, caplog
) -> None:
    first = await make_service(**fleet_env(redis_settings))
    second = await make_service(**fleet_env(redis_settings))
    before = [await open_held(first)]
    redis_server.stop()
    # No request fails: each worker counts alone, so the user gets the cap per worker.
    during = [await open_held(first), await open_held(second), await open_held(second)]
    await assert_refused(first)  # one before and one during: this worker's own cap
    await assert_refused(second)
    assert scope_of(first) == {"fleet": 0, "worker": 1}
    fallbacks = sum(
        sample(first, "mlpa_stream_cap_fallbacks_total", {"kind": kind}) for kind in ("connection", "backing_off")
    )
    assert fallbacks >= 1
    warnings = [e for e in events(caplog, "redis_unavailable") if e["level"] == "WARNING"]
    assert len(warnings) == 2  # one episode per worker, not one line per request

    redis_server.start()
    # Each worker re-registers its live leases by itself: 2 on each, 4 over the cap of 2.
    await wait_for(lambda: first.app[keys.FLEET_STREAM_CAP].in_force, timeout=5)
    await wait_for(lambda: second.app[keys.FLEET_STREAM_CAP].in_force, timeout=5)
    assert await live_leases(redis_settings) == 4
    assert scope_of(first) == {"fleet": 1, "worker": 0}
    assert [e["event"] for e in events(caplog, "stream_cap_back_in_force")] == ["stream_cap_back_in_force"] * 2
    # The fleet cap is in force again: the excess is not cut, but nobody new gets in until
    # the user is below the cap across the fleet.
    await assert_refused(first)
    for response in [*before, *during][:3]:
        response.close()
    await wait_for_leases(redis_settings, 1)
    admitted = await open_held(first)
    await assert_refused(second)
    for response in [admitted, *during[2:]]:
        response.close()
    await wait_for_leases(redis_settings, 0)


async def test_a_restarted_redis_loses_every_lease_and_the_workers_put_them_back(
    make_service, redis_server: ThrowawayRedis, redis_settings
) -> None:
    first = await make_service(**fleet_env(redis_settings))
    second = await make_service(**fleet_env(redis_settings))
    held = [await open_held(first), await open_held(second)]
    redis_server.restart()
    assert await live_leases(redis_settings) == 0
    # Both workers notice on their next call (an acquire's, or the renewal's within
    # lease/3) and re-register: the user is at the cap again with no request failing.
    # The next stream is admitted whichever way the worker learns of the restart: by a
    # failed call (the per-worker count admits) or by an empty set (the fleet's admits).
    held.append(await open_held(first))
    await wait_for(lambda: first.app[keys.FLEET_STREAM_CAP].in_force, timeout=5)
    await wait_for(lambda: second.app[keys.FLEET_STREAM_CAP].in_force, timeout=5)
    await wait_for_leases(redis_settings, len(held), timeout=5)
    assert sample(first, "mlpa_stream_leases_restored_total") + sample(second, "mlpa_stream_leases_restored_total") >= 2
    await assert_refused(second)
    for response in held:
        response.close()
    await wait_for_leases(redis_settings, 0)


async def test_a_paused_redis_costs_a_stream_at_most_the_bound_and_nothing_leaks(
    make_service, redis_server: ThrowawayRedis, redis_settings
) -> None:
    service = await make_service(**fleet_env(redis_settings, REDIS_TIMEOUT_MS="150"))
    warm = await service.chat(chat_body(stream=True))  # the pooled connection exists before the pause
    await warm.read()
    await wait_for_leases(redis_settings, 0)
    with redis_server.paused():
        started = time.monotonic()
        held = await open_held(service)  # admitted by the per-worker cap after the bound
        waited = time.monotonic() - started
        assert scope_of(service) == {"fleet": 0, "worker": 1}
        assert sample(service, "mlpa_stream_cap_fallbacks_total", {"kind": "timeout"}) == 1
    assert waited < 0.15 + 1.0  # the bound, plus the request's own work on a loaded machine
    # Redis runs the script it had queued: the lease is there, and it is live, so the
    # renewal keeps it; when the stream ends it is released like any other.
    await wait_for(lambda: service.app[keys.FLEET_STREAM_CAP].in_force, timeout=5)
    await wait_for_leases(redis_settings, 1)
    held.close()
    await wait_for_leases(redis_settings, 0)


def direct_cap(redis_settings: RedisSettings, lease_seconds: float) -> tuple[FleetStreamCap, RedisLink]:
    metrics = Metrics(CollectorRegistry())
    link = RedisLink(redis_settings, metrics)
    return FleetStreamCap(StreamSlots(2), link, lease_seconds=lease_seconds, metrics=metrics), link


async def test_a_dead_holders_leases_expire_after_one_lifetime_a_live_ones_do_not(redis_settings) -> None:
    """A worker killed mid-stream never releases: its leases count until their lifetime ends
    on Redis's clock. A live worker's one renewal task keeps its own beyond that."""
    dead, dead_link = direct_cap(redis_settings, lease_seconds=0.6)
    live, live_link = direct_cap(redis_settings, lease_seconds=0.6)
    renewing = asyncio.create_task(live.run())
    try:
        assert await dead.take(USER) is not None
        assert await live.take(USER) is not None
        assert await live.take(USER) is None  # two of two across the "fleet"
        # The dead worker does nothing more (no task, no release), as after SIGKILL.
        await asyncio.sleep(0.9)
        assert await live_leases(redis_settings) == 1  # the dead one expired, the live one renewed
        assert await live.take(USER) is not None  # the slot the dead worker held is free again
        assert await live.take(USER) is None
    finally:
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)
        await dead_link.close()
        await live_link.close()


async def test_worker_scope_never_contacts_redis(make_service) -> None:
    service = await make_service(MAX_CONCURRENT_STREAMS_PER_USER="1", REDIS_PORT="1")
    assert keys.REDIS not in service.app and keys.FLEET_STREAM_CAP not in service.app
    held = await open_held(service)
    await assert_refused(service)
    held.close()


async def test_a_release_not_yet_sent_travels_with_the_next_acquire(redis_settings) -> None:
    """No app-wide task here, so the release stays queued: the worker's next acquire for the
    same identity must carry it, or a user at the cap would meet their own finished stream."""
    cap, link = direct_cap(redis_settings, lease_seconds=30)
    try:
        first = await cap.take(USER)
        second = await cap.take(USER)
        assert first is not None and second is not None
        cap.give_back(USER, first)
        assert await live_leases(redis_settings) == 2  # not told yet
        third = await cap.take(USER)
        assert third is not None
        assert await live_leases(redis_settings) == 2  # the first released, the third taken
        assert await cap.take(USER) is None
    finally:
        await link.close()


async def lease_commands(redis_settings: RedisSettings) -> dict[str, int]:
    """The commands the fleet cap sends that Redis has run so far (INFO commandstats); the
    tests' own reads (TIME, ZCOUNT, INFO) are other commands."""
    client = redis.Redis(host=redis_settings.host, port=redis_settings.port)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    wanted = ("evalsha", "eval", "zrem", "zadd", "script|load", "ping")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in wanted}


async def test_a_streams_redis_calls_do_not_grow_with_its_events(make_service, redis_settings) -> None:
    """A lease at the start (one EVALSHA), a release at the end (one ZREM): nothing per event."""
    # A lifetime of 30 s: no renewal (every 10 s) falls inside the streams counted.
    service = await make_service(**fleet_env(redis_settings, cap=1, STREAM_LEASE_SECONDS="30"))
    warm = await service.chat(chat_body(stream=True))  # the acquire script is loaded once
    await warm.read()
    await wait_for_leases(redis_settings, 0)

    async def calls_for_one_stream(chunks: int) -> dict[str, int]:
        service.litellm.chunks = chunks
        before = await lease_commands(redis_settings)
        response = await service.chat(chat_body(stream=True))
        body = await response.read()
        assert body.count(b"data: ") >= chunks
        await wait_for_leases(redis_settings, 0)
        after = await lease_commands(redis_settings)
        return {name: after[name] - before[name] for name in after if after[name] != before[name]}

    # commandstats counts a script's own commands too: the acquire's ZADD.
    one_lease = {"evalsha": 1, "zadd": 1, "zrem": 1}
    assert await calls_for_one_stream(2) == one_lease
    assert await calls_for_one_stream(300) == one_lease
