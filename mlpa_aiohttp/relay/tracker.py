"""Open streams: shutdown drains them and ends the rest cleanly (compatibility.md D6), and one
app-wide watch ends streams whose upstream has gone silent for too long.

Why a watch instead of aiohttp's `sock_read` timeout: `sock_read` re-arms a timer on every
upstream read, a measurable share of the per-chunk cost. Here the relay only bumps a byte
counter per read, and one task looks at all streams every few seconds: no per-stream timer,
and an idle stream still costs nothing between looks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

# After the drain budget, streams get this long to write their final frame and end.
_FINAL_FRAME_GRACE_SECONDS = 1.0


# How often the silence watch looks, as a share of the timeout.
_WATCH_SHARE = 0.1
# Every app-wide periodic look (silence watch, keep-alive tick) is bounded both ways:
# often enough for short test intervals, never busier than this.
_TICK_MIN_SECONDS = 0.05
_TICK_MAX_SECONDS = 5.0


def tick_seconds(period: float, share: float) -> float:
    """How often an app-wide task looks at its streams: `share` of `period`, bounded."""
    return min(max(period * share, _TICK_MIN_SECONDS), _TICK_MAX_SECONDS)


def _ended() -> None:
    """`OpenStream`'s callback once its stream has ended: nothing left to end."""


class OpenStream:
    """One relayed stream. The relay counts `relayed` bytes and sets `upstream_open` once
    LiteLLM's headers arrived; `stop()` (shutdown) and `expire()` (silence) end it from
    outside through the relay's `end` callback."""

    __slots__ = ("_end", "stopping", "timed_out", "relayed", "upstream_open", "_seen", "_quiet_since")

    def __init__(self, end: Callable[[], None]) -> None:
        self._end = end
        self.stopping = False
        self.timed_out = False
        self.relayed = 0
        self.upstream_open = False
        self._seen = 0
        self._quiet_since = time.monotonic()

    def stop(self) -> None:
        self.stopping = True
        self._end()

    def expire(self) -> None:
        self.timed_out = True
        self._end()

    def detach(self) -> None:
        """The stream has ended: drop the relay's callback. It is a bound method of the
        relay, which holds this handle, so keeping it would leave every finished stream
        (request, response, upstream call) as a reference cycle that only the garbage
        collector frees (docs/performance.md)."""
        self._end = _ended

    def silent_for(self, now: float) -> float:
        if self.relayed != self._seen:
            self._seen, self._quiet_since = self.relayed, now
        return now - self._quiet_since


class StreamTracker:
    def __init__(self) -> None:
        self._streams: set[OpenStream] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.shutting_down = False
        # Set once shutdown's drain is over: a stream that starts from then on is ended at once.
        self._ending = False

    def add(self, stream: OpenStream) -> None:
        self._streams.add(stream)
        self._idle.clear()
        if self._ending:
            # Nothing to end yet: the relay sees `stopping` before it asks LiteLLM.
            stream.stopping = True

    def discard(self, stream: OpenStream) -> None:
        self._streams.discard(stream)
        if not self._streams:
            self._idle.set()

    def open_count(self) -> int:
        """How many streams are open now (the overload bound reads it)."""
        return len(self._streams)

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def watch_silence(self, timeout: float) -> None:
        """Run until cancelled: end streams whose upstream sent nothing for `timeout`
        seconds after its headers (before them, the relay's own deadline applies)."""
        interval = tick_seconds(timeout, _WATCH_SHARE)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for stream in list(self._streams):
                if not stream.upstream_open or stream.timed_out:
                    continue
                if stream.silent_for(now) >= timeout:
                    stream.expire()  # the relay logs it, once, as the stream's failure

    async def shutdown(self, drain_seconds: float) -> None:
        """Stop taking streams, let open ones finish within the budget, end the rest.

        A stream that starts while this drains is drained like the others; one that starts
        after the drain (the runner still serves the connections it has) ends at once with
        the shutdown frame, rather than running until the runner cancels it."""
        self.shutting_down = True
        if not self._streams:
            self._ending = True
            return
        log.info("shutdown_draining_streams", open_streams=len(self._streams), budget_seconds=drain_seconds)
        drained = await self.wait_idle(drain_seconds)
        self._ending = True
        if drained:
            return
        remaining = list(self._streams)
        log.warning("shutdown_ending_streams", open_streams=len(remaining))
        for stream in remaining:
            stream.stop()
        await self.wait_idle(_FINAL_FRAME_GRACE_SECONDS)
