"""RELAY_FAST_PATH over real HTTP, next to the regular relay: the fast path takes the stream
over, relays the same bytes, and keeps flow control, hang-up, shutdown, silence and
partial-event framing. (tests/unit/test_chat_streaming.py runs all its tests on both paths.)

Some upstreams here are a raw loopback server instead of the fake LiteLLM: it sends exact
byte sequences (half an event, a 48 MiB body at full speed) and counts what it sent."""

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

from mlpa_aiohttp import keys
from mlpa_aiohttp.relay.fast_path import FastRelay
from mlpa_aiohttp.relay.sse import SHUTDOWN_EVENT as SHUTDOWN_FRAME

from tests.support.waiting import wait_for

from ..conftest import Service, ServiceFactory, chat_body, events, open_streams

PATHS = ["regular", "fast"]
GENERIC_502 = b'data: {"code": 502, "error": "Upstream service returned an error"}\n\n'


@pytest.fixture
def takeovers(monkeypatch: pytest.MonkeyPatch) -> list[FastRelay | None]:
    """What every `FastRelay.take_over` call returned (None: it declined)."""
    results: list[FastRelay | None] = []
    original = FastRelay.take_over.__func__  # type: ignore[attr-defined]

    def recording(cls, *args, **kwargs):  # noqa: ANN001
        relay = original(cls, *args, **kwargs)
        results.append(relay)
        return relay

    monkeypatch.setattr(FastRelay, "take_over", classmethod(recording))
    return results


def assert_path_taken(path: str, takeovers: list[FastRelay | None], streams: int = 1) -> None:
    if path == "fast":
        assert len(takeovers) == streams and all(relay is not None for relay in takeovers), takeovers
    else:
        assert takeovers == []


def normalised(raw: bytes) -> list[object]:
    """SSE events with the per-response id and timestamp blanked."""
    parsed: list[object] = []
    for event in raw.decode().split("\n\n"):
        if event.startswith("data: {"):
            payload = json.loads(event[6:])
            parsed.append(payload | {"id": "", "created": 0} if "id" in payload else payload)
        elif event:
            parsed.append(event)
    return parsed


@pytest.mark.parametrize("scenario", [None, "split_event", "tool_calls", "mid_stream_error", "mid_stream_error_event"])
async def test_fast_path_relays_what_the_regular_relay_relays(
    make_service: ServiceFactory, takeovers: list[FastRelay | None], scenario: str | None
) -> None:
    regular = await make_service(RELAY_FAST_PATH="false")
    fast = await make_service(RELAY_FAST_PATH="true")
    extra = {"tools": [{"type": "function", "function": {"name": "f"}}]} if scenario == "tool_calls" else {}
    bodies = {}
    for name, service in (("regular", regular), ("fast", fast)):
        # Paced, so that the body is still coming when the headers are in (a body complete by
        # then is relayed by the regular path: nothing is left to take over).
        service.litellm.chunks, service.litellm.interval = 40, 0.003
        response = await service.chat(chat_body(stream=True, scenario=scenario, **extra))
        assert response.status == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
        bodies[name] = await response.read()
    assert len(takeovers) == 1 and takeovers[0] is not None
    assert normalised(bodies["fast"]) == normalised(bodies["regular"])
    assert len(bodies["fast"]) == len(bodies["regular"])


@pytest.mark.parametrize("path", PATHS)
async def test_canonical_line_and_metrics(make_service: ServiceFactory, takeovers, path: str, caplog) -> None:
    service = await make_service(RELAY_FAST_PATH=str(path == "fast").lower())
    service.litellm.interval = 0.003
    response = await service.chat(chat_body(stream=True))
    body = await response.read()
    assert_path_taken(path, takeovers)
    [line] = events(caplog, "request")
    assert (line["status"], line["result"]) == (200, "success")
    registry = service.app[keys.METRICS].registry
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert registry.get_sample_value("mlpa_relayed_bytes_total") == len(body)
    assert registry.get_sample_value("mlpa_chat_tokens_total", {"type": "completion", **labels}) == service.litellm.chunks
    assert registry.get_sample_value("mlpa_chat_completion_ttft_seconds_count", {"model": "gpt-oss-120b"}) == 1
    assert registry.get_sample_value("mlpa_open_streams") == 0


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


async def service_on(make_service: ServiceFactory, server: TestServer, path: str, **env: str) -> Service:
    return await make_service(
        LITELLM_API_BASE=str(server.make_url("")).rstrip("/"), RELAY_FAST_PATH=str(path == "fast").lower(), **env
    )


def event(index: int, pad: int = 0) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"w%d%s"}}]}\n\n' % (index, b"x" * pad)


