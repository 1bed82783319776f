"""The relay's fast path: upstream bytes reach the client from inside the upstream
connection's `data_received`, without waking the handler task per chunk.

Why: the regular relay (`StreamRelay._pump`) pays, per upstream read, a future set by the
`StreamReader`, a task step of the handler, `iter_any`'s bookkeeping and a `StreamWriter`
write. Here a read costs aiohttp's C parser (unchanged), one `read_nowait`, one
`writelines` on the client transport and the accountant's `feed`.

Design. Once LiteLLM's headers are in and the client's `StreamResponse` is prepared
(its headers are written at `prepare()`), a thin protocol (`_Tap`) is put on the
upstream transport in front of aiohttp's `ResponseHandler`. Each `data_received` is
handed to the `ResponseHandler` first (aiohttp still parses the chunked body, so its
parser state stays right), then the bytes it fed into the response's `StreamReader`
are taken out at once with `read_nowait` and written to the client transport, framed
as HTTP chunks when the response is chunked. The handler task only waits on one future,
resolved at the end of the body, on an upstream failure, when the client is gone, or
when the client's transport buffer is above `HIGH_WATER` (flow control: the upstream
transport's reading is paused, the task waits for the client's buffer to drop
below `LOW_WATER`, then reading resumes).

Invariants (each kept by the code below, and the streaming tests run on both paths):
* The tap is removed synchronously when the body ends, before anything else can run: the
  `StreamReader`'s end-of-file callback has already returned the connection to the pool,
  and the next request on it must meet aiohttp's own protocol. It is also removed on
  every other way out (`finally`).
* Exceptions are the regular relay's: the `StreamReader`'s own (ClientPayloadError,
  "Connection closed" after `StreamRelay._end` closed the upstream for shutdown or
  silence, ServerDisconnectedError) are raised from `relay()`, so `StreamRelay` frames
  them (shutdown frame, partial-event prefix, 502 frame) exactly as before. A client
  transport found closing raises ConnectionResetError, which `StreamRelay` reports as a
  client abort, never as an upstream failure.
* Client loss still cancels the handler (`handler_cancellation`): the cancellation lands
  on the one awaited future; the tap is removed and leaving `LiteLLMClient.completion`
  closes the half-read upstream connection, as before.
* The silence watch and the metrics see the same counters: `OpenStream.relayed` grows by
  each forwarded read, the first-write callback records TTFT after the first write, and
  the accountant is fed the same bytes in the same order.
* Nothing is buffered here: a read is forwarded or the stream has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from .sse import StreamAccountant
from .tracker import OpenStream

# Client transport buffer sizes for flow control: above HIGH_WATER the upstream stops
# being read until the client has taken the buffer below LOW_WATER (aiohttp's own
# StreamWriter drains at 64 KiB too).
HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024
_DRAIN_POLL_SECONDS = 0.005

_DONE = "done"
_DRAIN = "drain"


class _Pump:
    """Moves what the upstream StreamReader holds to the client transport."""

    __slots__ = (
        "_content", "_request", "_chunked", "_accountant", "_handle", "_on_first_write",
        "_waiter", "_pending", "_transport", "_inner", "_tap", "paused", "finished",
    )

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        request: web.BaseRequest,
        chunked: bool,
        accountant: StreamAccountant,
        handle: OpenStream,
        on_first_write: Callable[[], None],
    ) -> None:
        self._content = upstream.content
        self._request = request
        self._chunked = chunked
        self._accountant = accountant
        self._handle = handle
        self._on_first_write = on_first_write
        self._waiter: asyncio.Future[str] | None = None
        self._pending: tuple[str, BaseException | None] | None = None
        connection = upstream.connection
        self._transport: Any = connection.transport if connection is not None else None
        self._inner: Any = connection.protocol if connection is not None else None
        self._tap: _Tap | None = None
        self.paused = False
        self.finished = False

    # -- called from the upstream protocol's callbacks --------------------------------
    def drain_reader(self) -> None:
        if self.finished:
            return
        try:
            data = self._content.read_nowait(-1)
        except Exception as exc:  # the reader's own: the upstream failed or was closed
            self._finish(exc)
            return
        if data and not self._forward(data):
            return
        if self._content.is_eof():
            self._finish(None)

    def upstream_lost(self) -> None:
        self.drain_reader()
        if not self.finished:
            self._finish(aiohttp.ClientConnectionError("Connection closed"))

    def _forward(self, data: bytes) -> bool:
        client = self._request.transport
        if client is None or client.is_closing():
            self._finish(ConnectionResetError("client connection lost"))
            return False
        if self._chunked:
            client.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            client.write(data)
        handle = self._handle
        first = handle.relayed == 0
        handle.relayed += len(data)
        if first:  # after the write: the client's first byte does not wait for metrics
            self._on_first_write()
        self._accountant.feed(data)
        if not self.paused and self._inner is not None and client.get_write_buffer_size() > HIGH_WATER:
            self.paused = True
            # The transport itself, not the ResponseHandler: the StreamReader resumes a
            # paused ResponseHandler whenever it is read below its low-water mark.
            self._transport.pause_reading()
            self._settle(_DRAIN, None)
        return True

    def _finish(self, exc: BaseException | None) -> None:
        self.finished = True
        self.uninstall()  # synchronously: a finished body's connection is already pooled
        self._settle(_DONE, exc)

    def _settle(self, reason: str, exc: BaseException | None) -> None:
        """Resolve the handler's waiter, or keep the news until it waits again (the end
        of the body wins over a drain request)."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            if self._pending is None or reason == _DONE:
                self._pending = (reason, exc)
            return
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(reason)

    # -- the handler task's side ------------------------------------------------------
    def install(self) -> None:
        self._tap = _Tap(self._inner, self)
        self._transport.set_protocol(self._tap)

    def uninstall(self) -> None:
        tap, transport = self._tap, self._transport
        self._tap = None
        if tap is not None and transport.get_protocol() is tap:
            transport.set_protocol(self._inner)

    def arm(self) -> asyncio.Future[str]:
        self._waiter = asyncio.get_running_loop().create_future()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._settle(*pending)
        return self._waiter

    def resume(self) -> None:
        self.paused = False
        if not self.finished:
            self._transport.resume_reading()


