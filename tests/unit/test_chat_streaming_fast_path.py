"""Both relays (the regular one and RELAY_FAST_PATH's, tests/support/relays.py) at the byte
level, against a raw loopback upstream instead of the fake LiteLLM: it sends exact byte
sequences (half an event, a 48 MiB body at full speed) and counts what it sent. Flow control,
shutdown, silence and a cut upstream with half an event relayed, and connection reuse.
(tests/unit/test_chat_streaming.py has the rest of the relay's behaviour, on both relays.)

Each script leaves the body still arriving when the headers are in, so the fast path takes
every stream over."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from mlpa_aiohttp.relay.sse import SHUTDOWN_EVENT as SHUTDOWN_FRAME
from tests.support.relays import make_service_on_both_relays  # noqa: F401 (fixture: every test on both relays)

from tests.support.waiting import wait_for

from ..conftest import Service, ServiceFactory, chat_body, events, open_streams

GENERIC_502 = b'data: {"code": 502, "error": "Upstream service returned an error"}\n\n'


# ---- a raw upstream --------------------------------------------------------------------


@dataclass
class RawUpstream:
    """A loopback 'LiteLLM' that answers every completion with `script`: bytes are written as
    they are, a float pauses that long, "hang" waits forever, "cut" closes the connection
    mid-body."""

    script: list[bytes | str | float] = field(default_factory=list)
    sent: int = 0
    finished: bool = False
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected_at: float = 0.0
    # The proxy's source port of every request: one port, one pooled connection.
    peer_ports: list[int] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        self.peer_ports.append(request.transport.get_extra_info("peername")[1])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for step in self.script:
                if step == "hang":
                    await asyncio.Event().wait()
                elif isinstance(step, float):
                    await asyncio.sleep(step)
                elif step == "cut":
                    assert request.transport is not None
                    request.transport.close()
                    return response
                else:
                    assert isinstance(step, bytes)
                    await response.write(step)
                    self.sent += len(step)
            await response.write_eof()
            self.finished = True
        except (asyncio.CancelledError, ConnectionError):
            self.disconnected_at = time.monotonic()
            self.disconnected.set()
            raise
        return response


@pytest.fixture
async def raw_upstream(aiohttp_server) -> AsyncIterator[Callable[..., object]]:
    async def start(script: list[bytes | str | float]) -> tuple[RawUpstream, TestServer]:
        upstream = RawUpstream(script)
        app = web.Application(handler_args={"handler_cancellation": True})
        app.router.add_post("/v1/chat/completions", upstream.handle)
        server = await aiohttp_server(app)
        return upstream, server

    yield start


async def service_on(make_service: ServiceFactory, server: TestServer, **env: str) -> Service:
    return await make_service(LITELLM_API_BASE=str(server.make_url("")).rstrip("/"), **env)


def event(index: int, pad: int = 0) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"w%d%s"}}]}\n\n' % (index, b"x" * pad)


# ---- flow control ----------------------------------------------------------------------

UPSTREAM_BYTES = 48 * 2**20


async def test_slow_reader_holds_back_a_fast_upstream_then_gets_every_byte(
    make_service: ServiceFactory, raw_upstream
) -> None:
    block = b"".join(event(i, pad=200) for i in range(256))  # ~64 KiB of whole events
    blocks = UPSTREAM_BYTES // len(block)
    upstream, server = await raw_upstream([block] * blocks)
    service = await service_on(make_service, server)

    # A client with a small receive buffer that reads the headers, then nothing for 1 s.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (service.client.host, service.client.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    payload = json.dumps(chat_body(stream=True)).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in service.headers().items())
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        + head.encode()
        + b"Content-Length: %d\r\n\r\n" % len(payload)
        + payload
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await asyncio.sleep(1.0)
    held_back = upstream.sent
    # Without a pause the relay would have taken (and buffered) the whole body by now.
    assert held_back < UPSTREAM_BYTES // 2, f"upstream sent {held_back} bytes to a stalled client"
    assert not upstream.finished

    # Now read it all: chunked framing decoded by hand, every byte, in order.
    digest, size = hashlib.sha256(), 0
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        length = int(line.strip(), 16)
        if length == 0:
            await reader.readuntil(b"\r\n")
            break
        digest.update(await reader.readexactly(length))
        size += length
        assert await reader.readexactly(2) == b"\r\n"
    writer.close()
    assert size == blocks * len(block)
    assert digest.hexdigest() == hashlib.sha256(block * blocks).hexdigest()
    assert upstream.finished
    await wait_for(lambda: open_streams(service) == 0)


# ---- shutdown, silence, failures: with half an event relayed ------------------------------

HALF_EVENT = event(1) + b'data: {"choices":[{"delta":{"con'


async def test_shutdown_frame_after_half_an_event(make_service, raw_upstream) -> None:
    upstream, server = await raw_upstream([HALF_EVENT, "hang"])
    service = await service_on(make_service, server, SHUTDOWN_DRAIN_SECONDS="0.1")
    response = await service.chat(chat_body(stream=True))
    assert await response.content.readany() == HALF_EVENT
    await service.app.shutdown()
    assert await response.read() == b"\n\n" + SHUTDOWN_FRAME
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)


async def test_silence_after_half_an_event_ends_with_a_framed_error(make_service, raw_upstream, caplog) -> None:
    upstream, server = await raw_upstream([HALF_EVENT, "hang"])
    service = await service_on(make_service, server, STREAMING_TIMEOUT_SECONDS="0.3")
    response = await service.chat(chat_body(stream=True))
    # The upstream hangs for ever: only the silence watch can end the stream.
    assert await asyncio.wait_for(response.read(), timeout=10) == HALF_EVENT + b"\n\n" + GENERIC_502
    failed = events(caplog, "upstream_stream_failed")
    assert len(failed) == 1 and failed[0]["error_type"] == "UpstreamSilent"
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)


@pytest.mark.parametrize("cut_mid_event", [False, True])
async def test_upstream_cut_mid_stream_ends_with_a_framed_error(
    make_service, raw_upstream, cut_mid_event: bool, caplog
) -> None:
    relayed = HALF_EVENT if cut_mid_event else event(0) + event(1)
    upstream, server = await raw_upstream([relayed, "cut"])
    service = await service_on(make_service, server)
    response = await service.chat(chat_body(stream=True))
    expected = relayed + (b"\n\n" if cut_mid_event else b"") + GENERIC_502
    assert await response.read() == expected
    failed = events(caplog, "upstream_stream_failed")
    assert len(failed) == 1 and failed[0]["level"] == "ERROR"
    assert open_streams(service) == 0


async def test_upstream_connection_is_pooled_after_a_clean_stream(make_service, raw_upstream) -> None:
    """A finished stream leaves its upstream connection reading and reusable."""
    upstream, server = await raw_upstream([event(0), 0.02, event(1)])
    service = await service_on(make_service, server)
    for _ in range(3):
        response = await service.chat(chat_body(stream=True))
        assert await asyncio.wait_for(response.read(), 5) == event(0) + event(1)
    assert len(upstream.peer_ports) == 3
    assert len(set(upstream.peer_ports)) == 1, upstream.peer_ports
