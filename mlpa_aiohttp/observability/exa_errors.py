"""The labels of `mlpa_exa_errors_total` (the reference's Exa error counter, after 1.0.39):
which Exa-backed model failed, with which status and which of Exa's error tags.

Exa answers errors as `{"requestId": ..., "error": ..., "tag": ...}`; LiteLLM embeds that,
JSON-escaped, in its own `error.message`, so the tag is looked for in the raw body text,
escaped or not. Both labels are bounded: a tag outside `EXA_ERROR_STATUSES` is `other`
(Exa's tag set is open-ended), a tag-less error is `untagged`, and a status is its three
digits or `other`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

# The models served by Exa through LiteLLM; no other model records a sample.
EXA_MODELS = frozenset({"exa", "exa-search"})

# Exa's documented error tags, with the status Exa itself answers them with: a known tag's
# status replaces LiteLLM's (LiteLLM reports an overloaded Exa as its own 500).
EXA_ERROR_STATUSES: Mapping[str, str] = MappingProxyType(
    {
        "INVALID_REQUEST_BODY": "400",
        "INVALID_REQUEST": "400",
        "INVALID_URLS": "400",
        "INVALID_NUM_RESULTS": "400",
        "INVALID_JSON_SCHEMA": "400",
        "NUM_RESULTS_EXCEEDED": "400",
        "NO_CONTENT_FOUND": "400",
        "NO_MORE_CREDITS": "402",
        "API_KEY_BUDGET_EXCEEDED": "402",
        "ACCESS_DENIED": "403",
        "FEATURE_DISABLED": "403",
        "ROBOTS_FILTER_FAILED": "403",
        "PROHIBITED_CONTENT": "403",
        "RATE_LIMIT_EXCEEDED": "429",
        "SERVICE_OVERLOADED": "503",
    }
)
UNTAGGED = "untagged"
OTHER = "other"

# `"tag":"X"` or, inside LiteLLM's message, `\"tag\":\"X\"` (any depth of escaping).
_TAG = re.compile(r'\\*"tag\\*"\s*:\s*\\*"([^"\\]{1,64})\\*"')


def find_exa_tag(body: str) -> str | None:
    """The first Exa error tag in the raw upstream body, as written, or None."""
    match = _TAG.search(body)
    return match.group(1) if match else None


def exa_error_labels(model: str, status: int, body: str, *, classified: bool) -> tuple[str, str, str] | None:
    """(model, status_code, tag) of an upstream error answer, or None when it records
    nothing: a model Exa does not serve, or an error the classifier knows with no tag (those
    come from LiteLLM's side, a budget for example)."""
    if model not in EXA_MODELS:
        return None
    tag = find_exa_tag(body)
    if tag is None:
        if classified:
            return None
        return model, _status_label(status), UNTAGGED
    known_status = EXA_ERROR_STATUSES.get(tag)
    if known_status is None:
        return model, _status_label(status), OTHER
    return model, known_status, tag


def _status_label(status: int) -> str:
    return str(status) if 100 <= status <= 599 else OTHER
