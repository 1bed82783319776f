"""Non-streaming relays: a completion or a search, read whole and returned as JSON."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from ..errors import GENERIC_UPSTREAM_MESSAGE, UpstreamError, UpstreamRejected
from ..observability.metrics import Metrics
from ..observability.upstream_text import upstream_text_for_log
from ..upstream.bodies import UpstreamBody, encode_json
from ..upstream.classify import classify, error_detail
from ..upstream.litellm import LiteLLMClient
from ..upstream.routing import RoutingInfo
from .disconnect import client_hung_up
from .outcome import CompletionOutcome, Usage

log = structlog.get_logger(__name__)

PROXY_FAILED_MESSAGE = "Failed to proxy request"
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ValueError)


def _json_response(payload: Any) -> web.Response:
    return web.Response(body=encode_json(payload), content_type="application/json")


def _proxy_failed(exc: BaseException, *, debug: bool, what: str) -> UpstreamError:
    log.error(
        f"{what}_proxy_failed",
        error_type=type(exc).__name__,
        error=str(exc) or repr(exc),
        exc_info=exc,
    )
    return UpstreamError(f"{type(exc).__name__}: {exc}" if debug else PROXY_FAILED_MESSAGE)


def _unclassified(status: int, text: str, *, debug: bool, what: str) -> UpstreamError:
    detail = error_detail(text)
    log.error(f"{what}_upstream_error", upstream_status=status, upstream_detail=upstream_text_for_log(detail))
    return UpstreamError(detail if debug else GENERIC_UPSTREAM_MESSAGE, status=status)


async def relay_completion(
    request: web.Request, *, client: LiteLLMClient, body: UpstreamBody, outcome: CompletionOutcome, debug: bool
) -> web.Response:
    try:
        async with client.completion(body, stream=False) as upstream:
            text = await upstream.text()
            status, headers = upstream.status, upstream.headers
            if 200 <= status < 300:
                payload = json.loads(text)
    except _TRANSPORT_ERRORS as exc:
        outcome.failed()
        raise _proxy_failed(exc, debug=debug, what="completion") from None
    except asyncio.CancelledError:
        if client_hung_up(request):
            outcome.aborted()
        else:
            outcome.failed("server_shutdown")
        raise
    if not 200 <= status < 300:
        classification = classify(status, text)
        if classification is not None:
            log.warning(classification.log_prefix, upstream_status=status, upstream_detail=upstream_text_for_log(error_detail(text)))
            outcome.rejected(classification)
            raise UpstreamRejected(classification)
        outcome.failed()
        raise _unclassified(status, text, debug=debug, what="completion")
    outcome.succeeded(_usage_of(payload), RoutingInfo.from_headers(headers))
    return _json_response(payload)


def _usage_of(payload: Any) -> Usage:
    """Token counts and tool calls of a whole (non-streamed) completion."""
    if not isinstance(payload, dict):
        return Usage(0, 0)
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    counts = [usage.get(key) for key in ("prompt_tokens", "completion_tokens")]
    if not all(isinstance(count, int) for count in counts):
        log.warning("usage_field_missing")
    prompt, completion = (count if isinstance(count, int) else 0 for count in counts)
    choices = payload.get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    return Usage(prompt, completion, _tool_names(message))


def _tool_names(message: Any) -> tuple[str, ...]:
    """The function names of a whole message's tool calls, in order ("" when unnamed).

    Unlike a stream, a whole message lists each call once and complete: nothing to merge."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return ()
    names = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        names.append(name if isinstance(name, str) else "")
    return tuple(names)


async def relay_search(
    *,
    client: LiteLLMClient,
    body: bytes,
    metrics: Metrics,
    service_type: str,
    purpose: str,
    debug: bool,
) -> web.Response:
    started = time.monotonic()
    result = "error"
    try:
        try:
            reply = await client.search(body)
        except _TRANSPORT_ERRORS as exc:
            raise _proxy_failed(exc, debug=debug, what="search") from None
        if not 200 <= reply.status < 300:
            classification = classify(reply.status, reply.text)
            if classification is None:
                raise _unclassified(reply.status, reply.text, debug=debug, what="search")
            log.warning(classification.log_prefix, upstream_status=reply.status, upstream_detail=upstream_text_for_log(error_detail(reply.text)))
            metrics.search_rejections.labels(
                classification.rejection_reason, "exa-search", metrics.labels.service_type(service_type), metrics.labels.purpose(purpose)
            ).inc()
            raise UpstreamRejected(classification)
        try:
            payload = json.loads(reply.text)
        except ValueError as exc:
            raise _proxy_failed(exc, debug=debug, what="search") from None
        result = "success"
        return _json_response(payload)
    except asyncio.CancelledError:
        result = "abort"
        raise
    finally:
        metrics.search_latency.labels(result).observe(time.monotonic() - started)
