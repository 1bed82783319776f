"""Framed SSE accounting (compatibility.md D2): events split across reads still count."""

from __future__ import annotations

import json

from mlpa_aiohttp.relay.sse import StreamAccountant


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


USAGE = event({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 22, "total_tokens": 33}})
TOOLS = event(
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "search", "arguments": ""}}]}}]}
)
TOOLS_MORE = event({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"name": "fetch"}}]}}]})
CONTENT = event({"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None})


def feed_in_pieces(data: bytes, size: int) -> StreamAccountant:
    accountant = StreamAccountant()
    for start in range(0, len(data), size):
        accountant.feed(data[start : start + size])
    return accountant


def test_usage_and_tools_counted_for_every_split_size() -> None:
    stream = CONTENT + TOOLS + TOOLS_MORE + CONTENT + USAGE + b"data: [DONE]\n\n"
    for size in (1, 2, 3, 7, 64, len(stream)):
        accountant = feed_in_pieces(stream, size)
        assert (accountant.prompt_tokens, accountant.completion_tokens) == (11, 22), size
        assert accountant.tool_names == {0: "search", 1: "fetch"}, size
        assert not accountant.has_partial_event


def test_null_delta_and_empty_choices_are_harmless() -> None:
    accountant = StreamAccountant()
    accountant.feed(event({"choices": [{"index": 0, "delta": None}]}) + USAGE)
    assert accountant.prompt_tokens == 11


def test_partial_event_is_reported() -> None:
    accountant = StreamAccountant()
    accountant.feed(USAGE[:10])
    assert accountant.has_partial_event
    accountant.feed(USAGE[10:])
    assert not accountant.has_partial_event and accountant.usage_seen


def test_first_non_empty_tool_name_wins() -> None:
    accountant = StreamAccountant()
    accountant.add_tool_calls([{"index": 0, "function": {"name": ""}}, {"index": 0, "function": {"name": "a"}}])
    accountant.add_tool_calls([{"index": 0, "function": {"name": "b"}}, {"function": {"name": "c"}}])
    assert accountant.tool_names == {0: "a", 1: "c"}


def compact_event(payload: dict) -> bytes:
    """As LiteLLM encodes its chunks (compact JSON)."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


ROLE_COMPACT = compact_event({"choices": [{"index": 0, "delta": {"content": "", "role": "assistant"}}]})
CONTENT_COMPACT = compact_event({"choices": [{"index": 0, "delta": {"content": "a \"quoted\" \"content\":\"x\""}}]})
IN_BAND_ERROR = b'data: {"error": {"message": "boom", "type": null, "param": null, "code": "500"}}\n\n'


def test_content_deltas_counted_once_for_every_split_size() -> None:
    stream = ROLE_COMPACT + CONTENT_COMPACT * 3 + compact_event({"choices": [{"index": 0, "delta": {}}]})
    for size in (1, 2, 5, 64, len(stream)):
        accountant = feed_in_pieces(stream, size)
        # The role chunk's empty content is not a token; quotes inside text are escaped.
        assert accountant.content_deltas == 3, size
        assert accountant.error_payload is None


def test_in_band_error_event_is_kept_for_every_split_size() -> None:
    stream = ROLE_COMPACT + CONTENT_COMPACT + IN_BAND_ERROR
    for size in (1, 3, 64, len(stream)):
        accountant = feed_in_pieces(stream, size)
        assert accountant.error_payload is not None, size
        assert json.loads(accountant.error_payload)["error"]["message"] == "boom"
        assert accountant.content_deltas == 1


def test_error_words_inside_content_are_not_an_error() -> None:
    accountant = StreamAccountant()
    accountant.feed(compact_event({"choices": [{"index": 0, "delta": {"content": '{"error": {"code": "500"}}'}}]}))
    assert accountant.error_payload is None
    assert accountant.content_deltas == 1
