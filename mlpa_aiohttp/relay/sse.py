"""The SSE wire format, in one place: the relay's own frames (events, the shutdown event,
the repair of a partial event before them, the keep-alive bytes) and the usage and
tool-call accounting over a relayed byte stream (compatibility.md D2).

The relay forwards LiteLLM's bytes untouched; the frames below are the only bytes it writes
of its own. The accountant sees the same bytes, frames them into
complete SSE events (carrying a partial event across reads) and JSON-decodes only events
that can carry a usage object, tool calls or an in-band error. Everything else costs one
regex scan and one substring count of the bytes per read, all done in C.

Two figures beyond the reference's accounting (compatibility.md D36, D37):
- `error_payload`: the JSON of the first in-band `data: {"error": {...}}` event, the way
  LiteLLM reports a failure after its first byte under status 200 (docs/litellm-wire.md);
- `content_deltas`: how many events carried a non-empty `"content":"..."` delta, the fallback
  count of completion tokens when a client leaves before the usage chunk.
"""

from __future__ import annotations

import json
import re
from typing import Any

import structlog
from aiohttp import hdrs

from ..headers import ACCEL_BUFFERING

log = structlog.get_logger(__name__)

_EVENT_SEPARATOR = b"\n\n"

HEADERS = {
    hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8",
    hdrs.CACHE_CONTROL: "no-cache",
    ACCEL_BUFFERING: "no",
}

# Written while a stream waits for its first upstream byte (relay/keepalive.py): one empty
# line, which ends no event. Not an SSE comment: Firefox for Android's line reader JSON-decodes
# every non-empty line, so `: keep-alive` would end its answer (docs/clients.md).
KEEPALIVE_BYTES = b"\n"


def event(payload: dict[str, Any]) -> bytes:
    """One `data:` event. Python's default separators, as the reference's clients have
    always received."""
    return b"data: " + json.dumps(payload).encode() + _EVENT_SEPARATOR


SHUTDOWN_EVENT = event({"code": 503, "error": "Server shutting down"})


def after_relayed(accountant: StreamAccountant, frame: bytes) -> bytes:
    """`frame` as the relay's last write: an upstream read may have ended mid-event, and
    the event is terminated first so that `frame` parses as an event of its own."""
    return _EVENT_SEPARATOR + frame if accountant.has_partial_event else frame

# An event is worth decoding only if it carries a usage *object*, a tool-call *list* or an
# error *object*; OpenAI-style streams repeat `"usage": null` on every chunk. Message text
# cannot match: inside a JSON string every quote is escaped (`\"error\"`).
_INTERESTING = re.compile(rb'"(?:usage"\s*:\s*\{|tool_calls"\s*:\s*\[|error"\s*:\s*\{)')
# A content delta as LiteLLM encodes it (compact JSON); the first, empty one is the role chunk's.
_CONTENT = b'"content":"'
_EMPTY_CONTENT = b'"content":""'
# A single SSE event larger than this is not accounted (it is still relayed).
MAX_PENDING_BYTES = 1 << 20


class StreamAccountant:
    """Incremental accountant: feed() every relayed read, then read the totals."""

    __slots__ = (
        "prompt_tokens", "completion_tokens", "tool_names", "_pending", "usage_seen", "content_deltas", "error_payload",
        "total_tokens",
    )  # fmt: skip

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # LiteLLM's `total_tokens` when its usage chunk had one (traffic contracts count it).
        self.total_tokens = 0
        self.usage_seen = False
        self.content_deltas = 0
        # The first in-band error event's JSON text (LiteLLM's failure after the first byte).
        self.error_payload: str | None = None
        # Tool calls by index; the value is the first non-empty function name.
        self.tool_names: dict[int, str] = {}
        self._pending = b""

    @property
    def has_partial_event(self) -> bool:
        return bool(self._pending)

    def tool_names_in_order(self) -> tuple[str, ...]:
        return tuple(self.tool_names[index] for index in sorted(self.tool_names))

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(_EVENT_SEPARATOR)
        if end < 0:
            self._pending = data if len(data) <= MAX_PENDING_BYTES else b""
            return
        complete = data[:end]
        self._pending = data[end + len(_EVENT_SEPARATOR) :]
        deltas = complete.count(_CONTENT)
        if deltas:
            if not self.content_deltas:
                # Until the first token, an empty content is the role chunk's: not a token.
                # Past it, one count per read is all a stream pays.
                deltas -= complete.count(_EMPTY_CONTENT)
            self.content_deltas += deltas
        if _INTERESTING.search(complete) is None:
            return
        for event in complete.split(_EVENT_SEPARATOR):
            if _INTERESTING.search(event) is not None:
                self._inspect(event)

    def _inspect(self, event: bytes) -> None:
        payload = b"\n".join(
            line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
        )
        try:
            parsed = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            log.warning("sse_event_unparseable", size=len(event))
            return
        if isinstance(parsed, dict):
            self._account(parsed)
            if self.error_payload is None and isinstance(parsed.get("error"), dict):
                self.error_payload = payload.decode("utf-8", "replace")

    def _account(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage_seen = True
            self.prompt_tokens = _token_count(usage, "prompt_tokens")
            self.completion_tokens = _token_count(usage, "completion_tokens")
            total = usage.get("total_tokens")
            self.total_tokens = total if isinstance(total, int) and total > 0 else 0
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            self.add_tool_calls(tool_calls)

    def add_tool_calls(self, tool_calls: list[Any]) -> None:
        for call in tool_calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            if not isinstance(index, int):
                index = len(self.tool_names)
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if not self.tool_names.get(index):
                self.tool_names[index] = name if isinstance(name, str) else ""


def _token_count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    if isinstance(value, int) and value >= 0:
        return value
    log.warning("usage_field_missing", field=key)
    return 0