class _Tap(asyncio.Protocol):
    """Stands in front of aiohttp's ResponseHandler on the upstream transport."""

    __slots__ = ("_inner", "_pump")

    def __init__(self, inner: Any, pump: _Pump) -> None:
        self._inner = inner
        self._pump = pump

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)
        self._pump.drain_reader()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)
        self._pump.upstream_lost()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


async def relay(
    upstream: aiohttp.ClientResponse,
    request: web.BaseRequest,
    response: web.StreamResponse,
    accountant: StreamAccountant,
    handle: OpenStream,
    on_first_write: Callable[[], None],
) -> None:
    """Relay the upstream body to the prepared client response; returns at its end."""
    chunked = response.headers.get("Transfer-Encoding", "").lower() == "chunked"
    pump = _Pump(upstream, request, chunked, accountant, handle, on_first_write)
    pump.drain_reader()  # bytes that arrived with the headers
    if not pump.finished and (pump._transport is None or pump._transport.is_closing()):
        pump.upstream_lost()  # closed under us: let the reader say why, as iter_any would
    try:
        if not pump.finished:
            pump.install()
        while True:
            reason = await pump.arm()
            if reason == _DONE:
                return
            await _client_drained(request)
            pump.resume()
    finally:
        pump.uninstall()


async def _client_drained(request: web.BaseRequest) -> None:
    """Wait until the client's transport buffer is below LOW_WATER (a slow reader)."""
    while True:
        client = request.transport
        if client is None or client.is_closing():
            raise ConnectionResetError("client connection lost")
        if client.get_write_buffer_size() <= LOW_WATER:
            return
        await asyncio.sleep(_DRAIN_POLL_SECONDS)
