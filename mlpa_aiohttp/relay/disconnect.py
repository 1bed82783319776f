"""Why a client's connection ended, for the abort's log line.

aiohttp hands the transport's loss reason to the request when it cancels the handler (the
request body's reader gets it as its exception); a failed write carries its own. The kernel's
errno tells the kinds apart:

* `client_timeout`: ETIMEDOUT, the peer stopped answering (TCP keepalive probes or
  TCP_USER_TIMEOUT, see `mlpa_aiohttp.process.client_sockets`): a vanished client;
* `client_reset`: ECONNRESET / EPIPE, the client reset the connection;
* `client_closed`: an orderly close (FIN), or no reason known.
"""

from __future__ import annotations

import asyncio
import errno

from aiohttp import web

CLIENT_TIMEOUT = "client_timeout"
CLIENT_RESET = "client_reset"
CLIENT_CLOSED = "client_closed"

_BY_ERRNO = {
    errno.ETIMEDOUT: CLIENT_TIMEOUT,
    errno.ECONNRESET: CLIENT_RESET,
    errno.EPIPE: CLIENT_RESET,
}


def disconnect_reason(request: web.BaseRequest, error: BaseException | None = None) -> str:
    """The reason for `request`'s client being gone; `error` is a failed write's exception."""
    for candidate in (_loss_cause(request), error):
        # Follow the chain: aiohttp wraps the socket's OSError in its own exceptions.
        seen = 0
        while candidate is not None and seen < 4:
            reason = _BY_ERRNO.get(getattr(candidate, "errno", None) or -1)
            if reason is not None:
                return reason
            candidate = candidate.__cause__ or candidate.__context__
            seen += 1
    return CLIENT_CLOSED


def client_hung_up(request: web.BaseRequest) -> bool:
    """Whether the client's hang-up is what cancelled `request`'s handler.

    aiohttp's connection-lost callback drops the transport, and hands the loss to the request
    body's reader, before it cancels the handler. Every other cancellation is this server's,
    and only shutdown cancels: the drain deadline (the connection still open), or the runner
    at the end of its shutdown timeout, which hands the body's reader a CancelledError, then
    cancels the handler and closes the connection before the handler sees the cancellation.
    """
    if request.transport is not None:
        return False
    return not isinstance(_loss_cause(request), asyncio.CancelledError)


def _loss_cause(request: web.BaseRequest) -> BaseException | None:
    try:
        return request.content.exception()
    except Exception:  # noqa: BLE001 - a request without a body reader
        return None
