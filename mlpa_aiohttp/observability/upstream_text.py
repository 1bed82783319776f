"""Upstream (LiteLLM) error text made fit for a log line (compatibility.md D17).

LiteLLM's error messages can echo the request: a provider's validation error quotes the
offending `messages[0].content`, a pydantic error carries `'input': {...}`. The log keeps
what an operator needs (the error's kind and wording), never request content:

* the value of any content-bearing field (`content`, `input`, `messages`, `query`, ...),
  quoted or structured, is replaced and the rest of the text after a structured one dropped
  (its end cannot be found reliably in a truncated or Python-literal text);
* any other quoted string longer than `MAX_QUOTED_CHARS` is replaced (error messages
  quote field names and short values; long quoted text is someone's prompt);
* the result is cut to `MAX_LOGGED_CHARS`.

Clients still get the text unchanged with `MLPA_DEBUG=true`, as in the reference.
"""

from __future__ import annotations

import re

from .redaction import NEVER_LOGGED

MAX_LOGGED_CHARS = 300
MAX_QUOTED_CHARS = 40
REDACTED = "[redacted]"

# The names of redaction.py: in an echoed body they mark content, credentials or a raw body.
_CONTENT_KEYS = "|".join(re.escape(name) for name in sorted(NEVER_LOGGED, key=len, reverse=True))
# "key": "value" / 'key': 'value' / key='value' (a quoted value, escapes included).
_QUOTED_FIELD = re.compile(
    rf"""(?P<key>["']?\b(?:{_CONTENT_KEYS})\b["']?\s*[:=]\s*)(?P<q>["'])(?:\\.|(?!(?P=q)).)*(?P=q)""",
    re.IGNORECASE | re.DOTALL,
)
# "key": [ ... / "key": { ... : the structure and everything after it.
_STRUCTURED_FIELD = re.compile(
    rf"""(?P<key>["']?\b(?:{_CONTENT_KEYS})\b["']?\s*[:=]\s*)[\[{{(].*""",
    re.IGNORECASE | re.DOTALL,
)
_LONG_QUOTED = re.compile(rf"""(?P<q>["'])(?:\\.|(?!(?P=q)).){{{MAX_QUOTED_CHARS + 1},}}?(?P=q)""", re.DOTALL)


def upstream_text_for_log(text: str) -> str:
    """`text` without request content, at most MAX_LOGGED_CHARS (plus a length note)."""
    scrubbed = _QUOTED_FIELD.sub(lambda m: f"{m.group('key')}{m.group('q')}{REDACTED}{m.group('q')}", text)
    scrubbed = _STRUCTURED_FIELD.sub(lambda m: f"{m.group('key')}{REDACTED}", scrubbed)
    scrubbed = _LONG_QUOTED.sub(lambda m: f"{m.group('q')}{REDACTED}{m.group('q')}", scrubbed)
    if len(scrubbed) > MAX_LOGGED_CHARS:
        return f"{scrubbed[:MAX_LOGGED_CHARS]}... ({len(scrubbed)} chars)"
    return scrubbed
