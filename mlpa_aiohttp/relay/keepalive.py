"""Keep-alive comments while a stream waits for its first upstream byte (opt-in).

Some intermediaries cut a response that stays silent for 30-60 s, and a reasoning model can
take longer to its first token. A stream that opted in gets an SSE comment line every
`interval` seconds until its first upstream byte; every SSE parser ignores comments, so the
events a client sees do not change. Then the relay writes nothing of its own.

One app-wide task looks at the waiting streams a few times per interval, as the silence
watch does: no per-stream timer, and streams that did not opt in are never in the set.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from ..observability.metrics import Metrics
from .sse import KEEPALIVE_COMMENT
from .tracker import tick_seconds

# How often the tick looks, as a share of the interval: a comment is at most a quarter
# interval late.
_TICK_SHARE = 0.25


class FirstByteKeepAlive:
    def __init__(self, interval: float, metrics: Metrics) -> None:
        self.interval = interval
        self._metrics = metrics
        # response -> (its request, when its next comment is due)
        self._waiting: dict[web.StreamResponse, tuple[web.BaseRequest, float]] = {}

    def start(self, response: web.StreamResponse, request: web.BaseRequest) -> None:
        """`response` is prepared; comments start one interval from now."""
        self._waiting[response] = (request, time.monotonic() + self.interval)

    def stop(self, response: web.StreamResponse) -> None:
        """Synchronous, so the relay calls it right before its own first write: no comment
        can follow a byte the relay wrote."""
        self._waiting.pop(response, None)

    async def run(self) -> None:
        """Run until cancelled."""
        tick = tick_seconds(self.interval, _TICK_SHARE)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for response, (request, due) in list(self._waiting.items()):
                if due > now or response not in self._waiting:
                    continue
                self._waiting[response] = (request, now + self.interval)
                await self._send(response, request)

    async def _send(self, response: web.StreamResponse, request: web.BaseRequest) -> None:
        transport = request.transport
        # Bytes still queued towards this client: it is not reading, and a comment would
        # not help. Skipping also means the write below never waits for a drain, so one
        # stalled client cannot hold up the others' comments.
        if transport is None or transport.is_closing() or transport.get_write_buffer_size():
            return
        try:
            await response.write(KEEPALIVE_COMMENT)
        except (ConnectionError, RuntimeError):
            # The client left (its handler's cancellation reports that) or the response
            # just ended; either way there is nothing to keep alive.
            self._waiting.pop(response, None)
            return
        self._metrics.stream_keepalives.inc()
