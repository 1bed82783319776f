"""The stack's throwaway Redis (`python -m mlpa_aiohttp stack --traffic-contracts`): a real
redis-server that answers, persists nothing, and is gone once stopped."""

from __future__ import annotations

import pytest
import redis.asyncio as redis

from mlpa_aiohttp.testing.stack import StackRedis

pytestmark = pytest.mark.redis


async def test_the_stack_redis_answers_and_stops() -> None:
    server = await StackRedis.start("127.0.0.1")
    try:
        assert server.exports() == {
            "REDIS_HOST": "127.0.0.1",
            "REDIS_PORT": str(server.port),
            "ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT": "true",
        }
        client = redis.Redis(host=server.host, port=server.port)
        try:
            assert await client.ping() is True
            assert await client.config_get("save") == {"save": ""}
        finally:
            await client.aclose()
    finally:
        await server.stop()
    assert server.process.returncode is not None
    client = redis.Redis(host=server.host, port=server.port, socket_connect_timeout=0.5)
    try:
        with pytest.raises(redis.ConnectionError):
            await client.ping()
    finally:
        await client.aclose()
