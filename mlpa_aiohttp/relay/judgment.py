"""One judgment of an upstream error, logged once: LiteLLM's error answer is classified into
a code clients understand (`upstream/classify.py`'s rules) or kept as unclassified detail;
a failure to talk to LiteLLM at all is unclassified. The relays only render the verdict
(an SSE frame, a JSON error body) and hand it to `relay/ending.py` for the metrics.

Event names are literal strings, so a grep for an event finds where it is logged:
`upstream_error`, `completion_upstream_error`, `search_upstream_error` (unclassified
answers), `upstream_stream_failed`, `completion_proxy_failed`, `search_proxy_failed`
(LiteLLM not reached, or lost mid-answer), `upstream_empty_stream`, and each
classification's own message (`Budget limit exceeded`, ...).

A plain connection failure (refused, reset, a name that does not resolve, a connect or
read timeout, LiteLLM closing the connection) is logged as one line with its cause and no
traceback: it says what happened and where to look. Anything else keeps its traceback.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

import aiohttp
import structlog

from ..errors import Classification
from ..observability.upstream_text import upstream_text_for_log
from ..upstream.classify import classify, error_detail

log = structlog.get_logger(__name__)

# Which relay asks: the event names differ by relay (each literal below).
Relay = Literal["stream", "completion", "search"]

_UNCLASSIFIED_EVENTS: dict[Relay, str] = {
    "stream": "upstream_error",
    "completion": "completion_upstream_error",
    "search": "search_upstream_error",
}
_FAILED_EVENTS: dict[Relay, str] = {
    "stream": "upstream_stream_failed",
    "completion": "completion_proxy_failed",
    "search": "search_proxy_failed",
}

# Failures of the connection itself, not of anything this service or LiteLLM computed.
_CONNECTION_FAILURES = (aiohttp.ClientConnectionError, asyncio.TimeoutError, ConnectionError)


@dataclass(frozen=True, slots=True)
class Unclassified:
    """An upstream error clients get no code for. `status` is LiteLLM's, or 502 when it
    did not answer (`answered`); `detail` is what debug mode shows the client."""

    status: int
    detail: str
    answered: bool


def judge_response(status: int, text: str, *, relay: Relay, in_band: bool = False) -> Classification | Unclassified:
    """LiteLLM's error answer (`in_band`: an error event inside its 200 stream)."""
    detail = error_detail(text)
    extra = {"in_band": True} if in_band else {}
    classification = classify(status, text)
    if classification is not None:
        log.warning(
            classification.log_prefix, upstream_status=status, upstream_detail=upstream_text_for_log(detail), **extra
        )
        return classification
    log.error(_UNCLASSIFIED_EVENTS[relay], upstream_status=status, upstream_detail=upstream_text_for_log(detail), **extra)
    return Unclassified(status, detail, answered=True)


def judge_failure(
    exc: BaseException, *, relay: Relay, relayed_bytes: int | None = None, silent: bool = False
) -> Unclassified:
    """LiteLLM not reached, or its answer cut; `silent`: the silence watch ended the
    stream (the exception is only how the watch woke the relay)."""
    fields: dict[str, object] = {} if relayed_bytes is None else {"relayed_bytes": relayed_bytes}
    event = _FAILED_EVENTS[relay]
    if silent:
        log.error(event, error_type="UpstreamSilent", **fields)
    elif isinstance(exc, _CONNECTION_FAILURES):
        log.error(event, error_type=type(exc).__name__, error=str(exc) or repr(exc), cause=_root_cause(exc), **fields)
    else:
        log.error(event, error_type=type(exc).__name__, error=str(exc) or repr(exc), exc_info=exc, **fields)
    return Unclassified(502, f"{type(exc).__name__}: {exc}", answered=False)


def judge_empty_stream(detail: str) -> Unclassified:
    """LiteLLM's 200 stream ended without a byte."""
    log.error("upstream_empty_stream")
    return Unclassified(502, detail, answered=True)


def _root_cause(exc: BaseException) -> str:
    """The innermost error under aiohttp's wrappers (the socket's, usually), as text."""
    seen = 0
    inner: BaseException = exc
    while seen < 4:
        nested = getattr(inner, "os_error", None) or inner.__cause__
        if not isinstance(nested, BaseException) or nested is inner:
            break
        inner, seen = nested, seen + 1
    text = str(inner) or type(inner).__name__
    return f"{type(inner).__name__}: {text}" if inner is not exc else text
