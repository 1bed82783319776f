"""Classification of LiteLLM error responses into the client-facing codes (compatibility.md §4.5).

Pure functions of (status, body text); first rule that matches wins. One departure from the
reference's wire, for what the real LiteLLM sends (docs/litellm-wire.md): a budget error is
recognised at any 4xx status, not only 400/429, since LiteLLM answers budget errors with
`budget_exceeded_status_code` (422 by default in 1.106.12, any status when set).

A provider's 429 that LiteLLM wrapped (`litellm.RateLimitError: ... <Provider>Exception - `)
answers what the reference answers, error 2 (its rule 1a sees rate-limit wording in the
`error` object): Firefox for Android shows "rate limited" only for 1 and 2, anything else
as a server error (docs/clients.md). Only operators see the finer distinction: availability
`rate_limited_upstream` and the "Upstream rate limit exceeded" log prefix. Error 5 stays for
the bare throttling bodies of the reference's rule 1b.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ..errors import (
    CODE_BUDGET_EXCEEDED,
    CODE_GLOBAL_BUDGET_EXCEEDED,
    CODE_INVALID_MODEL_NAME,
    CODE_INVALID_REQUEST,
    CODE_PAYLOAD_TOO_LARGE,
    CODE_RATE_LIMITED,
    CODE_UPSTREAM_RATE_LIMITED,
    GLOBAL_BUDGET_RETRY_AFTER_SECONDS,
    Classification,
)

# The reference's code 10 (1.0.39): the shared virtual key's own LiteLLM user is over its
# budget, so every request fails; a server-side condition, hence 500 and availability failure.
GLOBAL_BUDGET_EXCEEDED = Classification(
    status=500,
    code=CODE_GLOBAL_BUDGET_EXCEEDED,
    retry_after=GLOBAL_BUDGET_RETRY_AFTER_SECONDS,
    rejection_reason="global_budget_exceeded",
    availability_reason="global_budget_exceeded",
    log_prefix="Global budget limit exceeded",
)
# LiteLLM's words for it, matched in the raw body (`default_user_id` owns the shared key).
GLOBAL_BUDGET_MARKER = "ExceededBudget: User=default_user_id over budget"

BUDGET_EXCEEDED = Classification(
    status=429,
    code=CODE_BUDGET_EXCEEDED,
    retry_after=86400,
    rejection_reason="budget_exceeded",
    availability_reason="budget_exceeded",
    log_prefix="Budget limit exceeded",
)
RATE_LIMITED = Classification(
    status=429,
    code=CODE_RATE_LIMITED,
    retry_after=60,
    rejection_reason="rate_limited",
    availability_reason="rate_limited_platform",
    log_prefix="Rate limit exceeded",
)
# A provider's 429 wrapped by LiteLLM: error 2 on the wire, as the reference answers; the
# provider named for operators only.
PROVIDER_RATE_LIMITED = Classification(
    status=429,
    code=CODE_RATE_LIMITED,
    retry_after=60,
    rejection_reason="rate_limited",
    availability_reason="rate_limited_upstream",
    log_prefix="Upstream rate limit exceeded",
)
# The bare throttling bodies of the reference's rule 1b (no `error` object with rate wording).
UPSTREAM_RATE_LIMITED = Classification(
    status=429,
    code=CODE_UPSTREAM_RATE_LIMITED,
    retry_after=60,
    rejection_reason="rate_limited",
    availability_reason="rate_limited_upstream",
    log_prefix="Upstream rate limit exceeded",
)
CONTEXT_WINDOW_EXCEEDED = Classification(
    status=413,
    code=CODE_PAYLOAD_TOO_LARGE,
    retry_after=None,
    rejection_reason="payload_too_large",
    availability_reason="payload_too_large",
    log_prefix="Context window exceeded",
)
INVALID_MODEL_NAME = Classification(
    status=400,
    code=CODE_INVALID_MODEL_NAME,
    retry_after=None,
    rejection_reason="invalid_model_name",
    availability_reason="invalid_model_name",
    log_prefix="Invalid model name",
)
INVALID_REQUEST = Classification(
    status=400,
    code=CODE_INVALID_REQUEST,
    retry_after=None,
    rejection_reason="invalid_request",
    availability_reason="invalid_request",
    log_prefix="Invalid request",
)

# compatibility.md D8: rate-limit wording, not any substring "rate" ("generate", "moderate").
_RATE_LIMIT_WORDING = re.compile(r"rate[ _]?limit|\btpm\b|\brpm\b")
_CONTEXT_WINDOW_WORDING = ("contextwindowexceeded", "maximum context length", "context window exceeded", "context length")
_THROTTLING_MARKERS = ('litellm.ratelimiterror', '"status":"resource_exhausted"', '"type":"throttling_error"')
_INVALID_ARGUMENT = re.compile(r'"status"\s*:\s*"invalid_argument"', re.IGNORECASE)
# LiteLLM's wrapper around a provider's own 429: "litellm.RateLimitError: RateLimitError:
# OpenAIException - ...". LiteLLM's own limiters raise the same class but name no provider.
_WRAPPED_PROVIDER_RATE_LIMIT = re.compile(r"^litellm\.ratelimiterror:.*?\b[a-z0-9_]*exception - ", re.DOTALL)


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def classify(status: int, body: str) -> Classification | None:
    """The classification of an upstream error, or None when it is unclassified."""
    # compatibility.md D43: at any 4xx, as the budget rule below (LiteLLM's 422); before it.
    if 400 <= status < 500 and GLOBAL_BUDGET_MARKER in body:
        return GLOBAL_BUDGET_EXCEEDED
    parsed = _parse_json(body)
    if 400 <= status < 500 and "budget" in _error_text(parsed):
        return BUDGET_EXCEEDED
    if status in (400, 429):
        found = _rate_limit(parsed, body)
        if found is not None:
            return found
    lowered = body.lower()
    if status == 413 or any(marker in lowered for marker in _CONTEXT_WINDOW_WORDING):
        return CONTEXT_WINDOW_EXCEEDED
    if status == 400 and "invalid model name passed in" in lowered:
        return INVALID_MODEL_NAME
    if status == 400 and ("expected a valid json object" in lowered or _INVALID_ARGUMENT.search(body)):
        return INVALID_REQUEST
    return None


def _error_object(parsed: Any) -> dict[str, Any] | None:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return parsed["error"]
    return None


def _error_text(parsed: Any) -> str:
    """`"<error.type> <error.message>"` lowercased, or "" without an `error` object."""
    error = _error_object(parsed)
    if error is None:
        return ""
    return f"{error.get('type', '')} {error.get('message', '')}".lower()


def _rate_limit(parsed: Any, body: str) -> Classification | None:
    error = _error_object(parsed)
    if error is not None:
        message = str(error.get("message", "")).lower()
        if _WRAPPED_PROVIDER_RATE_LIMIT.search(message):
            return PROVIDER_RATE_LIMITED
        if _RATE_LIMIT_WORDING.search(_error_text(parsed)):
            return RATE_LIMITED
    if isinstance(parsed, dict) and (
        parsed.get("status") == "RESOURCE_EXHAUSTED" or parsed.get("type") == "throttling_error"
    ):
        return UPSTREAM_RATE_LIMITED
    squeezed = body.replace(" ", "").lower()
    if any(marker in squeezed for marker in _THROTTLING_MARKERS):
        return UPSTREAM_RATE_LIMITED
    return None


def in_band_status(payload: str) -> int:
    """The HTTP status LiteLLM would have answered for an in-band error event
    (`data: {"error": {..., "code": "429"}}`, sent once a 200 stream had started): its
    `error.code`, else 500. The event's JSON then classifies like a response body."""
    error = _error_object(_parse_json(payload))
    code = error.get("code") if error is not None else None
    if isinstance(code, (int, str)) and not isinstance(code, bool):
        try:
            status = int(code)
        except ValueError:
            return 500
        if 400 <= status < 600:
            return status
    return 500


def error_detail(body: str) -> str:
    """The most useful human text of an upstream error body (compatibility.md §4.6)."""
    parsed = _parse_json(body)
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        message = parsed["error"].get("message")
        if isinstance(message, str):
            return _unwrap_python_dict(message)
    return body


def _unwrap_python_dict(message: str) -> str:
    # LiteLLM sometimes embeds a provider error as a Python dict literal.
    if not message.startswith("{'error':"):
        return message
    try:
        inner = ast.literal_eval(message)
    except (ValueError, SyntaxError):
        return message
    if isinstance(inner, dict) and "error" in inner:
        return str(inner["error"])
    return message
