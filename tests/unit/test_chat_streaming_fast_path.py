"""The streaming tests again, with RELAY_FAST_PATH on: the fast path keeps every guarantee
of the regular relay (disconnects, shutdown frames, silence, partial events, stale retry,
accounting, metrics, log lines)."""

from __future__ import annotations

import pytest

import asyncio
import functools

from mlpa_aiohttp import keys

from ..conftest import chat_body
from .test_chat_streaming import *  # noqa: F401,F403  (collected again under the fixture below)


@pytest.fixture
def make_service(make_service):  # the conftest factory, with the fast path switched on
    async def build(**env: str):
        env = {"RELAY_FAST_PATH": "true", **env}
        service = await make_service(**env)
        assert service.app[keys.SETTINGS].server.relay_fast_path is (env["RELAY_FAST_PATH"] == "true")
        return service

    return build


EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 400 + b'"}}]}\n\n'
EVENTS_PER_WRITE = 100
WRITES = 640  # 640 × 100 × ~450 B ≈ 29 MB: more than loopback's socket buffers hold


def _bulk_upstream(finished: list[float]):
    """LiteLLM as fast as the network takes it; notes when it wrote its last event."""
    return functools.partial(_stream_in_bulk, finished)


async def _stream_in_bulk(finished: list[float], request):
    from aiohttp import web

    if request.path != "/v1/chat/completions":
        return web.json_response({})
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    block = EVENT * EVENTS_PER_WRITE
    for _ in range(WRITES):
        await response.write(block)
    finished.append(asyncio.get_running_loop().time())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


@pytest.mark.parametrize("fast", ["true", "false"])
async def test_a_client_that_stops_reading_holds_the_upstream_back(make_service, aiohttp_server, fast: str) -> None:
    """Flow control on both paths: while the client reads nothing, the relay stops reading
    the upstream (which then cannot finish), and once it reads again every byte arrives."""
    from aiohttp import web

    finished: list[float] = []
    upstream_app = web.Application()
    upstream_app.router.add_route("*", "/{tail:.*}", _bulk_upstream(finished))
    upstream = await aiohttp_server(upstream_app)
    service = await make_service(RELAY_FAST_PATH=fast, LITELLM_API_BASE=str(upstream.make_url("")).rstrip("/"))
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    await asyncio.sleep(1.0)  # the client reads nothing meanwhile
    resumed_at = asyncio.get_running_loop().time()
    assert not finished, "the upstream finished while the client read nothing: no back-pressure"
    received = await response.read()
    assert received == EVENT * EVENTS_PER_WRITE * WRITES + b"data: [DONE]\n\n"
    assert finished[0] > resumed_at
