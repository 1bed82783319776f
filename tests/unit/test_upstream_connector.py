"""The upstream connector connects a single numeric address itself (no resolver thread hop
under uvloop) and falls back to aiohttp's Happy Eyeballs path otherwise; either way the
requests work and connect failures are aiohttp's ClientConnectorError."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from mlpa_aiohttp.upstream.connector import DirectConnector


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text=f"hello from {request.transport.get_extra_info('sockname')[0]}")


@pytest.fixture
async def server() -> TestServer:
    app = web.Application()
    app.router.add_get("/", _hello)
    async with TestServer(app, host="127.0.0.1") as test_server:
        yield test_server


async def test_ip_literal_connects_and_pools(server: TestServer) -> None:
    connector = DirectConnector()
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(3):
            async with session.get(f"http://127.0.0.1:{server.port}/") as response:
                assert response.status == 200
                assert await response.text() == "hello from 127.0.0.1"
        # Keep-alive: the three requests shared one pooled connection.
        assert sum(len(conns) for conns in connector._conns.values()) == 1


async def test_refused_connect_is_a_client_connector_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connect is refused
        async with aiohttp.ClientSession(connector=DirectConnector()) as session:
            with pytest.raises(aiohttp.ClientConnectorError) as raised:
                await session.get(f"http://127.0.0.1:{port}/")
    assert isinstance(raised.value.os_error, ConnectionRefusedError)


async def test_a_name_takes_aiohttps_own_path(server: TestServer) -> None:
    async with aiohttp.ClientSession(connector=DirectConnector()) as session:
        async with session.get(f"http://localhost:{server.port}/") as response:
            assert response.status == 200
