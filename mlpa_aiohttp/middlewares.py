"""Middlewares and response signals. Order (outermost first), and why:

0. With OVERLOAD_PROTECTION only, `overload.shed_when_overloaded`, before everything here
   (a shed request's log line would cost more than its 503; process/overload.py).
1. `request_timings` (compatibility.md D48): without `debug-timing: true` it only reads the
   header. With it, the request carries a `RequestTimings` (`keys.REQUEST_TIMINGS`) the routes
   record their spans in; a JSON 200 whose body is an object gains `spans` (re-encoded,
   Content-Length recomputed, validators dropped) and is sent from here, so the logged total
   runs to the final body send; a stream adds its spans event itself (`relay/stream.py`, after
   `data: [DONE]`). Every such request logs one INFO `Request timings`, whatever its status,
   also when it fails. Outermost of our own, so `total` covers the log line, error mapping and
   the 413s, as the reference's does.
2. `request_context` binds the log context, times the request and writes the one
   canonical log line, also for a cancelled handler (the client left: `client_disconnected`,
   499; shutdown ended it: `ended_by_shutdown`, 503; `relay/ending.request_line` says which,
   from the relay's ending on the request), and the request metrics of every completed
   response. Outside the handlers and error mapping, so it sees the final status of everything
   below, 413s and 404s included.
3. `error_mapping` turns domain errors and aiohttp's HTTP exceptions into the reference's
   JSON bodies; unhandled exceptions become a 500 JSON body, logged once with traceback.
   It also applies the Content-Length limit (compatibility.md D7) before any handler reads.

Security headers are added in `on_response_prepare`, so streamed responses get them too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import hdrs, web

from . import headers as header_names
from . import keys
from .errors import ApiError, PayloadTooLarge
from .fleet.traffic_contracts import UNCHECKED
from .observability import log_context
from .observability.labels import clamp_method, major_firefox_version
from .observability.timing import HEADER as TIMING_HEADER
from .observability.timing import RequestTimings, json_with_spans, requested
from .relay.ending import request_line

log = structlog.get_logger("mlpa_aiohttp.request")
_REQUEST_LINES = logging.getLogger("mlpa_aiohttp.request")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CHAT_PATH = "/v1/chat/completions"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def route_label(request: web.Request) -> str:
    """The matched route template; unmatched paths share one label (compatibility.md D9)."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


def _new_request_id() -> str:
    """32 random hex digits (the spelling of a uuid4's hex, without building a UUID object)."""
    return os.urandom(16).hex()


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    incoming_id = request.headers.get(header_names.REQUEST_ID, "")
    request_id = incoming_id if _REQUEST_ID.match(incoming_id) else _new_request_id()
    route = route_label(request)
    headers = request.headers
    log_context.begin(
        request_id=request_id,
        method=request.method,
        route=route,
        service_type=headers.get(header_names.SERVICE_TYPE, "N/A"),
        purpose=headers.get(header_names.PURPOSE, "").strip() or "-",  # the spelling the handlers use
        session_id=headers.get(header_names.SESSION_ID, "N/A"),
        user_agent=headers.get(hdrs.USER_AGENT, "N/A"),
    )
    metrics = request.app[keys.METRICS]
    metrics.in_progress.inc()
    started = time.monotonic()
    status = 500
    cancelled = False
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        elapsed = time.monotonic() - started
        metrics.in_progress.dec()
        method = clamp_method(request.method)
        if not cancelled:  # else no response was completed
            metrics.requests.labels(
                method,
                route,
                metrics.labels.service_type(headers.get(header_names.SERVICE_TYPE)),
                metrics.labels.purpose(headers.get(header_names.PURPOSE, "").strip()),
                major_firefox_version(headers.get(hdrs.USER_AGENT)),
                *request.get(keys.TRAFFIC_CONTRACT_MODES, UNCHECKED),
            ).inc()
            metrics.status_codes.labels(str(status)).inc()
            metrics.request_latency.labels(method, route).observe(elapsed)
        if _REQUEST_LINES.isEnabledFor(logging.INFO):  # else nothing below builds anything
            event, cancelled_status, ending_fields = request_line(request, cancelled=cancelled)
            if cancelled_status is not None:
                status = cancelled_status
            log.info(event, status=status, duration_ms=round(elapsed * 1000, 2), path=request.path, **ending_fields)
        # No clearing afterwards: aiohttp runs each request's handler in a task of its own,
        # whose copy of the context ends with it.


