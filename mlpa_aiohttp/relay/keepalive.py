"""Keep-alive bytes while a stream waits for its first upstream byte (opt-in).

Some intermediaries cut a response that stays silent for 30-60 s, and a reasoning model can
take longer to its first token. A stream that opted in gets `KEEPALIVE_BYTES` every
`interval` seconds until its first upstream byte. Then the relay writes nothing of its own.

The bytes are one empty line, not an SSE comment: Firefox for Android reads the stream line
by line, drops only empty lines (and `[DONE]`) and JSON-decodes every other line, so a
`: keep-alive` comment ends its answer with a parse error. An empty line is ignored by every
client checked (docs/clients.md): Android drops it, iOS's SSEDataParser trims the parts it
splits on blank lines and skips empty ones, and the OpenAI JS SDK (desktop) dispatches
nothing for an empty line that ends no event.

One app-wide task looks at the waiting streams a few times per interval, as the silence
watch does: no per-stream timer, and streams that did not opt in are never in the set.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from ..observability.metrics import Metrics
from .sse import KEEPALIVE_BYTES
from .tracker import tick_seconds

# How often the tick looks, as a share of the interval: keep-alive is at most a quarter
# interval late.
_TICK_SHARE = 0.25


class FirstByteKeepAlive:
    def __init__(self, interval: float, metrics: Metrics) -> None:
        self.interval = interval
        self._metrics = metrics
        # response -> (its request, when its next keep-alive is due)
        self._waiting: dict[web.StreamResponse, tuple[web.BaseRequest, float]] = {}

    def start(self, response: web.StreamResponse, request: web.BaseRequest) -> None:
        """`response` is prepared; keep-alive starts one interval from now."""
        self._waiting[response] = (request, time.monotonic() + self.interval)

    def stop(self, response: web.StreamResponse) -> None:
        """Synchronous, so the relay calls it right before its own first write: no keep-alive
        byte can follow a byte the relay wrote."""
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
        # Bytes still queued towards this client: it is not reading, and keep-alive would
        # not help. Skipping also means the write below never waits for a drain, so one
        # stalled client cannot hold up the others' keep-alive.
        if transport is None or transport.is_closing() or transport.get_write_buffer_size():
            return
        try:
            await response.write(KEEPALIVE_BYTES)
        except (ConnectionError, RuntimeError):
            # The client left (its handler's cancellation reports that) or the response
            # just ended; either way there is nothing to keep alive.
            self._waiting.pop(response, None)
            return
        self._metrics.stream_keepalives.inc()
