"""Opt-in request timing spans (compatibility.md D48): what one request spent where.

A request that sends `debug-timing: true` (trimmed, any case) gets a `RequestTimings`
(`request_timings.py`, the middleware); the steps of the proxy routes time themselves with
`span(timings, NAME)`, which is a shared no-op context when the request did not ask, or
`await timed(timings, NAME, step)` around one awaited step, which is the step itself then, so
a request without the header pays one call per step and nothing per streamed event. The spans reach the client in a JSON 200 object's `spans` key, or in one more SSE
event after a stream's `data: [DONE]`, and the log in one INFO `Request timings` line.

A span is `{"name", "start_ms", "duration_ms"}`: milliseconds from the request's arrival at
the middleware, rounded to 2 decimals, on a monotonic clock. The list starts with `total`
(start 0), then the completed spans in the order they started.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

HEADER = "debug-timing"

# The spans the routes record (the reference's names).
TOTAL = "total"
AUTH = "auth"
TRAFFIC_CONTRACT = "traffic_contract"
DB = "db"
UPSTREAM = "upstream"

Clock = Callable[[], float]
T = TypeVar("T")

_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def requested(value: str | None) -> bool:
    """Whether a `debug-timing` header value turns the spans on: only `true`, trimmed, any case."""
    return value is not None and value.strip().lower() == "true"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class RequestTimings:
    """The spans of one request."""

    __slots__ = ("_clock", "_origin", "_spans")

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._origin = clock()
        self._spans: list[tuple[str, float, float]] = []

    def span(self, name: str) -> _Span:
        return _Span(self, name)

    async def timed(self, name: str, step: Awaitable[T]) -> T:
        with self.span(name):
            return await step

    def add(self, name: str, started: float, ended: float) -> None:
        self._spans.append((name, started, ended))

    def now(self) -> float:
        return self._clock()

    def as_list(self) -> list[dict[str, Any]]:
        """`total` (to now), then every completed span by start."""
        origin = self._origin
        spans = [{"name": TOTAL, "start_ms": 0.0, "duration_ms": _ms(self._clock() - origin)}]
        for name, started, ended in sorted(self._spans, key=lambda span: span[1]):
            spans.append({"name": name, "start_ms": _ms(started - origin), "duration_ms": _ms(ended - started)})
        return spans


class _Span:
    """Records its time on exit, an exit by exception included. Nested and repeated spans
    each record separately."""

    __slots__ = ("_name", "_started", "_timings")

    def __init__(self, timings: RequestTimings, name: str) -> None:
        self._timings = timings
        self._name = name
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = self._timings.now()

    def __exit__(self, *exc_info: object) -> None:
        self._timings.add(self._name, self._started, self._timings.now())


def span(timings: RequestTimings | None, name: str) -> AbstractContextManager[None]:
    """A span of `timings`, or the shared no-op when the request did not ask for spans."""
    return _NO_SPAN if timings is None else timings.span(name)


def timed(timings: RequestTimings | None, name: str, step: Awaitable[T]) -> Awaitable[T]:
    """`step` (one awaited step, e.g. a coroutine not yet started) in a span of `timings`, or
    `step` itself when the request did not ask for spans: no context manager, no coroutine
    of its own on the untimed path (a new stream's hot path, docs/performance.md)."""
    return step if timings is None else timings.timed(name, step)


# -- where the spans go -------------------------------------------------------------------


def json_with_spans(body: bytes, timings: RequestTimings) -> bytes | None:
    """A JSON object's bytes with a top-level `spans` added; None for anything else (an
    array, another value, bytes that are not JSON), which then passes unchanged."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    payload["spans"] = timings.as_list()
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate the body carried as an escape stays an escape.
        return json.dumps(payload, separators=(",", ":")).encode("ascii")


_DONE_EVENTS = (b"data: [DONE]", b"data:[DONE]")
# Enough to hold a blank line and `data: [DONE]` with CRLF line ends, and then some.
_TAIL_BYTES = 64


class StreamTail:
    """The last bytes of a relayed SSE stream, to tell whether its final event is `[DONE]`.
    Fed only for a stream that asked for spans (the regular relay's loop)."""

    __slots__ = ("_tail", "_whole")

    def __init__(self) -> None:
        self._tail = b""
        # Whether `_tail` still holds the stream from its first byte.
        self._whole = True

    def add(self, chunk: bytes) -> None:
        tail = self._tail + chunk
        if len(tail) > _TAIL_BYTES:
            tail = tail[-_TAIL_BYTES:]
            self._whole = False
        self._tail = tail

    def spans_event_separator(self) -> bytes | None:
        """What goes between the stream and a spans event (the newlines that end the final
        event), or None when the final event is not `data: [DONE]` (CRLF read as LF)."""
        text = self._tail.replace(b"\r\n", b"\n")
        event = text.rstrip(b"\n")
        trailing = len(text) - len(event)
        boundary = event.rfind(b"\n\n")
        if boundary >= 0:
            event = event[boundary + 2 :]
        elif not self._whole:
            return None  # the final event is longer than the tail: not `[DONE]`
        if event not in _DONE_EVENTS:
            return None
        return b"\n" * max(0, 2 - trailing)


def spans_event(timings: RequestTimings, separator: bytes = b"") -> bytes:
    """The SSE event carrying the spans, after `separator`."""
    data = json.dumps({"spans": timings.as_list()}, separators=(",", ":")).encode()
    return separator + b"data: " + data + b"\n\n"
