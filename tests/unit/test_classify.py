"""Upstream error classification (spec §4.5, decision 8)."""

from __future__ import annotations

import json

import pytest

from mlpa_aiohttp.upstream.classify import classify, error_detail

BUDGET = json.dumps({"error": {"type": "budget_exceeded", "message": "Budget has been exceeded! Current cost: 1"}})
RATE = json.dumps({"error": {"type": "rate_limit_error", "message": "Rate limit exceeded. TPM: 1000/500"}})


@pytest.mark.parametrize(
    "status,body,expected",
    [
        (400, BUDGET, (429, 1, 86400, "budget_exceeded")),
        (429, BUDGET, (429, 1, 86400, "budget_exceeded")),
        (429, RATE, (429, 2, 60, "rate_limited_platform")),
        (400, json.dumps({"error": {"type": "x", "message": "TPM limit reached"}}), (429, 2, 60, "rate_limited_platform")),
        (429, json.dumps({"status": "RESOURCE_EXHAUSTED", "type": "throttling_error"}), (429, 5, 60, "rate_limited_upstream")),
        (429, "litellm.RateLimitError: provider said slow down", (429, 5, 60, "rate_limited_upstream")),
        (400, "litellm.ContextWindowExceededError: maximum context length is 8192", (413, 3, None, "payload_too_large")),
        (500, "this prompt exceeds the context length", (413, 3, None, "payload_too_large")),
        (413, "too big", (413, 3, None, "payload_too_large")),
        (400, json.dumps({"error": "/chat/completions: Invalid model name passed in model=x"}), (400, 8, None, "invalid_model_name")),
        (400, json.dumps({"error": {"code": 400, "message": "Expected a valid JSON object", "status": "INVALID_ARGUMENT"}}), (400, 9, None, "invalid_request")),
        (400, '{"error": {"status" : "invalid_argument"}}', (400, 9, None, "invalid_request")),
    ],
)
def test_classified(status: int, body: str, expected: tuple) -> None:
    found = classify(status, body)
    assert found is not None
    assert (found.status, found.code, found.retry_after, found.availability_reason) == expected


@pytest.mark.parametrize(
    "status,body",
    [
        (400, json.dumps({"error": {"type": "invalid_request", "message": "Invalid request parameters"}})),
        # Decision 8: "generate" and "moderate" are not rate-limit wording.
        (400, json.dumps({"error": {"type": "invalid_request_error", "message": "Could not generate a moderate response"}})),
        (429, json.dumps({"error": {"type": "other", "message": "try later"}})),
        (429, "Too Many Requests"),
        (500, "Internal error"),
        (400, json.dumps({"error": "budget"})),  # non-object `error` is ignored
    ],
)
def test_unclassified(status: int, body: str) -> None:
    assert classify(status, body) is None


def test_error_detail_prefers_error_message_and_unwraps_python_dicts() -> None:
    assert error_detail(json.dumps({"error": {"message": "boom"}})) == "boom"
    assert error_detail(json.dumps({"error": {"message": "{'error': 'inner'}"}})) == "inner"
    assert error_detail("plain text") == "plain text"