# ---- flow control ----------------------------------------------------------------------

UPSTREAM_BYTES = 48 * 2**20


@pytest.mark.parametrize("path", PATHS)
async def test_slow_reader_holds_back_a_fast_upstream_then_gets_every_byte(
    make_service: ServiceFactory, raw_upstream, takeovers, path: str
) -> None:
    block = b"".join(event(i, pad=200) for i in range(256))  # ~64 KiB of whole events
    blocks = UPSTREAM_BYTES // len(block)
    upstream, server = await raw_upstream([block] * blocks)
    service = await service_on(make_service, server, path)

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
    assert_path_taken(path, takeovers)
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


# ---- hang-up, shutdown, silence, failures: with half an event relayed --------------------

HALF_EVENT = event(1) + b'data: {"choices":[{"delta":{"con'


@pytest.mark.parametrize("path", PATHS)
async def test_client_hang_up_closes_the_upstream_at_once(make_service, raw_upstream, takeovers, path: str, caplog) -> None:
    upstream, server = await raw_upstream([event(0), "hang"])
    service = await service_on(make_service, server, path)
    response = await service.chat(chat_body(stream=True))
    assert await response.content.readany() == event(0)
    response.close()
    # The upstream hangs for ever: only the client's hang-up can close its connection (how
    # fast is tests/load/test_disconnect_latency.py's concern).
    await wait_for(upstream.disconnected.is_set)
    assert_path_taken(path, takeovers)
    await wait_for(lambda: events(caplog, "client_disconnected"))
    assert not [e for e in events(caplog) if e["level"] in ("ERROR", "CRITICAL")]
    assert open_streams(service) == 0


@pytest.mark.parametrize("path", PATHS)
async def test_shutdown_frame_after_half_an_event(make_service, raw_upstream, takeovers, path: str) -> None:
    upstream, server = await raw_upstream([HALF_EVENT, "hang"])
    service = await service_on(make_service, server, path, SHUTDOWN_DRAIN_SECONDS="0.1")
    response = await service.chat(chat_body(stream=True))
    assert await response.content.readany() == HALF_EVENT
    await service.app.shutdown()
    assert await response.read() == b"\n\n" + SHUTDOWN_FRAME
    assert_path_taken(path, takeovers)
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)


@pytest.mark.parametrize("path", PATHS)
async def test_silence_after_half_an_event_ends_with_a_framed_error(make_service, raw_upstream, takeovers, path: str, caplog) -> None:
    upstream, server = await raw_upstream([HALF_EVENT, "hang"])
    service = await service_on(make_service, server, path, STREAMING_TIMEOUT_SECONDS="0.3")
    response = await service.chat(chat_body(stream=True))
    # The upstream hangs for ever: only the silence watch can end the stream.
    assert await asyncio.wait_for(response.read(), timeout=10) == HALF_EVENT + b"\n\n" + GENERIC_502
    assert_path_taken(path, takeovers)
    failed = events(caplog, "upstream_stream_failed")
    assert len(failed) == 1 and failed[0]["error_type"] == "UpstreamSilent"
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cut_mid_event", [False, True])
async def test_upstream_cut_mid_stream_ends_with_a_framed_error(
    make_service, raw_upstream, takeovers, path: str, cut_mid_event: bool, caplog
) -> None:
    relayed = HALF_EVENT if cut_mid_event else event(0) + event(1)
    upstream, server = await raw_upstream([relayed, "cut"])
    service = await service_on(make_service, server, path)
    response = await service.chat(chat_body(stream=True))
    expected = relayed + (b"\n\n" if cut_mid_event else b"") + GENERIC_502
    assert await response.read() == expected
    assert_path_taken(path, takeovers)
    failed = events(caplog, "upstream_stream_failed")
    assert len(failed) == 1 and failed[0]["level"] == "ERROR"
    assert open_streams(service) == 0


@pytest.mark.parametrize("path", PATHS)
async def test_upstream_connection_is_pooled_after_a_clean_stream(make_service, raw_upstream, takeovers, path: str) -> None:
    """A finished stream leaves its upstream connection reading and reusable."""
    upstream, server = await raw_upstream([event(0), 0.02, event(1)])
    service = await service_on(make_service, server, path)
    for _ in range(3):
        response = await service.chat(chat_body(stream=True))
        assert await asyncio.wait_for(response.read(), 5) == event(0) + event(1)
    assert_path_taken(path, takeovers, streams=3)
    assert len(upstream.peer_ports) == 3
    assert len(set(upstream.peer_ports)) == 1, upstream.peer_ports
