"""Non-streaming relays: a completion or a search, read whole and returned as JSON."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from ..errors import GENERIC_UPSTREAM_MESSAGE, ApiError, Classification, UpstreamError, UpstreamRejected
from ..observability.metrics import Metrics
from ..upstream.bodies import UpstreamBody, encode_json
from ..upstream.litellm import LiteLLMClient
from ..upstream.routing import RoutingInfo
from . import ending as endings
from .judgment import Unclassified, judge_failure, judge_response
from .outcome import CompletionOutcome, CountAfterUpstream, Usage

log = structlog.get_logger(__name__)

PROXY_FAILED_MESSAGE = "Failed to proxy request"
# The model of every search: LiteLLM's Exa search tool.
SEARCH_MODEL = "exa-search"
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ValueError)


def _json_response(payload: Any) -> web.Response:
    return web.Response(body=encode_json(payload), content_type="application/json")


def _error(verdict: Classification | Unclassified, *, debug: bool) -> ApiError:
    """The JSON answer to a judged upstream error (`relay/judgment.py`)."""
    if isinstance(verdict, Classification):
        return UpstreamRejected(verdict)
    if debug:
        return UpstreamError(verdict.detail, status=verdict.status)
    return UpstreamError(GENERIC_UPSTREAM_MESSAGE if verdict.answered else PROXY_FAILED_MESSAGE, status=verdict.status)


async def relay_completion(
    request: web.Request,
    *,
    client: LiteLLMClient,
    body: UpstreamBody,
    outcome: CompletionOutcome,
    debug: bool,
    virtual_key: str | None = None,
) -> web.Response:
    """The completion's JSON, or its error raised; either way its ending is recorded once
    (relay/ending.py). `virtual_key`: the client's own LiteLLM key, or None."""
    payload: Any = None
    try:
        async with client.completion(body, stream=False, virtual_key=virtual_key) as upstream:
            text = await upstream.text()
            status, headers = upstream.status, upstream.headers
            if 200 <= status < 300:
                payload = json.loads(text)
    except _TRANSPORT_ERRORS as exc:
        failure = judge_failure(exc, relay="completion")
        verdict: Classification | Unclassified = failure
        ending: endings.Ending = endings.UpstreamFailed(failure)
    except asyncio.CancelledError:
        endings.record(request, outcome, endings.of_cancellation(request))
        raise
    else:
        if 200 <= status < 300:
            ending = endings.Completed(_usage_of(payload), RoutingInfo.from_headers(headers))
        else:
            verdict = judge_response(status, text, relay="completion")
            outcome.upstream_answered(status, text, verdict)
            ending = endings.refused(verdict)
    endings.record(request, outcome, ending)
    if isinstance(ending, endings.Completed):
        return _json_response(payload)
    raise _error(verdict, debug=debug) from None


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
    return Usage(prompt, completion, _tool_names(message), _total_tokens(payload))


def _total_tokens(payload: Any) -> int:
    """The response's `usage.total_tokens`, 0 when absent (what traffic contracts count)."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and total > 0 else 0


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
    virtual_key: str | None = None,
    count_after_upstream: CountAfterUpstream | None = None,
) -> web.Response:
    started = time.monotonic()
    result = "error"
    total_tokens = 0
    try:
        try:
            reply = await client.search(body, virtual_key=virtual_key)
            if 200 <= reply.status < 300:
                payload = json.loads(reply.text)
                total_tokens = _total_tokens(payload)
        except _TRANSPORT_ERRORS as exc:
            raise _error(judge_failure(exc, relay="search"), debug=debug) from None
        if not 200 <= reply.status < 300:
            verdict = judge_response(reply.status, reply.text, relay="search")
            metrics.exa_error(
                SEARCH_MODEL, reply.status, reply.text, classified=isinstance(verdict, Classification)
            )
            if isinstance(verdict, Classification):
                metrics.search_rejections.labels(
                    verdict.rejection_reason, SEARCH_MODEL, metrics.labels.service_type(service_type), metrics.labels.purpose(purpose)
                ).inc()
            raise _error(verdict, debug=debug)
        result = "success"
        return _json_response(payload)
    except asyncio.CancelledError:
        result = "abort"
        raise
    finally:
        metrics.search_latency.labels(result).observe(time.monotonic() - started)
        if count_after_upstream is not None:
            count_after_upstream(total_tokens, None)
