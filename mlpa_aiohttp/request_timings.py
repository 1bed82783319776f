"""The timing middleware (compatibility.md D50): the outermost of the application's own
middlewares (after overload shedding only), so `total` covers the log line, error mapping
and the size limit's 413 too.

Without `debug-timing: true` it only reads the header and calls the handler. With it, the
request carries a `RequestTimings` (`keys.REQUEST_TIMINGS`) the routes record their spans
in; a JSON 200 whose body is an object gains `spans` (re-encoded, Content-Length recomputed,
validators dropped) and is sent from here, so the log line's total runs to the final body
send; a stream adds its spans event itself (`relay/stream.py`, after `data: [DONE]`). Every
such request logs one INFO `Request timings`, whatever its status, also when it fails.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import structlog
from aiohttp import hdrs, web

from . import keys
from .observability.timing import HEADER, RequestTimings, json_with_spans, requested

log = structlog.get_logger("mlpa_aiohttp.request_timings")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A body rewritten no longer matches these.
_VALIDATORS = (hdrs.CONTENT_LENGTH, hdrs.ETAG, "Content-MD5", "Digest", "Content-Digest")


@web.middleware
async def request_timings(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not requested(request.headers.get(HEADER)):
        return await handler(request)
    timings = RequestTimings()
    request[keys.REQUEST_TIMINGS] = timings
    status = 500
    complete = False
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:
            if isinstance(response, web.Response):
                _add_spans(request, response, timings)
            # Sent here (aiohttp's own prepare and write_eof then do nothing more), so that the
            # logged total and `response_complete` cover the body's send.
            await response.prepare(request)
            await response.write_eof()
        complete = True
        return response
    finally:
        log.info(
            "Request timings",
            spans=timings.as_list(),
            method=request.method,
            path=request.path,
            status_code=status,
            response_complete=complete,
        )


def _add_spans(request: web.Request, response: web.Response, timings: RequestTimings) -> None:
    """Only a 200 JSON object sent whole and unencoded."""
    content_type = response.content_type
    body = response.body
    if (
        response.status != 200
        or request.method == hdrs.METH_HEAD
        or not (content_type == "application/json" or content_type.endswith("+json"))
        or not isinstance(body, (bytes, bytearray))
        or hdrs.CONTENT_ENCODING in response.headers
        or response.compression
    ):
        return
    rewritten = json_with_spans(bytes(body), timings)
    if rewritten is None:
        return
    for name in _VALIDATORS:
        response.headers.popall(name, None)
    response.body = rewritten