def _json_error(status: int, body: object, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def _too_large(request: web.Request) -> PayloadTooLarge:
    # compatibility.md D7: the chat route keeps the reference's bare body.
    return PayloadTooLarge(bare=request.path == CHAT_PATH)


@web.middleware
async def error_mapping(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        if request.method in _BODY_METHODS:
            limit = request.app[keys.SETTINGS].server.max_request_size_bytes
            length = request.content_length
            if length is not None and length > limit:
                raise _too_large(request)
        return await handler(request)
    except ApiError as error:
        if isinstance(error, PayloadTooLarge):
            _record_oversized(request)
        return _json_error(error.status, error.body(), dict(error.headers))
    except web.HTTPRequestEntityTooLarge:
        # aiohttp's client_max_size stopped a body (chunked uploads included).
        too_large = _too_large(request)
        _record_oversized(request)
        return _json_error(too_large.status, too_large.body())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json_error(exc.status, {"detail": exc.reason}, _allow_header(exc))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as exc:
        log.error("unhandled_error", error_type=type(exc).__name__, exc_info=exc)
        return _json_error(500, {"detail": "Internal Server Error"})


def _allow_header(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get(hdrs.ALLOW)
    return {hdrs.ALLOW: allow} if allow else {}


def _record_oversized(request: web.Request) -> None:
    log.warning("request_too_large", content_length=request.content_length)
    if request.path == CHAT_PATH:
        metrics = request.app[keys.METRICS]
        metrics.chat_availability(
            "payload_too_large",
            model=None,
            service_type=metrics.labels.service_type(request.headers.get(header_names.SERVICE_TYPE)),
            purpose=metrics.labels.purpose(request.headers.get(header_names.PURPOSE, "").strip()),
            # The same clamp as every other twin (the reference's choice here is not known).
            country=request.headers.get(header_names.GEO_COUNTRY),
        )


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: runs for JSON, error and streamed responses alike (compatibility.md §5.1)."""
    # `config_dict`, not `app`: for a sub-application's route (the admin API) `request.app`
    # is the sub-application by the time the response is prepared.
    server = request.config_dict[keys.SETTINGS].server
    if not server.security_headers_enabled:
        return
    response.headers[header_names.CONTENT_TYPE_OPTIONS] = "nosniff"
    if request.scheme == "https" or request.headers.get(hdrs.X_FORWARDED_PROTO) == "https":
        value = f"max-age={server.hsts_max_age}"
        if server.hsts_include_subdomains:
            value += "; includeSubDomains"
        response.headers[header_names.STRICT_TRANSPORT_SECURITY] = value


# -- timing spans (compatibility.md D48) -------------------------------------------------------

_TIMINGS_LOG = structlog.get_logger("mlpa_aiohttp.request_timings")


@web.middleware
def request_timings(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    """Not a coroutine itself: a request without the header is handed straight to the next
    layer, so it pays no coroutine, frame or cancellation unwinding of this one
    (docs/performance.md). aiohttp awaits whatever a middleware returns."""
    value = request.headers.get(TIMING_HEADER)
    if value is None or not requested(value):
        request[keys.REQUEST_TIMINGS] = None
        return handler(request)
    return _timed_request(request, handler)


async def _timed_request(request: web.Request, handler: Handler) -> web.StreamResponse:
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
        _TIMINGS_LOG.info(
            "Request timings",
            spans=timings.as_list(),
            method=request.method,
            path=request.path,
            status_code=status,
            response_complete=complete,
        )


# A body rewritten no longer matches these.
_VALIDATORS = (hdrs.CONTENT_LENGTH, hdrs.ETAG, "Content-MD5", "Digest", "Content-Digest")


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
