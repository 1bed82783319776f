"""Open streams, so shutdown can drain them and end the rest cleanly (decision 6)."""

from __future__ import annotations

import asyncio
from typing import Callable

import structlog

log = structlog.get_logger(__name__)

# After the drain budget, streams get this long to write their final frame and end.
_FINAL_FRAME_GRACE_SECONDS = 1.0


class OpenStream:
    """One relayed stream; `stop()` ends it from outside (shutdown)."""

    __slots__ = ("_stop", "stopping")

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self.stopping = False

    def stop(self) -> None:
        self.stopping = True
        self._stop()


class StreamTracker:
    def __init__(self) -> None:
        self._streams: set[OpenStream] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.shutting_down = False

    def __len__(self) -> int:
        return len(self._streams)

    def add(self, stream: OpenStream) -> None:
        self._streams.add(stream)
        self._idle.clear()

    def discard(self, stream: OpenStream) -> None:
        self._streams.discard(stream)
        if not self._streams:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def shutdown(self, drain_seconds: float) -> None:
        """Stop taking streams, let open ones finish within the budget, end the rest."""
        self.shutting_down = True
        if not self._streams:
            return
        log.info("shutdown_draining_streams", open_streams=len(self._streams), budget_seconds=drain_seconds)
        if await self.wait_idle(drain_seconds):
            return
        remaining = list(self._streams)
        log.warning("shutdown_ending_streams", open_streams=len(remaining))
        for stream in remaining:
            stream.stop()
        await self.wait_idle(_FINAL_FRAME_GRACE_SECONDS)
