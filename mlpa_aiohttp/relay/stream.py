"""The SSE relay: LiteLLM's stream to the client, byte for byte, as it arrives.

Client disconnect is not polled for: the app runs with `handler_cancellation`, so the
transport's connection-lost callback cancels this handler at whatever it awaits, and
leaving `client.completion(...)` releases the half-read upstream response, which closes
that upstream connection. While a stream is idle nothing here runs at all.

Per read, the loop does one write and one `StreamAccountant.feed`; it creates no task,
arms no timer and decodes no JSON unless the bytes can carry usage or tool calls.

Which side failed is decided by where, not by the exception's type: a write towards the
client that fails means the client is gone. Under load a client's transport can already be
closing while `connection_lost` (which would cancel this handler) has not run yet; the write
then raises aiohttp's `ClientConnectionResetError`, which is also an `aiohttp.ClientError`,
the upstream session's error type. `_pump` turns every failed client write into `ClientGone`
on the spot, so it can never be taken for an upstream fault.

With `fast_path` (RELAY_FAST_PATH), `_pump` hands the stream to relay/fast_path.py, which
relays from the upstream connection's callbacks; where that does not apply, this loop runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from ..errors import GENERIC_UPSTREAM_MESSAGE
from ..observability.metrics import Metrics
from ..observability.upstream_text import upstream_text_for_log
from ..upstream.bodies import UpstreamBody
from ..upstream.classify import classify, error_detail
from ..upstream.litellm import LiteLLMClient, read_error_body
from ..upstream.routing import RoutingInfo
from .disconnect import disconnect_reason
from .fast_path import ClientWriteFailed, FastRelay
from .keepalive import FirstByteKeepAlive
from .outcome import CompletionOutcome
from .sse import StreamAccountant
from .tracker import OpenStream, StreamTracker

log = structlog.get_logger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Tell nginx-style intermediaries not to buffer the stream.
    "X-Accel-Buffering": "no",
}


def sse_frame(payload: dict[str, Any]) -> bytes:
    # Python's default separators, as the reference's clients have always received.
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


SHUTDOWN_FRAME = sse_frame({"code": 503, "error": "Server shutting down"})


class ClientGone(Exception):
    """A write towards the client failed: the client is gone, whatever the error's type."""


