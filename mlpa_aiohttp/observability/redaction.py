"""The one list of names whose values leave the process through no sink (compatibility.md D17).

Every sink hides the value of these fields wherever the name appears as a key, at any depth
and in any letter case: the log processor (`logging.py`), Sentry's `before_send` and
`before_breadcrumb` (`sentry.py`), and the scrubber of LiteLLM's error text
(`upstream_text.py`), where the names appear as `"key": value` inside an echoed body.

* CONTENT_FIELDS carry what a user wrote or a model produced (chat messages, tool
  definitions and calls, search queries, prompts).
* CREDENTIAL_FIELDS carry secrets: credential headers in both spellings of the admin keys
  (compatibility.md D12), cookies, passwords, tokens a body may carry.
* RAW_BODY_FIELDS hold a whole request or response body. A sink that cannot take such a
  body apart hides it whole; Sentry, whose own event structure uses `data` for parsed
  bodies (the request's, a breadcrumb's), hides it whole only as text or bytes and scrubs a
  structure field by field.
"""

from __future__ import annotations

CONTENT_FIELDS = frozenset(
    {
        "messages",
        "message_content",
        "content",
        "text",
        "tools",
        # A tool call's content is its arguments; `tool_calls` is also the request line's count.
        "arguments",
        "query",
        "input",
        "user_input",
        "prompt",
        "system",
        "instructions",
    }
)

CREDENTIAL_FIELDS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-dev-authorization",
        "master_key",
        "master-key",
        "mlpa_ui_access_key",
        "mlpa-ui-access-key",
        "x-litellm-api-key",
        # A client's own LiteLLM key (MLPA 1.0.39), as a header and as a field name.
        "litellm-virtual-key",
        "litellm_virtual_key",
        "api_key",
        "cookie",
        "set-cookie",
        "password",
        "access_token",
        "integrity_token",
    }
)

# Hidden by every sink, by name.
SENSITIVE_FIELDS = CONTENT_FIELDS | CREDENTIAL_FIELDS

RAW_BODY_FIELDS = frozenset(
    {"body", "raw_body", "raw", "data", "json", "payload", "request_body", "response_body"}
)

# Hidden whole wherever a sink meets them, raw bodies included.
NEVER_LOGGED = SENSITIVE_FIELDS | RAW_BODY_FIELDS


def is_sensitive(name: object) -> bool:
    return isinstance(name, str) and name.lower() in SENSITIVE_FIELDS


def is_raw_body(name: object, value: object) -> bool:
    """A raw-body field whose value is still text or bytes (not a parsed structure)."""
    return isinstance(name, str) and name.lower() in RAW_BODY_FIELDS and isinstance(value, (str, bytes, bytearray))
