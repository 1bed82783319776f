"""The relay's fast path: upstream body bytes go to the client transport from inside the
upstream connection's `data_received`, with no task wake-up, no `StreamReader` wait and no
`StreamWriter` per chunk. It is on by default (`RELAY_FAST_PATH=false` turns it off);
`StreamRelay._pump` falls back to the regular relay whenever `FastRelay.take_over` declines
(see "When it applies"), and the whole module stays unused when `usable()` says no at start.

How it works
------------
aiohttp parses the upstream response (its C parser keeps the chunked-decoding state and the
connection stays poolable); the parser hands each decoded body piece to the response's
`StreamReader` by calling `feed_data`. Once LiteLLM's headers are in and the client's
response is prepared, that reader's class is switched to `_RelaySink`, which has the same
layout and, instead of buffering, calls this relay: frame the piece as one HTTP chunk, one
`transport.write` to the client, then the per-chunk bookkeeping every relay does
(relay/delivery.py: TTFT on the first byte, the byte counter, the SSE accountant). The handler task sleeps on one future
for the whole stream and wakes only to drain the client, or when the stream ends.

Invariants
----------
1. One owner of the upstream transport's reading state. From the take-over on, the relay is
   the only caller of the upstream `ResponseHandler`'s `pause_reading`/`resume_reading`
   (aiohttp's pair, so its flags, its parser's pause and the transport always agree): the
   sink's `_protocol` slot points at this relay, whose reader-facing `pause_reading` and
   `resume_reading` do nothing, so aiohttp's reader-side flow control is out of the game.
   The state inherited at take-over (aiohttp may already have paused reading because its
   buffer was high, with the parser holding a tail) is normalised explicitly: bytes already
   buffered are taken, then `resume_reading()` is called once, which hands the parser's
   tail to the sink and reads on. Only then can the relay pause.
2. One owner of "client buffer high → pause upstream, drained → resume": the relay. After a
   write, if the client's protocol reports `writing_paused`, the sink pauses upstream
   reading and wakes the handler, which awaits the client writer's `drain()` and resumes.
   A pause that happens inside that resume (the parser's tail refilled the client buffer)
   is seen by the same loop. Nothing more reaches the client transport after a pause: the
   parser stops after the piece that crossed the mark and keeps the rest of that upstream
   read as its tail until the resume.
3. Upstream reading is never left paused when the connection can return to the pool: the
   parser is paused before a body piece completes the message, so `feed_eof` (which
   releases the connection) cannot run while the relay holds a pause, except on a
   connection that is being lost anyway.
4. Everything the regular relay guarantees still holds, by the same mechanisms:
   - client loss cancels the handler at its one await (`handler_cancellation`); leaving
     `completion()` releases the half-read response, which closes the upstream at once;
   - shutdown and the silence watch close the upstream response: aiohttp sets the reader's
     exception, the sink passes it to the handler, which raises it, and `StreamRelay` writes
     the final frame as before (with the partial-event prefix the accountant knows about);
   - an upstream failure mid-stream arrives the same way (`set_exception` on the reader);
   - a failed client write (transport closing before `connection_lost` ran) becomes
     `ClientWriteFailed`, as on the regular path;
   - stale-connection retry happens before the headers, before any take-over;
   - the client response stays chunked; final frames and `write_eof` go through aiohttp's
     writer, whose `output_size` gets the bytes written here (the access log's size).
5. The take-over ends when `run()` returns or raises: the reader is a plain `StreamReader`
   pointing at its protocol again, so anything after (release, close) is aiohttp's alone.

When it applies
---------------
HTTP/1.1 chunked response to the client, no compression either way, an upstream reader that
is a plain `StreamReader` neither at EOF nor failed, and both transports open. Anything else
(an HTTP/1.0 client, a compressed upstream body, a reader aiohttp already finished) takes
the regular relay. It relies on aiohttp internals that are not public API (the parser
calling `feed_data` on the response's reader; the reader's `_protocol` slot; the table in
docs/architecture.md), so `usable()` checks once at start that the running aiohttp is one
it was tested on (process/aiohttp_internals.py) and has what it uses; otherwise the regular relay
serves every stream. Nothing private is imported at import time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.streams import StreamReader

from ..process.aiohttp_internals import fence, missing_attributes
from .delivery import ClientWriteFailed, Delivery


def usable(*, version: str | None = None, reader_class: type = StreamReader) -> bool:
    """Once at start: whether this aiohttp is one the fast path was tested on and has what
    it uses (`version` and `reader_class` stand in for the running aiohttp's in tests)."""
    from aiohttp import client_proto, http_writer, web_protocol

    missing = [
        *missing_attributes(
            reader_class,
            ("_protocol", "feed_data", "feed_eof", "set_exception", "read_nowait", "is_eof", "exception",
             "begin_http_chunk_receiving", "end_http_chunk_receiving"),
        ),
        *missing_attributes(client_proto.ResponseHandler, ("pause_reading", "resume_reading", "connected")),
        *missing_attributes(web_protocol.RequestHandler, ("writing_paused",)),
        *missing_attributes(http_writer.StreamWriter, ("send_headers", "drain", "output_size", "chunked")),
    ]  # fmt: skip
    return fence("relay fast path", missing, version=version)


class _RelaySink(StreamReader):
    """The upstream response's reader while the fast path owns it; `_protocol` is the relay."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        if data:
            self._protocol.relay(data)  # type: ignore[attr-defined]
        # Nothing is buffered here, so the parser never has more data waiting on us.
        return False

    def begin_http_chunk_receiving(self) -> None:
        pass

    def end_http_chunk_receiving(self) -> None:
        pass

    def feed_eof(self) -> None:
        self._protocol.upstream_ended()  # type: ignore[attr-defined]
        # Flags and end-of-file callbacks: aiohttp returns the connection to its pool.
        StreamReader.feed_eof(self)

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        # Whatever else aiohttp passes (its cause sentinel) goes through untouched.
        StreamReader.set_exception(self, exc, *args, **kwargs)
        self._protocol.upstream_failed(exc)  # type: ignore[attr-defined]


class FastRelay:
    """One stream's fast path; built by `take_over`, driven by `run()`."""

    __slots__ = (
        "_reader", "_upstream_protocol", "_client_transport", "_client_protocol", "_writer", "_delivered",
        "_written", "_paused", "_taking_over", "_pending", "_ended",
        "_failure", "_wake", "_loop",
    )  # fmt: skip

    def __init__(
        self,
        reader: StreamReader,
        upstream_protocol: aiohttp.client_proto.ResponseHandler,
        request: web.Request,
        client_transport: asyncio.Transport,
        delivery: Delivery,
    ) -> None:
        self._reader = reader
        self._upstream_protocol = upstream_protocol
        self._client_transport = client_transport
        self._client_protocol = request.protocol
        self._writer = request.writer
        self._delivered = delivery.delivered
        self._written = 0
        self._paused = False
        self._taking_over = True
        self._pending: list[bytes] = []
        self._ended = False
        self._failure: BaseException | None = None
        self._wake: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()

    @classmethod
    def take_over(
        cls,
        upstream: aiohttp.ClientResponse,
        request: web.Request,
        response: web.StreamResponse,
        delivery: Delivery,
    ) -> FastRelay | None:
        """The relay for this stream, or None when the fast path does not apply (the caller
        then runs the regular relay on an untouched response)."""
        reader = upstream.content
        connection = upstream.connection
        transport = request.transport
        if (
            type(reader) is not StreamReader
            or reader.is_eof()
            or reader.exception() is not None
            or aiohttp.hdrs.CONTENT_ENCODING in upstream.headers
            or connection is None
            or connection.protocol is None
            or connection.transport is None
            or transport is None
            or transport.is_closing()
            or not getattr(request.writer, "chunked", False)  # prepare() chose chunked framing
            or response.compression
            or getattr(request.writer, "on_body_write", None) is not None
        ):
            return None
        relay = cls(reader, connection.protocol, request, transport, delivery)
        relay._start()
        return relay

    def _start(self) -> None:
        """Invariant 1: take the reader, then normalise the upstream reading state."""
        reader = self._reader
        reader._protocol = self  # type: ignore[assignment]  # the sink calls back into the relay
        reader.__class__ = _RelaySink
        # Buffered before the take-over; the reader's resume call lands on our no-op.
        buffered = StreamReader.read_nowait(reader, -1)
        if buffered:
            self._pending.append(buffered)
        # Whatever aiohttp's reader did, reading is on after this and the parser's tail (if
        # it was paused) went through the sink into `_pending`, after the buffered bytes.
        self._upstream_protocol.resume_reading()
        self._taking_over = False
        self._writer.send_headers()  # headers may still be buffered by prepare()
        if self._pending:
            pending, self._pending = b"".join(self._pending), []
            self.relay(pending)

    # -- the reader's view of its protocol (invariant 1: none of these act) -------------
    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass

    @property
    def connected(self) -> bool:
        return self._upstream_protocol.connected

    # -- called by the sink from the upstream parser -------------------------------------
    def relay(self, data: bytes) -> None:
        if self._taking_over:
            self._pending.append(data)
            return
        if self._failure is not None:
            return  # the handler is on its way out and will close the upstream
        transport = self._client_transport
        if transport.is_closing():
            # The client is gone before `connection_lost` cancelled the handler.
            self._fail(ConnectionResetError("Cannot write to closing transport"), client=True)
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data)
        try:
            transport.write(framed)
        except (ConnectionError, RuntimeError) as exc:
            # Raised into the parser it would pass for an upstream fault: it is the client's.
            self._fail(exc, client=True)
            return
        self._written += len(framed)
        self._delivered(data)
        # Not after the upstream ended: there is nothing left to hold back (and no parser
        # payload to pause); the final write_eof drains what is buffered.
        if self._client_protocol.writing_paused and not self._paused and not self._ended:
            self._paused = True
            self._upstream_protocol.pause_reading()
            self._wakeup()

    def upstream_ended(self) -> None:
        self._end()

    def upstream_failed(self, exc: BaseException) -> None:
        self._fail(exc, client=False)

    # -- the handler's side ---------------------------------------------------------------
    async def run(self) -> None:
        """Sleep until the stream ends; drain the client whenever the sink paused upstream.
        Raises the upstream's error, or `ClientWriteFailed` for the client's."""
        try:
            while True:
                if self._failure is not None:
                    raise self._failure
                if self._ended:
                    return
                if self._paused:
                    try:
                        await self._writer.drain()
                    except ConnectionError as exc:
                        raise ClientWriteFailed(str(exc)) from exc
                    self._paused = False
                    # May relay the parser's tail, pause again or end the stream, synchronously.
                    self._upstream_protocol.resume_reading()
                    continue
                self._wake = self._loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
        finally:
            self._release()

    def _release(self) -> None:
        """Invariant 5: the reader is aiohttp's again; the writer counts what we wrote."""
        self._ended = True
        reader = self._reader
        reader.__class__ = StreamReader
        reader._protocol = self._upstream_protocol
        self._writer.output_size += self._written
        self._written = 0

    def _end(self) -> None:
        self._ended = True
        if self._paused:  # invariant 3: only on a connection being lost
            self._paused = False
            self._upstream_protocol.resume_reading(resume_parser=False)
        self._wakeup()

    def _fail(self, exc: BaseException, *, client: bool) -> None:
        if self._failure is not None or self._ended:
            return
        # Later body bytes are dropped (`relay`); the handler leaving `completion()` closes
        # the upstream, so nothing needs pausing here.
        self._failure = ClientWriteFailed(str(exc)) if client else exc
        self._wakeup()

    def _wakeup(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

