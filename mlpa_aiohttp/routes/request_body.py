"""Reading a request body that must not outlive its parsing.

`request.read()` caches the bytes on the request for as long as the request lives. For a
stream that is minutes, and a chat body (the whole conversation, page text for some
features) can be hundreds of KiB, held once more by every parsed and re-encoded copy. The
routes that relay read the body here, parse it, and let the bytes go.
"""

from __future__ import annotations

from aiohttp import web


async def read_body(request: web.Request) -> bytes:
    """The whole body, not cached on the request; over `client_max_size` (chunked
    uploads included) raises what `request.read()` would, so the 413 mapping is shared."""
    limit = request.client_max_size
    received = bytearray()
    async for chunk in request.content.iter_any():
        received += chunk
        if limit and len(received) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(received))
    return bytes(received)
