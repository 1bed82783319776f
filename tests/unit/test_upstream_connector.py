"""The upstream connector: a host name works as well as an address, and a request learns
whether its connection came from the pool, which decides whether a POST the upstream
dropped is sent again (only on a reused connection)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from mlpa_aiohttp.upstream.connector import DirectConnector, PoolAwareConnector, watching_connection


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text=f"hello from {request.transport.get_extra_info('sockname')[0]}")


RELEASE = web.AppKey("release", asyncio.Event)


async def _held_until_released(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"part")
    await request.app[RELEASE].wait()
    await response.write_eof(b" rest")
    return response


async def _closing(request: web.Request) -> web.Response:
    return web.Response(text="bye", headers={"Connection": "close"})


@pytest.fixture
async def server() -> TestServer:
    app = web.Application()
    app.router.add_get("/", _hello)
    app.router.add_get("/close", _closing)
    app.router.add_get("/held", _held_until_released)
    app[RELEASE] = asyncio.Event()
    async with TestServer(app, host="127.0.0.1") as test_server:
        yield test_server


async def test_a_host_name_works_as_well_as_an_address(server: TestServer) -> None:
    async with aiohttp.ClientSession(connector=DirectConnector()) as session:
        async with session.get(f"http://localhost:{server.port}/") as response:
            assert response.status == 200


async def _reused(session: aiohttp.ClientSession, url: str) -> bool:
    with watching_connection() as connection:
        async with session.get(url) as response:
            await response.read()
    return connection.reused


@pytest.mark.parametrize("connector_class", [DirectConnector, PoolAwareConnector])
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_request_learns_whether_its_connection_came_from_the_pool(
    server: TestServer, connector_class: type[PoolAwareConnector], host: str
) -> None:
    base = f"http://{host}:{server.port}"
    async with aiohttp.ClientSession(connector=connector_class()) as session:
        assert await _reused(session, f"{base}/") is False
        assert await _reused(session, f"{base}/") is True
        # The server closed this one after its answer: the next request connects anew.
        assert await _reused(session, f"{base}/close") is True
        assert await _reused(session, f"{base}/") is False
        # While the pooled connection is busy with an unfinished answer, a second request needs a new one.
        with watching_connection() as held_use:
            async with session.get(f"{base}/held") as held:
                with watching_connection() as meanwhile:
                    assert await (await session.get(f"{base}/")).text()
                server.app[RELEASE].set()
                await held.read()
        assert (held_use.reused, meanwhile.reused) == (True, False)
        # Both are pooled now.
        assert [await _reused(session, f"{base}/") for _ in range(2)] == [True, True]
