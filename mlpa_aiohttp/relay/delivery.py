"""What the relay does with every chunk it got to the client, in one place: the first
byte's TTFT, the byte count (the silence watch and `mlpa_relayed_bytes` read it) and the
accountant's feed. Both relays call `delivered` after their write: the regular relay's
`write` below, the fast path's own `transport.write` (relay/fast_path.py).

The accounting runs after the write: the client's byte does not wait for metrics, and what
the accountant saw is what was relayed (what an aborted stream cost).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from .sse import StreamAccountant
from .tracker import OpenStream


class ClientWriteFailed(ConnectionResetError):
    """A write towards the client failed: the client is gone, whatever the error's type.

    Under load a client's transport can already be closing while `connection_lost` (which
    would cancel the handler) has not run yet; aiohttp's write then raises its
    `ClientConnectionResetError`, which is also an `aiohttp.ClientError`, the upstream
    session's error type. Re-raised as this, it can never be taken for an upstream fault."""


class Delivery:
    __slots__ = ("_handle", "_feed", "_on_first_byte")

    def __init__(self, handle: OpenStream, accountant: StreamAccountant, on_first_byte: Callable[[], None]) -> None:
        self._handle = handle
        self._feed = accountant.feed
        self._on_first_byte = on_first_byte

    def delivered(self, chunk: bytes) -> None:
        """`chunk` was written to the client."""
        handle = self._handle
        if handle.relayed == 0:
            self._on_first_byte()
        handle.relayed += len(chunk)
        self._feed(chunk)

    async def write(self, response: web.StreamResponse, chunk: bytes) -> None:
        """The regular relay's write of one upstream chunk, then its bookkeeping."""
        try:
            await response.write(chunk)
        except ConnectionError as exc:
            raise ClientWriteFailed(str(exc)) from exc
        self.delivered(chunk)
