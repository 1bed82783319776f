"""Classification of LiteLLM error responses into the client-facing codes (spec §4.5).

Pure functions of (status, body text); first rule that matches wins.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ..errors import (
    CODE_BUDGET_EXCEEDED,
    CODE_INVALID_MODEL_NAME,
    CODE_INVALID_REQUEST,
    CODE_PAYLOAD_TOO_LARGE,
    CODE_RATE_LIMITED,
    CODE_UPSTREAM_RATE_LIMITED,
    Classification,
)

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

# Decision 8: rate-limit wording, not any substring "rate" ("generate", "moderate").
_RATE_LIMIT_WORDING = re.compile(r"rate[ _]?limit|\btpm\b|\brpm\b")
_CONTEXT_WINDOW_WORDING = ("contextwindowexceeded", "maximum context length", "context window exceeded", "context length")
_THROTTLING_MARKERS = ('litellm.ratelimiterror', '"status":"resource_exhausted"', '"type":"throttling_error"')
_INVALID_ARGUMENT = re.compile(r'"status"\s*:\s*"invalid_argument"', re.IGNORECASE)


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def classify(status: int, body: str) -> Classification | None:
    """The classification of an upstream error, or None when it is unclassified."""
    parsed = _parse_json(body)
    if status in (400, 429):
        found = _budget_or_rate_limit(parsed, body)
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


def _budget_or_rate_limit(parsed: Any, body: str) -> Classification | None:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error = parsed["error"]
        text = f"{error.get('type', '')} {error.get('message', '')}".lower()
        if "budget" in text:
            return BUDGET_EXCEEDED
        if _RATE_LIMIT_WORDING.search(text):
            return RATE_LIMITED
    if isinstance(parsed, dict) and (
        parsed.get("status") == "RESOURCE_EXHAUSTED" or parsed.get("type") == "throttling_error"
    ):
        return UPSTREAM_RATE_LIMITED
    squeezed = body.replace(" ", "").lower()
    if any(marker in squeezed for marker in _THROTTLING_MARKERS):
        return UPSTREAM_RATE_LIMITED
    return None


def error_detail(body: str) -> str:
    """The most useful human text of an upstream error body (spec §4.6)."""
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
