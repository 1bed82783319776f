"""What tests read of the relay's in-process state, in one place: the package keeps no
method for tests alone, so these look at the objects' state directly."""

from __future__ import annotations

from aiohttp import web

from mlpa_aiohttp import keys


def streams_with_upstream_open(app: web.Application) -> int:
    """Open streams whose LiteLLM response headers have arrived."""
    return sum(stream.upstream_open for stream in app[keys.STREAMS]._streams)


def streams_waiting_for_keepalive(app: web.Application) -> int:
    """Streams the keep-alive tick still writes comments to."""
    return len(app[keys.STREAM_KEEPALIVE]._waiting)