class StreamRelay:
    """One streaming completion. `run()` returns the finished response."""

    # One of these lives as long as its stream, thousands at a time.
    __slots__ = (
        "_request", "_client", "_body", "_outcome", "_metrics", "_tracker", "_debug", "_started",
        "_response", "_upstream", "_task", "_handle", "_accountant", "_keepalive", "_fast_path",
    )

    def __init__(
        self,
        request: web.Request,
        *,
        client: LiteLLMClient,
        body: UpstreamBody,
        outcome: CompletionOutcome,
        metrics: Metrics,
        tracker: StreamTracker,
        debug: bool,
        started: float,
        keepalive: FirstByteKeepAlive | None = None,
        fast_path: bool = False,
    ) -> None:
        self._request = request
        self._client = client
        self._body = body
        self._outcome = outcome
        self._metrics = metrics
        self._tracker = tracker
        self._debug = debug
        self._started = started
        self._response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        self._upstream: aiohttp.ClientResponse | None = None
        self._task = asyncio.current_task()
        self._handle = OpenStream(self._end)
        self._accountant = StreamAccountant()
        # Set only for a stream that opted into keep-alive comments (relay/keepalive.py).
        self._keepalive = keepalive
        self._fast_path = fast_path

    def _end(self) -> None:
        """Shutdown or silence: closing the upstream wakes the read loop with a
        ClientConnectionError, so the stream can end with a final frame. Before upstream
        headers only cancelling the handler abandons the request at once; `run` then writes
        the shutdown frame itself."""
        if self._upstream is not None:
            self._upstream.close()
        elif self._task is not None:
            self._task.cancel()

    async def run(self) -> web.StreamResponse:
        self._tracker.add(self._handle)
        self._metrics.open_streams.inc()
        try:
            await self._response.prepare(self._request)
            if self._keepalive is not None:
                self._keepalive.start(self._response, self._request)
            await self._relay()
        except asyncio.CancelledError:
            if not self._handle.stopping:
                self._client_gone()
            elif not self._handle.upstream_open and self._response.prepared:
                # `_end` cancelled the wait for LiteLLM's headers: the client, still
                # connected, gets the same final frame as a stream past its headers.
                await self._end_for_shutdown()
            else:
                self._outcome.failed("server_shutdown")
            raise
        except ClientGone as gone:
            self._client_gone(gone.__cause__)
        except ConnectionError as exc:
            # The client's transport closed under a write before connection_lost ran.
            self._client_gone(exc)
        finally:
            if self._keepalive is not None:
                self._keepalive.stop(self._response)
            self._tracker.discard(self._handle)
            self._handle.detach()
            self._metrics.open_streams.dec()
            self._metrics.relayed_bytes.inc(self._handle.relayed)
        return self._response

    def _client_gone(self, error: BaseException | None = None) -> None:
        self._outcome.aborted(self._accountant)
        structlog.contextvars.bind_contextvars(
            client_disconnected=True, disconnect_reason=disconnect_reason(self._request, error)
        )

    async def _relay(self) -> None:
        if self._handle.stopping:
            # Started after shutdown began ending streams (`StreamTracker.add`): LiteLLM
            # is not asked at all, the stream ends at once.
            await self._end_for_shutdown()
            return
        try:
            async with self._client.completion(self._body, stream=True) as upstream:
                self._upstream = upstream
                self._handle.upstream_open = True
                if upstream.status >= 300:
                    await self._relay_upstream_error(upstream.status, await read_error_body(upstream))
                    return
                routing = RoutingInfo.from_headers(upstream.headers)
                if self._keepalive is not None:
                    await self._first_byte(upstream)
                await self._pump(upstream)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # An upstream error (client writes raise ClientGone, see `_pump`); if the client
            # is gone by now as well, its hang-up is what the stream ended with.
            if isinstance(exc, ConnectionError) and self._request.transport is None:
                self._client_gone()
                return
            await self._relay_failure(exc)
            return
        if self._handle.relayed == 0:
            log.error("upstream_empty_stream")
            self._outcome.failed("empty_response")
            await self._write(sse_frame({"code": 502, "error": GENERIC_UPSTREAM_MESSAGE}))
            return
        self._outcome.stream_finished(self._accountant, routing)
        await self._response.write_eof()

    async def _pump(self, upstream: aiohttp.ClientResponse) -> None:
        if self._fast_path:
            fast = FastRelay.take_over(
                upstream, self._request, self._response, self._handle, self._accountant, self._observe_ttft
            )
            if fast is not None:
                try:
                    await fast.run()
                except ClientWriteFailed as exc:  # towards the client: see the module docstring
                    raise ClientGone from exc
                return
        write, feed, handle = self._response.write, self._accountant.feed, self._handle
        async for chunk in upstream.content.iter_any():
            try:
                await write(chunk)
            except ConnectionError as exc:  # towards the client: see the module docstring
                raise ClientGone from exc
            if handle.relayed == 0:  # after the write: the client's first byte does not wait for metrics
                self._observe_ttft()
            handle.relayed += len(chunk)
            feed(chunk)

    def _observe_ttft(self) -> None:
        self._metrics.ttft.labels(self._outcome.model).observe(time.monotonic() - self._started)

    async def _first_byte(self, upstream: aiohttp.ClientResponse) -> None:
        """Keep-alive streams only: wait for the first upstream bytes, end the comments, then
        relay those bytes as `_pump` would; `_pump` carries on with the rest."""
        first = await upstream.content.readany()
        assert self._keepalive is not None
        self._keepalive.stop(self._response)  # synchronous: no comment after this point
        if not first:
            return
        try:
            await self._response.write(first)
        except ConnectionError as exc:  # towards the client: see the module docstring
            raise ClientGone from exc
        self._observe_ttft()
        self._handle.relayed += len(first)
        self._accountant.feed(first)

    async def _relay_upstream_error(self, status: int, text: str) -> None:
        classification = classify(status, text)
        if classification is not None:
            log.warning(classification.log_prefix, upstream_status=status, upstream_detail=upstream_text_for_log(error_detail(text)))
            self._outcome.rejected(classification)
            await self._write(sse_frame({"error": classification.code}))
            return
        detail = error_detail(text)
        log.error("upstream_error", upstream_status=status, upstream_detail=upstream_text_for_log(detail))
        self._outcome.failed()
        await self._write(sse_frame({"code": status, "error": detail if self._debug else GENERIC_UPSTREAM_MESSAGE}))

    async def _relay_failure(self, exc: BaseException) -> None:
        if self._handle.stopping:
            await self._end_for_shutdown()
            return
        if self._handle.timed_out:
            log.error("upstream_stream_failed", error_type="UpstreamSilent", relayed_bytes=self._handle.relayed)
        else:
            log.error(
                "upstream_stream_failed",
                error_type=type(exc).__name__,
                error=str(exc) or repr(exc),
                relayed_bytes=self._handle.relayed,
                exc_info=exc,
            )
        self._outcome.failed()
        prefix = b"\n\n" if self._accountant.has_partial_event else b""
        detail = f"{type(exc).__name__}: {exc}" if self._debug else GENERIC_UPSTREAM_MESSAGE
        await self._write(prefix + sse_frame({"code": 502, "error": detail}))

    async def _end_for_shutdown(self) -> None:
        self._outcome.failed("server_shutdown")
        # An upstream read may have ended mid-event: terminate it before our frame.
        prefix = b"\n\n" if self._accountant.has_partial_event else b""
        await self._write(prefix + SHUTDOWN_FRAME)

    async def _write(self, data: bytes) -> None:
        """Write a final frame; a client that is already gone is not an error."""
        if self._keepalive is not None:
            self._keepalive.stop(self._response)
        try:
            await self._response.write(data)
            await self._response.write_eof()
        except ConnectionError as exc:
            self._client_gone(exc)
