"""Where request bytes become values: the wire contract's rules, in one place.

Every body, credential and identifier a client sends is turned into a value by one of
these functions, which refuse what the contract does not allow before anything else can
choke on it (a parser's recursion, a `str.encode`, PostgreSQL):

* JSON bodies: `decode_json`. A syntax error is the reference's 422 `json_invalid`; a body
  that is syntactically JSON but cannot be turned into values (nested deeper than
  `MAX_JSON_DEPTH`, not UTF-8, a number past the integer digit limit) is the reference's
  400 `{"detail": "There was an error parsing the body"}` (what FastAPI answers when its
  body parser raises anything but a JSON syntax error).
* Credentials (bearer tokens, JWT envelopes, keys): `is_credential_text`. Tokens are
  visible ASCII; anything else (obs-text bytes, controls) is refused as an invalid
  credential by the path that reads it, with that path's own 401.
* Header values that go into log lines: `loggable`.
* Identifiers that are issued, looked up or stored (user ids, base identities):
  `is_identifier` / `is_base_identity`. No control characters and no lone surrogates
  (PostgreSQL cannot store NUL, UTF-8 cannot carry a surrogate); a base identity also has
  no `:` (compatibility.md D15), which would break the `uid:service_type` namespace.

No `aiohttp.web` here: the callers raise the domain errors (`errors.py`).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from .errors import BadRequest

# Deeper than any real tool schema or response format, far below the interpreter's
# recursion limit, so every later walk over the value (re-encoding it upstream,
# sanitising strings) is safe too.
MAX_JSON_DEPTH = 128

BODY_UNPARSEABLE = "There was an error parsing the body"

_FORBIDDEN_IDENTIFIER_CATEGORIES = frozenset({"Cc", "Cs"})


class BodyUnparseable(BadRequest):
    """400 {"detail": "There was an error parsing the body"}."""

    def __init__(self) -> None:
        super().__init__(BODY_UNPARSEABLE)


class JsonSyntaxError(ValueError):
    """Not JSON at all; `position` is where the decoder gave up (the 422's `loc`)."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


def decode_json(raw: bytes) -> Any:
    """The JSON value of a request body.

    Raises `JsonSyntaxError` for text that is not JSON and `BodyUnparseable` for JSON the
    service will not hold as values (too deep, not UTF-8, an oversized integer).
    """
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(exc.pos) from None
    except (RecursionError, ValueError):
        # ValueError here: UnicodeDecodeError, or the int max-digits limit.
        raise BodyUnparseable() from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and nests_deeper_than(value, MAX_JSON_DEPTH):
        raise BodyUnparseable()
    return value


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays/objects nest more than `limit` deep. Level by level, without
    recursion, stopping at the limit: a few C-level list operations per level."""
    deeper = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):  # after n rounds, `deeper` holds the containers n + 1 deep
        level = [container for container in deeper if container]  # empty ones hold nothing
        if not level:
            return False
        children: list[Any] = []
        for item in level:
            children.extend(item.values() if type(item) is dict else item)
        deeper = [child for child in children if type(child) is dict or type(child) is list]
    return bool(deeper)


def is_credential_text(value: str) -> bool:
    """A token or key as sent on the wire: visible ASCII (and spaces) only."""
    return value.isascii() and value.isprintable()


def loggable(value: str) -> str:
    """A header value as it may go into a log line: unchanged when printable; otherwise
    escaped, so obs-text bytes (lone surrogates after aiohttp's decoding) and control
    characters can neither break the log writer's UTF-8 encoding nor forge terminal output."""
    if value.isprintable():
        return value
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in value)


def is_identifier(value: str) -> bool:
    """An id that can be issued, looked up and stored: non-empty, no control
    characters, no lone surrogates."""
    if not value:
        return False
    if value.isascii():
        return value.isprintable()
    return not any(unicodedata.category(char) in _FORBIDDEN_IDENTIFIER_CATEGORIES for char in value)


def is_base_identity(value: str) -> bool:
    """The part of a user id before `:service_type` (compatibility.md D15: no `:` inside)."""
    return ":" not in value and is_identifier(value)
