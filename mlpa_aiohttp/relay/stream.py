"""The SSE relay: LiteLLM's stream to the client, byte for byte, as it arrives.

Client disconnect is not polled for: the app runs with `handler_cancellation`, so the
transport's connection-lost callback cancels this handler at whatever it awaits, and
leaving `client.completion(...)` releases the half-read upstream response, which closes
that upstream connection. While a stream is idle nothing here runs at all.

Per read, the loop does one write and the bookkeeping of relay/delivery.py; it creates no
task, arms no timer and decodes no JSON unless the bytes can carry usage or tool calls.

How the stream ended is decided once, in `_ending` (or from the cancellation, in `run`),
as one of relay/ending.py's values; `relay/ending.py` records it and names its final frame.
Which side failed is decided by where, not by the exception's type: a write towards the
client that fails raises `ClientWriteFailed` (relay/delivery.py), never an upstream error.

With a fast path (RELAY_FAST_PATH, checked at start by relay/fast_path.usable), `_pump`
hands the stream to it, which relays from the upstream connection's callbacks; where that
does not apply, this loop runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from ..errors import GENERIC_UPSTREAM_MESSAGE
from ..observability.metrics import Metrics
from ..observability.timing import UPSTREAM, RequestTimings, StreamTail, spans_event
from ..upstream.bodies import UpstreamBody
from ..upstream.classify import in_band_status
from ..upstream.litellm import LiteLLMClient, read_error_body
from ..upstream.routing import RoutingInfo
from . import ending as endings
from . import sse
from .delivery import Delivery
from .disconnect import disconnect_reason
from .judgment import judge_empty_stream, judge_failure, judge_response
from .keepalive import FirstByteKeepAlive
from .outcome import CompletionOutcome, Usage
from .tracker import OpenStream, StreamTracker

if TYPE_CHECKING:
    from .fast_path import FastRelay

# The fast path's entry (`FastRelay.take_over`), or None for the regular relay only.
TakeOver = Callable[[aiohttp.ClientResponse, web.Request, web.StreamResponse, Delivery], "FastRelay | None"] | None


class StreamRelay:
    """One streaming completion. `run()` returns the finished response."""

    # One of these lives as long as its stream, thousands at a time.
    __slots__ = (
        "_request", "_client", "_body", "_outcome", "_metrics", "_tracker", "_debug", "_started",
        "_response", "_upstream", "_task", "_handle", "_accountant", "_delivery", "_keepalive", "_fast_path",
        "_virtual_key", "_timings", "_tail",
    )  # fmt: skip

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
        fast_path: TakeOver = None,
        virtual_key: str | None = None,
        timings: RequestTimings | None = None,
    ) -> None:
        self._request = request
        # The client's own LiteLLM key (`litellm-virtual-key`), or None for the service's.
        self._virtual_key = virtual_key
        self._client = client
        self._body = body
        self._outcome = outcome
        self._metrics = metrics
        self._tracker = tracker
        self._debug = debug
        self._started = started
        self._response = web.StreamResponse(status=200, headers=sse.HEADERS)
        self._upstream: aiohttp.ClientResponse | None = None
        self._task = asyncio.current_task()
        self._handle = OpenStream(self._end)
        self._accountant = sse.StreamAccountant()
        # The TTFT observer must not hold `self`: a bound method here would be a reference
        # cycle (relay -> delivery -> relay) that only the cyclic collector frees.
        self._delivery = Delivery(self._handle, self._accountant, _ttft_observer(metrics, outcome, started))
        # Set only for a stream that opted into keep-alive lines (relay/keepalive.py).
        self._keepalive = keepalive
        self._fast_path = fast_path
        # Only for a stream that sent `debug-timing: true` (compatibility.md D48): its spans go
        # out after `data: [DONE]`, so the regular loop keeps the stream's last bytes.
        self._timings = timings
        self._tail = StreamTail() if timings is not None else None

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
            try:
                ending = await self._ending()
            except asyncio.CancelledError:
                if self._handle.stopping:
                    ending = endings.ShutDown()
                else:
                    ending = endings.of_cancellation(self._request, self._accountant)
                endings.record(self._request, self._outcome, ending, self._accountant)
                if isinstance(ending, endings.ShutDown) and not self._handle.upstream_open and self._response.prepared:
                    # `_end` cancelled the wait for LiteLLM's headers: the client, still
                    # connected, gets the same final frame as a stream past its headers.
                    await self._write_final(ending)
                raise
            endings.record(self._request, self._outcome, ending, self._accountant)
            await self._write_final(ending)
        finally:
            if self._keepalive is not None:
                self._keepalive.stop(self._response)
            self._tracker.discard(self._handle)
            self._handle.detach()
            self._metrics.open_streams.dec()
            self._metrics.relayed_bytes.inc(self._handle.relayed)
        return self._response

    async def _ending(self) -> endings.Ending:
        """Relay the stream; how it ended."""
        try:
            await self._response.prepare(self._request)
            if self._keepalive is not None:
                self._keepalive.start(self._response, self._request)
            if self._handle.stopping:
                # Started after shutdown began ending streams (`StreamTracker.add`): LiteLLM
                # is not asked at all, the stream ends at once.
                return endings.ShutDown()
            if self._timings is None:
                return await self._relay()
            with self._timings.span(UPSTREAM):
                return await self._relay()
        except ConnectionError as exc:
            # A write towards the client failed (`ClientWriteFailed`, or its transport
            # closed under `prepare` before connection_lost ran).
            return endings.ClientLeft(disconnect_reason(self._request, exc), self._accountant)

    async def _relay(self) -> endings.Ending:
        try:
            async with self._client.completion(self._body, stream=True, virtual_key=self._virtual_key) as upstream:
                self._upstream = upstream
                self._handle.upstream_open = True
                if upstream.status >= 300:
                    text = await read_error_body(upstream)
                    verdict = judge_response(upstream.status, text, relay="stream")
                    self._outcome.upstream_answered(upstream.status, text, verdict)
                    return endings.refused(verdict)
                routing = RoutingInfo.from_headers(upstream.headers)
                if self._keepalive is not None:
                    await self._first_byte(upstream)
                await self._pump(upstream)
        except (TimeoutError, aiohttp.ClientError) as exc:
            # An upstream error (client writes raise ClientWriteFailed); if the client is
            # gone by now as well, its hang-up is what the stream ended with.
            if isinstance(exc, ConnectionError) and self._request.transport is None:
                return endings.ClientLeft(disconnect_reason(self._request), self._accountant)
            if self._handle.stopping:
                return endings.ShutDown()
            relayed = self._handle.relayed
            if self._handle.timed_out:
                return endings.Silenced(judge_failure(exc, relay="stream", relayed_bytes=relayed, silent=True))
            return endings.UpstreamFailed(judge_failure(exc, relay="stream", relayed_bytes=relayed))
        accountant = self._accountant
        if self._handle.relayed == 0:
            return endings.UpstreamFailed(judge_empty_stream(GENERIC_UPSTREAM_MESSAGE), reason="empty_response")
        if accountant.error_payload is not None:
            # LiteLLM's failure inside its 200 stream: judged like the same error as a
            # response body; the client got the event as sent, the relay adds no frame.
            payload = accountant.error_payload
            return endings.refused(judge_response(in_band_status(payload), payload, relay="stream", in_band=True), in_band=True)
        usage = Usage(
            accountant.prompt_tokens, accountant.completion_tokens, accountant.tool_names_in_order(), accountant.total_tokens
        )
        return endings.Completed(usage, routing)

    async def _pump(self, upstream: aiohttp.ClientResponse) -> None:
        if self._fast_path is not None:
            fast = self._fast_path(upstream, self._request, self._response, self._delivery)
            if fast is not None:
                await fast.run()
                return
        write, response = self._delivery.write, self._response
        tail = self._tail
        if tail is not None:
            async for chunk in upstream.content.iter_any():
                await write(response, chunk)
                tail.add(chunk)
            return
        async for chunk in upstream.content.iter_any():
            await write(response, chunk)

    async def _first_byte(self, upstream: aiohttp.ClientResponse) -> None:
        """Keep-alive streams only: wait for the first upstream bytes, end the keep-alive lines, then
        relay those bytes as `_pump` would; `_pump` carries on with the rest."""
        first = await upstream.content.readany()
        assert self._keepalive is not None
        self._keepalive.stop(self._response)  # synchronous: no keep-alive line after this point
        if first:
            await self._delivery.write(self._response, first)
            if self._tail is not None:
                self._tail.add(first)

    async def _write_final(self, ending: endings.Ending) -> None:
        """The ending's final frame, if any, and the end of the response; a client that is
        already gone is not an error, and the ending stands."""
        if self._keepalive is not None:
            self._keepalive.stop(self._response)
        if isinstance(ending, endings.ClientLeft):
            return  # nothing to end towards a client that left
        frame = endings.final_frame(ending, debug=self._debug, relayed=self._accountant)
        if frame is None and self._timings is not None:
            frame = self._spans_event()
        try:
            if frame is not None:
                await self._response.write(frame)
            await self._response.write_eof()
        except ConnectionError:
            pass


    def _spans_event(self) -> bytes | None:
        """The spans event, for a stream whose final event was `data: [DONE]`."""
        assert self._timings is not None and self._tail is not None
        separator = self._tail.spans_event_separator()
        return None if separator is None else spans_event(self._timings, separator)



def _ttft_observer(metrics: Metrics, outcome: CompletionOutcome, started: float) -> Callable[[], None]:
    """What the stream's first relayed byte records: its time to first token (and its
    by-country twin)."""
    model, service_type, country = outcome.model, outcome.service_type, outcome.country

    def observe() -> None:
        metrics.chat_ttft(time.monotonic() - started, model=model, service_type=service_type, country=country)

    return observe
