"""The JSON bodies sent to LiteLLM (compatibility.md §4.2, §4.8, D5)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..models import ChatRequest, SearchRequest
from ..settings import CompletionDefaults
from ..wire import MAX_JSON_DEPTH

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Every depth a request body may have (the reference stopped at 32, so a surrogate deeper
# down still failed the UTF-8 encoding: a 500).
_MAX_SANITIZE_DEPTH = MAX_JSON_DEPTH


class UpstreamBody:
    """A request body for LiteLLM, handed over once.

    A chat body carries the whole conversation, and a stream lives for minutes: once the
    body is sent, nothing may keep it alive. The sender `take()`s the bytes and the holder
    is left empty, so no frame or object up the call chain pins them for the stream.
    """

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def take(self) -> bytes:
        if self._data is None:
            # A second send would post an empty body: a bug, not a retry.
            raise RuntimeError("the upstream body was already taken")
        data, self._data = self._data, None
        return data


def completion_body(
    request: ChatRequest, *, user: str, defaults: CompletionDefaults, purpose: str, country: str | None
) -> UpstreamBody:
    """`purpose` is the validated header's, `country` the raw `X-Geo-Country` value (MLPA
    1.0.39 hands both to LiteLLM's spend logs, the country unclamped)."""
    body: dict[str, Any] = dict(request.fields)
    body.setdefault("messages", [])
    body.setdefault("temperature", defaults.temperature)
    body.setdefault("top_p", defaults.top_p)
    # compatibility.md D5: honour the client's limit (either spelling), never above our maximum.
    requested = body.get("max_completion_tokens", body.get("max_tokens", defaults.max_completion_tokens))
    limit = min(requested, defaults.max_completion_tokens)
    body["max_completion_tokens"] = limit
    body["max_tokens"] = limit
    body["stream"] = request.stream
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    body["user"] = user
    # Always set: `metadata` is no field a client may send (models.py), so nothing is merged.
    body["metadata"] = {"spend_logs_metadata": {"purpose": purpose or "", "country_code": country or ""}}
    return UpstreamBody(encode_json(body))


def search_body(request: SearchRequest, *, user: str) -> bytes:
    """MLPA 1.0.39: the query, its size and the end user only (no service type or purpose)."""
    return encode_json({"query": request.query, "max_results": request.max_results, "user": user})


# One encoder for every body (json.dumps with arguments builds one per call). No cycle
# check: a body is built from decoded JSON and our own values, and JSON has no cycles.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; lone UTF-16 surrogates (which cannot be encoded) are removed."""
    text = _COMPACT.encode(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _COMPACT.encode(strip_surrogates(value)).encode("utf-8")


def strip_surrogates(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("", value)
    if depth >= _MAX_SANITIZE_DEPTH:
        return value
    if isinstance(value, list):
        return [strip_surrogates(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {strip_surrogates(k, depth + 1): strip_surrogates(v, depth + 1) for k, v in value.items()}
    return value
