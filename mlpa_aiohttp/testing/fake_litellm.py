"""A fake LiteLLM proxy speaking LiteLLM's real HTTP wire protocol over loopback.

Used by the unit/integration tests (through `aiohttp_server(fake.make_app())`), by the demo
and by the benchmarks (through `run_fake_upstream`).

Behaviour per request is chosen by a *scenario* (see `Scenario`), first match wins:

1. the `x-fake-scenario: <name>` request header (bench/CLI talking to the fake directly);
2. a `[fake:<name>]` marker in the last message's content (chat) or in `query` (search):
   the proxy forwards bodies unchanged, so tests select scenarios through the proxy this way;
3. the FIFO `fake.next_scenarios` (each entry applies to one request);
4. the default `fake.scenario`.

Every request is recorded in `fake.requests` (see `RecordedRequest`).

Answers are shaped like the real LiteLLM 1.106.12's (headers, chunk and usage shapes, error
bodies and statuses, stream endings); tests/unit/test_fake_litellm.py compares them with
its captured wire (docs/litellm-wire.md).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import itertools
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn, Protocol

from aiohttp import web

__all__ = [
    "ALL_SCENARIOS",
    "ERROR_RESPONSES",
    "ERROR_SCENARIOS",
    "SCENARIO_HEADER",
    "CannedError",
    "CustomerExists",
    "CustomerTable",
    "MemoryCustomerTable",
    "SpendSink",
    "FakeLiteLLM",
    "RecordedRequest",
    "Scenario",
    "run_fake_upstream",
    "serve_fake_litellm",
]

SCENARIO_HEADER = "x-fake-scenario"
_MARKER_RE = re.compile(r"\[fake:([A-Za-z0-9_]+)\]")

CHAT_PATH = "/v1/chat/completions"
SEARCH_PATH = "/v1/search/exa-search"
CUSTOMER_NEW_PATH = "/customer/new"
CUSTOMER_INFO_PATH = "/customer/info"
READINESS_PATH = "/health/readiness"
MODEL_HUB_INFO_PATH = "/public/model_hub/info"


class Scenario(enum.StrEnum):
    OK = "ok"
    SLOW_FIRST_BYTE = "slow_first_byte"
    HANG_BEFORE_HEADERS = "hang_before_headers"
    HANG_AFTER_HEADERS = "hang_after_headers"
    # A chat stream of content events at `interval` that never ends: only the proxy leaving stops it.
    ENDLESS = "endless"
    MID_STREAM_ERROR = "mid_stream_error"  # the connection is cut mid-stream
    MID_STREAM_ERROR_EVENT = "mid_stream_error_event"  # LiteLLM's in-band error event, no [DONE]
    EMPTY_STREAM = "empty_stream"
    SPLIT_EVENT = "split_event"
    USAGE_EMPTY_CHOICES = "usage_empty_choices"
    DELTA_NULL = "delta_null"
    TOOL_CALLS = "tool_calls"
    DROP_ON_REUSE = "drop_on_reuse"
    BUDGET_400 = "budget_400"
    BUDGET_429 = "budget_429"
    BUDGET_422 = "budget_422"
    RATE_LIMIT_429 = "rate_limit_429"
    PROVIDER_RATE_LIMIT_429 = "provider_rate_limit_429"
    THROTTLING_429 = "throttling_429"
    CONTEXT_WINDOW_400 = "context_window_400"
    BAD_PARAM_400 = "bad_param_400"
    TIMEOUT_408 = "timeout_408"
    INVALID_MODEL_400 = "invalid_model_400"
    INVALID_ARGUMENT_400 = "invalid_argument_400"
    UNCLASSIFIED_400 = "unclassified_400"
    UNCLASSIFIED_429 = "unclassified_429"
    GENERATE_400 = "generate_400"
    SERVER_500 = "server_500"
    BAD_GATEWAY_502 = "bad_gateway_502"
    SERVICE_UNAVAILABLE_503 = "service_unavailable_503"
    # The budget of the LiteLLM user owning the proxy's virtual key (`default_user_id`) is
    # spent: at the reference's status, and at LiteLLM 1.106.12's budget status.
    GLOBAL_BUDGET_400 = "global_budget_400"
    GLOBAL_BUDGET_422 = "global_budget_422"
    # Exa (search and the `exa` model) failing behind LiteLLM, its error object (with its
    # `tag`) JSON-escaped inside LiteLLM's message.
    EXA_OVERLOADED_500 = "exa_overloaded_500"
    EXA_RATE_LIMIT_429 = "exa_rate_limit_429"
    # A bare 500 with no JSON and no tag.
    INTERNAL_SERVER_ERROR_500 = "internal_server_error_500"
    RESET_BEFORE_RESPONSE = "reset_before_response"  # the connection is cut before any byte


# Sent by LiteLLM's proxy on every JSON answer, errors included.
LITELLM_SECURITY_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        "vary": "Origin",
        "x-frame-options": "DENY",
        "content-security-policy": "frame-ancestors 'none'",
        "x-content-type-options": "nosniff",
    }
)
# `{model}` in a canned body stands for the request's model (LiteLLM names the model group).
_MODEL_PLACEHOLDER = b"{model}"


@dataclass(frozen=True, slots=True)
class CannedError:
    """An error response as LiteLLM sends it (also when the request had stream=true: a
    stream that fails before its first byte is a plain JSON error with its status)."""

    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # LiteLLM words some errors differently for a streamed request (the 408's message).
    stream_body: bytes | None = None

    @property
    def text(self) -> str:
        return self.body.decode()

    def body_for(self, model: str, *, stream: bool = False) -> bytes:
        body = self.stream_body if stream and self.stream_body is not None else self.body
        return body.replace(_MODEL_PLACEHOLDER, json.dumps(model)[1:-1].encode())

    def to_response(self, model: str = "unknown", *, stream: bool = False) -> web.Response:
        headers = {
            "x-litellm-call-id": str(uuid.uuid4()),
            "x-litellm-response-cost": "0",
            "x-litellm-key-spend": "0.0",
            **self.headers,
            **LITELLM_SECURITY_HEADERS,
        }
        return web.Response(
            status=self.status,
            body=self.body_for(model, stream=stream),
            content_type=self.content_type,
            headers=headers,
        )


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _json_error(
    status: int, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> CannedError:
    return CannedError(status, _compact(payload), "application/json", MappingProxyType(dict(headers or {})))


def _text_error(status: int, text: str) -> CannedError:
    return CannedError(status, text.encode(), "text/plain")


def _litellm_error_object(
    message: str, type_: str | None, code: int, param: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": str(code), **extra}}


def _provider_answered(provider_body_length: int, **extra: str) -> dict[str, str]:
    """Headers of an error the provider itself answered: LiteLLM passes the provider's
    headers on with an `llm_provider-` prefix."""
    return {
        **extra,
        "llm_provider-content-type": "application/json; charset=utf-8",
        "llm_provider-content-length": str(provider_body_length),
        "llm_provider-date": "Mon, 30 Nov 2026 15:42:22 GMT",
        "llm_provider-server": "Python/3.11 aiohttp/3.14.5",
        "x-litellm-timeout": "6000.0",
    }


def _model_group_failed(text: str) -> str:
    return f"{text}\n\nLiteLLM: model group '{{model}}' failed with the error above. No fallback was attempted."


_BUDGET_MESSAGE = "Budget has been exceeded! Current cost: 0.11, Max budget: 0.1"
_INVALID_MODEL_MESSAGE = (
    "/chat/completions: Invalid model name passed in model={model}. "
    "Call `/v1/models` to view available models for your key."
)
_TIMEOUT_MESSAGE = (
    "litellm.Timeout: APITimeoutError - Request timed out. Error_str: Request timed out.{detail}"
    "\n\nDeployment Info: request_timeout: None\ntimeout: 3.0"
)
# The provider failed after the stream started: LiteLLM ends its 200 stream with this event
# (spaced JSON, unlike its other bodies) and no `data: [DONE]`.
IN_BAND_ERROR_EVENT = (
    b"data: "
    + json.dumps(
        _litellm_error_object(
            "litellm.APIConnectionError: APIConnectionError: OpenAIException - Response payload is "
            "not completed: <TransferEncodingError: 400, message='Not enough data to satisfy "
            "transfer length header.'>",
            None,
            500,
        )
    ).encode()
    + b"\n\n"
)

# LiteLLM's user-budget check, for the user that owns the virtual key (the reference's
# `default_user_id`, made by its key script).
_GLOBAL_BUDGET_MESSAGE = "ExceededBudget: User=default_user_id over budget. Spend=100.02, Budget=100.0"


def _exa_error(exception: str, error: str, tag: str) -> str:
    """LiteLLM's message around Exa's own error object `{requestId, error, tag}`."""
    exa = json.dumps({"requestId": "b2c7f0e4a1d94e6c", "error": error, "tag": tag}, separators=(",", ":"))
    return f"litellm.{exception}: Exa_aiException - {exa}"


ERROR_RESPONSES: Mapping[Scenario, CannedError] = MappingProxyType(
    {
        Scenario.BUDGET_400: _json_error(400, _litellm_error_object(_BUDGET_MESSAGE, "budget_exceeded", 400)),
        Scenario.BUDGET_429: _json_error(429, _litellm_error_object(_BUDGET_MESSAGE, "budget_exceeded", 429)),
        # LiteLLM's default `budget_exceeded_status_code` (the end-user check's wording).
        Scenario.BUDGET_422: _json_error(
            422,
            _litellm_error_object(
                "ExceededBudget: End User=uid123:ai over budget. Spend=0.11, Budget=0.1",
                "budget_exceeded",
                422,
            ),
        ),
        # LiteLLM's own TPM/RPM limit (the reference's example wording).
        Scenario.RATE_LIMIT_429: _json_error(
            429,
            _litellm_error_object("Rate limit exceeded. TPM: 1000/500", "rate_limit_error", 429),
            {"retry-after": "60"},
        ),
        # A provider's 429 with Retry-After, as LiteLLM wraps it (retries off).
        Scenario.PROVIDER_RATE_LIMIT_429: _json_error(
            429,
            _litellm_error_object(
                _model_group_failed(
                    "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for "
                    "gpt-4o in organization org-fake on requests per min (RPM): Limit 3, Used 3, "
                    "Requested 1. Please try again in 20s."
                ),
                "throttling_error",
                429,
            ),
            {
                "llm_provider-retry-after": "7",
                "llm_provider-x-ratelimit-remaining-requests": "0",
                **_provider_answered(228),
                "x-ratelimit-remaining-requests": "0",
            },
        ),
        # A provider's "resource exhausted" 429 (no Retry-After), as LiteLLM wraps it.
        Scenario.THROTTLING_429: _json_error(
            429,
            _litellm_error_object(
                _model_group_failed(
                    "litellm.RateLimitError: RateLimitError: OpenAIException - Resource exhausted. "
                    "Please try again later."
                ),
                "throttling_error",
                429,
            ),
            _provider_answered(114),
        ),
        Scenario.CONTEXT_WINDOW_400: _json_error(
            400,
            _litellm_error_object(
                _model_group_failed(
                    "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                    "ContextWindowExceededError: OpenAIException - This model's maximum context "
                    "length is 8192 tokens. However, your messages resulted in 9001 tokens. Please "
                    "reduce the length of the messages.\nmodel={model}. context_window_fallbacks=None. "
                    "fallbacks=None.\n\nSet 'context_window_fallback' - "
                    "https://docs.litellm.ai/docs/routing#fallbacks"
                ),
                "invalid_request_error",
                400,
            ),
            _provider_answered(256),
        ),
        Scenario.BAD_PARAM_400: _json_error(
            400,
            _litellm_error_object(
                _model_group_failed(
                    "litellm.BadRequestError: OpenAIException - Invalid value for 'temperature': "
                    "expected a number between 0 and 2."
                ),
                "invalid_request_error",
                400,
                "temperature",
            ),
            _provider_answered(175),
        ),
        Scenario.TIMEOUT_408: CannedError(
            408,
            _compact(
                _litellm_error_object(
                    _model_group_failed(
                        _TIMEOUT_MESSAGE.format(detail=" - timeout value=3.0, time taken=3.0 seconds")
                    ),
                    "invalid_request_error",
                    408,
                )
            ),
            "application/json",
            MappingProxyType({"x-litellm-timeout": "3.0"}),
            stream_body=_compact(
                _litellm_error_object(
                    _model_group_failed(_TIMEOUT_MESSAGE.format(detail="")), "invalid_request_error", 408
                )
            ),
        ),
        Scenario.INVALID_MODEL_400: _json_error(
            400,
            _litellm_error_object(
                _INVALID_MODEL_MESSAGE,
                "invalid_request_error",
                400,
                provider_specific_fields={"error": _INVALID_MODEL_MESSAGE},
            ),
        ),
        # Not LiteLLM's own: a Vertex-style provider body, the reference's rule-4 example.
        Scenario.INVALID_ARGUMENT_400: _json_error(
            400,
            {
                "error": {
                    "code": 400,
                    "message": "Expected a valid JSON object",
                    "status": "INVALID_ARGUMENT",
                }
            },
        ),
        Scenario.UNCLASSIFIED_400: _json_error(
            400, {"error": {"type": "invalid_request", "message": "Invalid request parameters"}}
        ),
        Scenario.UNCLASSIFIED_429: _text_error(429, "Too Many Requests"),
        Scenario.GENERATE_400: _json_error(
            400,
            {
                "error": {
                    "type": "invalid_request_error",
                    "message": "Could not generate a moderate response",
                }
            },
        ),
        Scenario.SERVER_500: _json_error(
            500,
            _litellm_error_object(
                _model_group_failed(
                    "litellm.InternalServerError: InternalServerError: OpenAIException - The server "
                    "had an error while processing your request. Sorry about that!"
                ),
                "internal_server_error",
                500,
            ),
            _provider_answered(151),
        ),
        # What an edge proxy in front of LiteLLM answers, not LiteLLM itself.
        Scenario.BAD_GATEWAY_502: _text_error(502, "Bad Gateway"),
        Scenario.SERVICE_UNAVAILABLE_503: _text_error(503, "Service Unavailable"),
        Scenario.GLOBAL_BUDGET_400: _json_error(
            400, _litellm_error_object(_GLOBAL_BUDGET_MESSAGE, "budget_exceeded", 400)
        ),
        Scenario.GLOBAL_BUDGET_422: _json_error(
            422, _litellm_error_object(_GLOBAL_BUDGET_MESSAGE, "budget_exceeded", 422)
        ),
        Scenario.EXA_OVERLOADED_500: _json_error(
            500,
            _litellm_error_object(
                _exa_error("APIConnectionError", "Service is temporarily overloaded", "SERVICE_OVERLOADED"),
                None,
                500,
            ),
        ),
        Scenario.EXA_RATE_LIMIT_429: _json_error(
            429,
            _litellm_error_object(
                _exa_error("RateLimitError", "Too many requests", "RATE_LIMIT_EXCEEDED"), "throttling_error", 429
            ),
        ),
        Scenario.INTERNAL_SERVER_ERROR_500: _text_error(500, "Internal Server Error"),
    }
)


def in_band_error_event(scenario: Scenario) -> bytes:
    """The in-band event LiteLLM would send for `scenario`'s error had it happened after the
    stream's first byte: the error body (spaced JSON, as in the capture) in one `data:` event."""
    body = json.loads(ERROR_RESPONSES[scenario].body)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


ALL_SCENARIOS: tuple[Scenario, ...] = tuple(Scenario)
ERROR_SCENARIOS: tuple[Scenario, ...] = tuple(ERROR_RESPONSES)

# Called with (end user id, cost in USD) after each charged completion, beside the customer
# table's own spend update (the demo keeps its in-memory user store's spend with it).
SpendSink = Callable[[str, float], Awaitable[None]]


class CustomerExists(Exception):
    """The end user is already in LiteLLM's table (its unique key on user_id)."""


class CustomerTable(Protocol):
    """LiteLLM's end-user table as `/customer/new`, `/customer/info` and spend tracking use it:
    `MemoryCustomerTable` by default, `litellm_schema.EndUserTable` (PostgreSQL, LiteLLM's own
    schema) for the stack and the tests on a real database."""

    async def insert(self, user_id: str, budget_id: str | None) -> None:
        """Raises `CustomerExists`; any other exception is the database refusing the row."""
        ...

    async def find(self, user_id: str) -> Mapping[str, Any] | None:
        """The user as `/customer/info` answers it (its budget row joined), or None."""
        ...

    async def add_spend(self, user_id: str, cost: float) -> None: ...


class MemoryCustomerTable:
    """End users and budget rows in memory. Unlike LiteLLM's table it has no foreign key: a
    budget id with no row (`add_budget`) is kept, and shows no budget row."""

    def __init__(self) -> None:
        self.customers: dict[str, dict[str, Any]] = {}
        self.budgets: dict[str, dict[str, Any]] = {}

    def add_budget(
        self,
        budget_id: str,
        *,
        max_budget: float | None = None,
        budget_duration: str | None = None,
        tpm_limit: int | None = None,
        rpm_limit: int | None = None,
    ) -> None:
        """A row of LiteLLM's budget table, with the fields `/customer/info` shows."""
        self.budgets[budget_id] = {
            "budget_id": budget_id,
            "soft_budget": None,
            "max_budget": max_budget,
            "max_parallel_requests": None,
            "tpm_limit": tpm_limit,
            "rpm_limit": rpm_limit,
            "tpd_limit": None,
            "model_max_budget": None,
            "budget_duration": budget_duration,
            "allowed_models": [],
            "temp_budget_increase": None,
            "temp_budget_expiry": None,
            "budget_reset_at": None,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        }

    async def insert(self, user_id: str, budget_id: str | None) -> None:
        if user_id in self.customers:
            raise CustomerExists(user_id)
        self.customers[user_id] = {
            "user_id": user_id,
            "blocked": False,
            "alias": None,
            "spend": 0.0,
            "allowed_model_region": None,
            "default_model": None,
            "models": [],
            "budget_id": budget_id,
            "litellm_budget_table": None,
            "object_permission_id": None,
            "object_permission": None,
        }

    async def find(self, user_id: str) -> Mapping[str, Any] | None:
        customer = self.customers.get(user_id)
        if customer is None:
            return None
        budget_id = customer["budget_id"]
        return {**customer, "litellm_budget_table": self.budgets.get(budget_id) if budget_id else None}

    async def add_spend(self, user_id: str, cost: float) -> None:
        customer = self.customers.get(user_id)
        if customer is not None:
            customer["spend"] = float(customer["spend"]) + cost


# USD per prompt token and per completion token of the fake's model: with the default 7
# prompt and 5 completion tokens a completion costs 0.00012, the figure of the default
# `x-litellm-response-cost` header.
DEFAULT_PRICES = (6e-06, 1.56e-05)

# Content of the streamed completion: chunk i carries _WORDS[i % len(_WORDS)].
_WORDS: tuple[str, ...] = ("Hello", " from", " the", " fake", " LiteLLM", ",", " chunk", " stream.")

_TOOL_CALLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("call_fake_0", "get_weather", ('{"city": ', '"Paris", ', '"unit": "c"}')),
    ("call_fake_1", "web_search", ('{"query": ', '"aiohttp"}')),
)


def completion_text(chunks: int) -> str:
    """The assistant content a successful completion with `chunks` content chunks carries."""
    return "".join(_WORDS[i % len(_WORDS)] for i in range(chunks))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(eq=False)
class RecordedRequest:
    """One request the fake received. `headers` keys are lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    connection_id: int
    # 1 for the first request on a TCP connection, 2 for the next one on the same connection...
    nth_on_connection: int
    started_at: float
    scenario: Scenario | None = None
    dropped: bool = False
    # the fake itself cut the connection (mid_stream_error, drop_on_reuse)
    aborted_by_fake: bool = False
    disconnected_at: float | None = None
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    # The streamed body as written, when the fake's `record_sent_streams` is on.
    sent: bytearray | None = None

    @property
    def bearer(self) -> str | None:
        """The key of the request's `Authorization: Bearer <key>`, as received."""
        header = self.headers.get("authorization", "")
        return header[len("Bearer ") :] if header.startswith("Bearer ") else None

    def mark_disconnected(self) -> None:
        self.disconnected_at = time.monotonic()
        self.disconnected.set()


class _RecordingStreamResponse(web.StreamResponse):
    """A stream response that keeps a copy of every body byte it writes."""

    def __init__(self, sent: bytearray, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sent = sent

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._sent += data
        await super().write(data)


@dataclass(eq=False, slots=True)
class _Connection:
    # A strong reference keeps id(protocol) unique while the entry lives (RequestHandler
    # has __slots__ without __weakref__, so no WeakKeyDictionary).
    protocol: Any
    connection_id: int
    requests_seen: int = 0


class _UnknownScenario(ValueError):
    pass


def _parse_scenario(name: str | Scenario) -> Scenario:
    try:
        return Scenario(name)
    except ValueError:
        raise _UnknownScenario(str(name)) from None


def _last_message_text(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return ""
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _forget_how_the_connection_was_lost(request: web.Request) -> None:
    """Drop the traceback of the error the connection was lost with, which aiohttp keeps as
    the request body's exception. When a socket write fails (the proxy closed the
    connection mid-stream), that traceback holds the writing frames; from Python 3.12 a
    frame also keeps its callers' coroutine frames alive, up to this handler's, which hold
    the request: a reference cycle per hang-up, in the test process, that
    tests/unit/test_request_garbage.py would count against the service."""
    lost = request.content.exception()
    if lost is not None:
        lost.with_traceback(None)


async def _forever() -> NoReturn:
    # Only cancellation (client gone, fake aborted the transport, server shutdown) ends this.
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def _litellm_error(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": str(code)}}


def _prisma_style_message(exc: Exception) -> str:
    """A database error worded as LiteLLM reports Prisma's: a foreign key by its constraint."""
    constraint = getattr(exc, "constraint_name", None)
    if constraint and type(exc).__name__ == "ForeignKeyViolationError":
        return f"Foreign key constraint failed on the field: `{constraint} (index)`"
    return str(exc)


class _StreamEvents:
    """Pre-encoded SSE events of one completion stream, shaped like LiteLLM's: compact JSON,
    no `finish_reason` key until the finish chunk, a usage chunk whose `choices` is
    `[{"index": 0, "delta": {}}]`. JSON is built once per distinct chunk."""

    def __init__(self, model: str, words: Sequence[str]) -> None:
        self.completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.words = words
        self._prefix = (
            f'data: {{"id":{_dumps(self.completion_id)},"created":{self.created},'
            f'"model":{_dumps(model)},"object":"chat.completion.chunk",'
            f'"system_fingerprint":"fp_fake","choices":'
        ).encode()

    def event(self, choices: list[dict[str, Any]], usage: Mapping[str, Any] | None = None) -> bytes:
        tail = "" if usage is None else f',"usage":{_dumps(usage)}'
        return self._prefix + f"{_dumps(choices)}{tail}}}\n\n".encode()

    def delta(self, delta: Mapping[str, Any] | None) -> bytes:
        return self.event([{"index": 0, "delta": delta}])

    def role(self) -> bytes:
        return self.delta({"content": "", "role": "assistant"})

    def contents(self, chunks: int) -> list[bytes]:
        encoded = [self.delta({"content": word}) for word in self.words[:chunks]]
        return [encoded[i % len(encoded)] for i in range(chunks)]

    def tool_call_deltas(self) -> list[bytes]:
        events: list[bytes] = []
        for index, (call_id, name, argument_parts) in enumerate(_TOOL_CALLS):
            events.append(
                self.delta(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for part in argument_parts:
                events.append(
                    self.delta({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                )
        return events

    def finish(self, reason: str) -> bytes:
        return self.event([{"finish_reason": reason, "index": 0, "delta": {}}])

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        openai_shape: bool = False,
        cost: float | None = None,
    ) -> bytes:
        """LiteLLM's usage chunk, or with `openai_shape` the provider's own (`choices: []`)."""
        usage: dict[str, Any] = {
            "completion_tokens": completion_tokens,
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if openai_shape:
            return self.event([], usage)
        usage["completion_tokens_details"] = {"reasoning_tokens": 0, "text_tokens": completion_tokens}
        if cost is not None:
            usage["cost"] = cost
        return self.event([{"index": 0, "delta": {}}], usage)


DONE_EVENT = b"data: [DONE]\n\n"
# The pace of an endless stream (Scenario.ENDLESS) on a fake whose `interval` is 0.
ENDLESS_INTERVAL = 0.05
_COST_PARTS = (
    "original", "discount-amount", "margin-amount", "margin-percent", "input", "output", "tool-usage",
)  # fmt: skip


def _tool_calls_message() -> list[dict[str, Any]]:
    return [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": "".join(parts)}}
        for call_id, name, parts in _TOOL_CALLS
    ]


class FakeLiteLLM:
    """Config, state and recorded traffic of one fake LiteLLM; `make_app()` serves it."""

    def __init__(
        self,
        *,
        virtual_key: str = "sk-test-virtual",
        master_key: str = "sk-test-master",
        ttft: float = 0.0,
        chunks: int = 5,
        interval: float = 0.0,
        slow_delay: float = 0.5,
        split_pause: float = 0.01,
        prompt_tokens: int = 7,
        words: Sequence[str] = _WORDS,
        litellm_version: str = "1.106.12",
        readiness_body: Mapping[str, Any] | None = None,
        scenario: Scenario | str = Scenario.OK,
        response_headers: Mapping[str, str] | None = None,
        customer_table: CustomerTable | None = None,
        spend_sink: SpendSink | None = None,
        keep_requests: int | None = None,
    ) -> None:
        self.virtual_key = virtual_key
        # Other virtual keys LiteLLM knows (a client's `litellm-virtual-key`); completions
        # and search accept any of them besides `virtual_key`.
        self.other_virtual_keys: set[str] = set()
        self.master_key = master_key
        self.ttft = ttft
        self.chunks = chunks
        self.interval = interval
        self.slow_delay = slow_delay
        self.split_pause = split_pause
        self.prompt_tokens = prompt_tokens
        self.words: tuple[str, ...] = tuple(words)
        # A priced model's stream carries its cost in the usage chunk (`usage.cost`), not in
        # an x-litellm-response-cost header as JSON answers do.
        self.usage_cost: float | None = None
        self.litellm_version = litellm_version
        # The key /public/model_hub/info names the version under (newer LiteLLMs: `version`).
        self.model_hub_version_key = "litellm_version"
        self.scenario: Scenario | str = _parse_scenario(scenario)
        self.next_scenarios: list[Scenario | str] = []
        # Sent on successful chat/search responses, like LiteLLM's routing headers.
        self.response_headers: dict[str, str] = dict(
            response_headers
            if response_headers is not None
            else {
                "x-litellm-model-api-base": "https://api.fake-provider.test/v1",
                "x-litellm-attempted-fallbacks": "0",
                "x-litellm-attempted-retries": "0",
                "x-litellm-response-duration-ms": "12.5",
                "x-litellm-response-cost": "0.00012",
            }
        )
        # LiteLLM's end users and budgets (`/customer/*`, spend): in memory unless given.
        self.customer_table: CustomerTable = customer_table if customer_table is not None else MemoryCustomerTable()
        self.spend_sink = spend_sink
        # LiteLLM's spend tracking: each successful completion of an end user (the body's
        # `user`) adds its cost to that user's `spend`: `usage_cost` when set, else its
        # usage at these prices (None: an unpriced model, nothing is added).
        self.prices: tuple[float, float] | None = DEFAULT_PRICES
        self.readiness_status = "healthy"
        self.readiness_db = "connected"
        self.readiness_body: dict[str, Any] | None = (
            dict(readiness_body) if readiness_body is not None else None
        )
        self.readiness_down = False
        self.readiness_delay = 0.0
        self.requests: collections.deque[RecordedRequest] = collections.deque(maxlen=keep_requests)
        self.dropped = 0
        self._connections: dict[int, _Connection] = {}
        self._prune_connections_at = 64
        self._connection_ids = itertools.count(1)
        # Keep each chat stream's body bytes in its RecordedRequest.sent (byte-exact tests).
        self.record_sent_streams = False
        # Seconds a stream waits between its usage chunk and `data: [DONE]` (0: one write).
        self.pause_before_done = 0.0
        # What mid_stream_error_event ends its stream with (see `in_band_error_event`).
        self.in_band_error: bytes = IN_BAND_ERROR_EVENT
        # Bodies (sha256) dropped by a sticky drop_on_reuse: their retry is served normally.
        self._dropped_bodies: set[str] = set()

    # ---- public helpers -------------------------------------------------------------------

    def make_app(self) -> web.Application:
        # handler_cancellation: a client disconnect cancels the handler, so hangs end and
        # `disconnected_at` gets recorded.
        app = web.Application(handler_args={"handler_cancellation": True})
        app.router.add_post(CHAT_PATH, self._handle_chat)
        app.router.add_post(SEARCH_PATH, self._handle_search)
        app.router.add_post(CUSTOMER_NEW_PATH, self._handle_customer_new)
        app.router.add_get(CUSTOMER_INFO_PATH, self._handle_customer_info)
        app.router.add_get(READINESS_PATH, self._handle_readiness)
        app.router.add_get(MODEL_HUB_INFO_PATH, self._handle_model_hub_info)
        return app

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [record for record in self.requests if record.path == path]

    def completion_text(self, chunks: int | None = None) -> str:
        count = self.chunks if chunks is None else chunks
        return "".join(self.words[i % len(self.words)] for i in range(count))

    def success_headers(self, model: str, *, stream: bool) -> dict[str, str]:
        """The headers of a successful completion, in LiteLLM's order: its own, the
        provider's (prefixed `llm_provider-`), then the routing headers of `response_headers`."""
        provider_headers = (
            {
                "llm_provider-content-type": "text/event-stream",
                "llm_provider-cache-control": "no-cache",
                "llm_provider-transfer-encoding": "chunked",
            }
            if stream
            else {"llm_provider-content-type": "application/json; charset=utf-8"}
        )
        headers = {
            "x-litellm-call-id": str(uuid.uuid4()),
            "x-litellm-model-id": hashlib.sha256(model.encode()).hexdigest(),
            "x-litellm-model-name": f"openai/{model}",
            "x-litellm-version": self.litellm_version,
            **{f"x-litellm-response-cost-{part}": "0.0" for part in _COST_PARTS},
            "x-litellm-key-spend": "0.0",
            "x-litellm-overhead-duration-ms": "9.5",
            "x-litellm-callback-duration-ms": "0.0",
            **provider_headers,
            "llm_provider-date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
            "llm_provider-server": "Python/3.11 aiohttp/3.14.5",
            "x-litellm-model-group": model,
            **self.response_headers,
        }
        if stream:
            headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
        headers.update(LITELLM_SECURITY_HEADERS)
        return headers

    def completion_cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """What LiteLLM charges for one completion: its reported cost, else usage x price."""
        if self.usage_cost is not None:
            return self.usage_cost
        if self.prices is None:
            return 0.0
        prompt_price, completion_price = self.prices
        return prompt_tokens * prompt_price + completion_tokens * completion_price

    async def _charge(self, body: Mapping[str, Any], completion_tokens: int) -> None:
        user = body.get("user")
        if not isinstance(user, str) or not user:
            return
        cost = self.completion_cost(self.prompt_tokens, completion_tokens)
        if cost <= 0:
            return
        await self.customer_table.add_spend(user, cost)
        if self.spend_sink is not None:
            await self.spend_sink(user, cost)

    def reset(self) -> None:
        """Forget traffic and queued scenarios; keep configuration and the customer table."""
        self.requests.clear()
        self.next_scenarios.clear()
        self.dropped = 0
        self._dropped_bodies.clear()

    # ---- request bookkeeping --------------------------------------------------------------

    def _connection_of(self, request: web.Request) -> _Connection:
        protocol = request.protocol
        connection = self._connections.get(id(protocol))
        if connection is None:
            if len(self._connections) >= self._prune_connections_at:
                self._connections = {
                    key: conn
                    for key, conn in self._connections.items()
                    if conn.protocol.transport is not None
                }
                self._prune_connections_at = max(64, 2 * len(self._connections))
            connection = _Connection(protocol, next(self._connection_ids))
            self._connections[id(protocol)] = connection
        connection.requests_seen += 1
        return connection

    async def _record(self, request: web.Request) -> RecordedRequest:
        started_at = time.monotonic()
        connection = self._connection_of(request)
        body = await request.read()
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = None
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={name.lower(): value for name, value in request.headers.items()},
            body=body,
            json=parsed,
            connection_id=connection.connection_id,
            nth_on_connection=connection.requests_seen,
            started_at=started_at,
        )
        self.requests.append(record)
        return record

    def _authorized(self, request: web.Request, key: str) -> bool:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and header[len("Bearer ") :].strip() == key:
            return True
        return request.headers.get("x-litellm-api-key", "") == key

    def _authorized_by_a_virtual_key(self, request: web.Request) -> bool:
        return any(self._authorized(request, key) for key in (self.virtual_key, *self.other_virtual_keys))

    @staticmethod
    def _unauthorized() -> web.Response:
        return web.json_response(
            _litellm_error(
                "Authentication Error, Invalid proxy server token passed. Unable to find token in "
                "cache or `LiteLLM_VerificationTokenTable`",
                "auth_error",
                401,
                "None",
            ),
            status=401,
        )

    @staticmethod
    def _bad_request(message: str) -> web.Response:
        return web.json_response(_litellm_error(message, "bad_request_error", 400), status=400)

    def _select_scenario(self, request: web.Request, text: str) -> tuple[Scenario, bool]:
        """The request's scenario and whether it is sticky (would apply again to a retry)."""
        header = request.headers.get(SCENARIO_HEADER)
        if header:
            return _parse_scenario(header.strip()), True
        match = _MARKER_RE.search(text)
        if match:
            return _parse_scenario(match.group(1)), True
        if self.next_scenarios:
            return _parse_scenario(self.next_scenarios.pop(0)), False
        return _parse_scenario(self.scenario), True  # tests may assign a plain str

    def _should_drop(self, record: RecordedRequest, sticky: bool) -> bool:
        digest = hashlib.sha256(record.body).hexdigest()
        if sticky and digest in self._dropped_bodies:
            # This is the retry of a dropped request: let it through wherever it lands.
            self._dropped_bodies.discard(digest)
            return False
        if record.nth_on_connection <= 1:
            return False
        if sticky:
            self._dropped_bodies.add(digest)
        return True

    async def _abort(self, request: web.Request, record: RecordedRequest) -> NoReturn:
        """Cut the TCP connection without finishing the response (chunked encoding included)."""
        record.aborted_by_fake = True
        transport = request.transport
        if transport is not None:
            # Let bytes already written leave first, so the client really sees a partial body.
            while transport.get_write_buffer_size() and not transport.is_closing():
                await asyncio.sleep(0.001)
            transport.abort()
        await _forever()  # connection_lost now cancels this handler

    async def _flush(self, request: web.Request) -> None:
        transport = request.transport
        while (
            transport is not None
            and transport.get_write_buffer_size()
            and not transport.is_closing()
        ):
            await asyncio.sleep(0.001)

    async def _serve_scenario(
        self,
        request: web.Request,
        record: RecordedRequest,
        text: str,
        respond: Callable[[web.Request, RecordedRequest, Scenario], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        try:
            scenario, sticky = self._select_scenario(request, text)
        except _UnknownScenario as exc:
            return self._bad_request(f"fake LiteLLM: unknown scenario {exc}")
        record.scenario = scenario
        try:
            if scenario is Scenario.DROP_ON_REUSE and self._should_drop(record, sticky):
                record.dropped = True
                self.dropped += 1
                await self._abort(request, record)
            if scenario is Scenario.RESET_BEFORE_RESPONSE:
                await self._abort(request, record)
            canned = ERROR_RESPONSES.get(scenario)
            if canned is not None:
                body = record.json if isinstance(record.json, dict) else {}
                return canned.to_response(str(body.get("model", "unknown")), stream=body.get("stream") is True)
            if scenario is Scenario.HANG_BEFORE_HEADERS:
                await _forever()
            if scenario is Scenario.SLOW_FIRST_BYTE:
                await asyncio.sleep(self.slow_delay)
            elif self.ttft > 0:
                await asyncio.sleep(self.ttft)
            return await respond(request, record, scenario)
        except (asyncio.CancelledError, ConnectionError):
            # Cancelled while waiting, or a write found the transport closing: either way
            # the client (the proxy) closed the request.
            if not record.aborted_by_fake:
                record.mark_disconnected()
            raise
        finally:
            _forget_how_the_connection_was_lost(request)

    # ---- chat completions -----------------------------------------------------------------

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        record = await self._record(request)
        if not self._authorized_by_a_virtual_key(request):
            return self._unauthorized()
        if not isinstance(record.json, dict):
            return self._bad_request("Invalid JSON body")
        return await self._serve_scenario(
            request, record, _last_message_text(record.json), self._respond_chat
        )

    async def _respond_chat(
        self, request: web.Request, record: RecordedRequest, scenario: Scenario
    ) -> web.StreamResponse:
        body: dict[str, Any] = record.json
        model = str(body.get("model", "unknown"))
        if body.get("stream") is True:
            stream_options = body.get("stream_options")
            include_usage = (
                isinstance(stream_options, dict) and stream_options.get("include_usage") is True
            )
            return await self._stream_chat(request, record, scenario, model, include_usage)
        return await self._json_chat(request, record, scenario, model)

    async def _start_stream(
        self, request: web.Request, content_type: str, model: str = "unknown", sent: bytearray | None = None
    ) -> web.StreamResponse:
        stream = content_type == "text/event-stream"
        headers = self.success_headers(model, stream=stream)
        response = (
            web.StreamResponse(status=200, headers=headers)
            if sent is None
            else _RecordingStreamResponse(sent, status=200, headers=headers)
        )
        response.content_type = content_type
        response.charset = "utf-8"
        await response.prepare(request)  # StreamResponse sends its headers right away
        return response

    async def _stream_chat(
        self,
        request: web.Request,
        record: RecordedRequest,
        scenario: Scenario,
        model: str,
        include_usage: bool,
    ) -> web.StreamResponse:
        if self.record_sent_streams:
            record.sent = bytearray()
        response = await self._start_stream(request, "text/event-stream", model, record.sent)
        if scenario is Scenario.HANG_AFTER_HEADERS:
            await _forever()
        if scenario is Scenario.EMPTY_STREAM:
            await response.write_eof()
            return response

        events = _StreamEvents(model, self.words)
        if scenario is Scenario.ENDLESS:
            await response.write(events.role())
            await self._write_endless(response, events)
        chunks = max(self.chunks, 0)
        if scenario is Scenario.MID_STREAM_ERROR:
            await response.write(events.role())
            for event in events.contents(2):
                await response.write(event)
            await self._abort(request, record)
        if scenario is Scenario.MID_STREAM_ERROR_EVENT:
            # LiteLLM's answer to a provider failing mid-stream: an in-band error event, a
            # clean end of the chunked body, no [DONE].
            await response.write(events.role())
            await self._write_paced(response, events.contents(min(2, chunks)))
            await response.write(self.in_band_error)
            await response.write_eof()
            return response

        if scenario is Scenario.TOOL_CALLS:
            body_events = events.tool_call_deltas()
            completion_tokens = len(body_events)
            finish_reason = "tool_calls"
        else:
            body_events = events.contents(chunks)
            completion_tokens = chunks
            finish_reason = "stop"
            if scenario is Scenario.DELTA_NULL:
                body_events.insert(min(1, len(body_events)), events.delta(None))
            elif scenario is Scenario.SPLIT_EVENT:
                body_events.extend(events.tool_call_deltas()[:1])
        tail = [events.finish(finish_reason)]
        if include_usage:
            tail.append(
                events.usage(
                    self.prompt_tokens,
                    completion_tokens,
                    openai_shape=scenario is Scenario.USAGE_EMPTY_CHOICES,
                    cost=self.usage_cost,
                )
            )
        tail.append(DONE_EVENT)

        if scenario is Scenario.SPLIT_EVENT:
            await self._write_split(request, response, [events.role(), *body_events, *tail])
        else:
            await response.write(events.role())
            await self._write_paced(response, body_events)
            if self.pause_before_done > 0:
                await response.write(b"".join(tail[:-1]))
                await asyncio.sleep(self.pause_before_done)
                tail = tail[-1:]
            await response.write(b"".join(tail))
        await response.write_eof()
        # Charged once the stream completed (a stream the client left is not charged).
        await self._charge(record.json, completion_tokens)
        return response

    async def _write_paced(
        self, response: web.StreamResponse, events: Iterable[bytes], *, interval: float | None = None
    ) -> None:
        """One event per `interval` (the fake's by default), paced by deadlines so sleep
        overshoot keeps the rate; all at once when it is 0."""
        interval = self.interval if interval is None else interval
        if interval <= 0:
            joined = b"".join(events)
            if joined:
                await response.write(joined)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        for event in events:
            deadline += interval
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await response.write(event)

    async def _write_endless(self, response: web.StreamResponse, events: _StreamEvents) -> NoReturn:
        """Content events, one per `interval` (50 ms when it is 0), until the proxy leaves:
        its close cancels the handler, or the next write finds the transport closing."""
        await self._write_paced(
            response, itertools.cycle(events.contents(len(self.words))), interval=self.interval or ENDLESS_INTERVAL
        )
        raise AssertionError("unreachable")

    async def _write_split(
        self, request: web.Request, response: web.StreamResponse, events: Iterable[bytes]
    ) -> None:
        """Each event in two TCP writes cut mid-JSON, paused so they arrive as separate reads."""
        for event in events:
            middle = len(event) // 2
            await response.write(event[:middle])
            await self._flush(request)
            await asyncio.sleep(self.split_pause)
            await response.write(event[middle:])
            await self._flush(request)
            await asyncio.sleep(self.split_pause)

    async def _json_chat(
        self, request: web.Request, record: RecordedRequest, scenario: Scenario, model: str
    ) -> web.StreamResponse:
        headers = self.success_headers(model, stream=False)
        if scenario is Scenario.HANG_AFTER_HEADERS:
            await self._start_stream(request, "application/json", model)
            await _forever()
        if scenario is Scenario.EMPTY_STREAM:
            return web.Response(status=200, body=b"", content_type="application/json", headers=headers)

        # LiteLLM's shape: compact JSON, `provider_specific_fields` on the choice and message.
        message: dict[str, Any]
        if scenario is Scenario.TOOL_CALLS:
            message = {
                "content": None,
                "role": "assistant",
                "tool_calls": _tool_calls_message(),
                "function_call": None,
            }
            finish_reason = "tool_calls"
            completion_tokens = len(_TOOL_CALLS)
        else:
            message = {
                "content": self.completion_text(),
                "role": "assistant",
                "provider_specific_fields": {"refusal": None},
            }
            finish_reason = "stop"
            completion_tokens = max(self.chunks, 0)
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": model,
            "object": "chat.completion",
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "finish_reason": finish_reason,
                    "index": 0,
                    "message": message,
                    "provider_specific_fields": {},
                }
            ],
            "usage": {
                "completion_tokens": completion_tokens,
                "prompt_tokens": self.prompt_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens,
            },
        }
        body = _compact(payload)
        # The provider's own body was a little shorter (no provider_specific_fields).
        headers["llm_provider-content-length"] = str(len(body) - 19)
        if scenario in (Scenario.MID_STREAM_ERROR, Scenario.SPLIT_EVENT):
            response = await self._write_json_in_halves(
                request, record, body, headers, abort=scenario is Scenario.MID_STREAM_ERROR
            )
        else:
            response = web.Response(body=body, content_type="application/json", headers=headers)
        await self._charge(record.json, completion_tokens)
        return response

    async def _write_json_in_halves(
        self,
        request: web.Request,
        record: RecordedRequest,
        body: bytes,
        headers: Mapping[str, str],
        *,
        abort: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        response.content_type = "application/json"
        response.content_length = len(body)
        await response.prepare(request)
        middle = len(body) // 2
        await response.write(body[:middle])
        if abort:
            await self._abort(request, record)
        await self._flush(request)
        await asyncio.sleep(self.split_pause)
        await response.write(body[middle:])
        await response.write_eof()
        return response

    # ---- search ---------------------------------------------------------------------------

    async def _handle_search(self, request: web.Request) -> web.StreamResponse:
        record = await self._record(request)
        if not self._authorized_by_a_virtual_key(request):
            return self._unauthorized()
        if not isinstance(record.json, dict):
            return self._bad_request("Invalid JSON body")
        query = record.json.get("query")
        return await self._serve_scenario(
            request, record, query if isinstance(query, str) else "", self._respond_search
        )

    async def _respond_search(
        self, request: web.Request, record: RecordedRequest, scenario: Scenario
    ) -> web.StreamResponse:
        body: dict[str, Any] = record.json
        query = body.get("query")
        max_results = body.get("max_results", 5)
        if not isinstance(query, str) or not query:
            return self._bad_request("query is required")
        if (
            isinstance(max_results, bool)
            or not isinstance(max_results, int)
            or not 1 <= max_results <= 100
        ):
            return self._bad_request("max_results must be an integer between 1 and 100")
        if scenario is Scenario.HANG_AFTER_HEADERS:
            await self._start_stream(request, "application/json")
            await _forever()
        if scenario is Scenario.EMPTY_STREAM:
            return web.Response(
                status=200, body=b"", content_type="application/json", headers=self._search_headers()
            )
        slug = re.sub(r"[^a-z0-9]+", "-", query.lower()).strip("-") or "query"
        payload = {
            "object": "search",
            "results": [
                {
                    "title": f"Result {rank} for {query}",
                    "url": f"https://search.fake.test/{slug}/{rank}",
                    "snippet": f"A plausible snippet #{rank} about {query}.",
                    "date": None,
                }
                for rank in range(1, max_results + 1)
            ],
        }
        encoded = json.dumps(payload).encode()
        if scenario in (Scenario.MID_STREAM_ERROR, Scenario.SPLIT_EVENT):
            return await self._write_json_in_halves(
                request, record, encoded, self._search_headers(), abort=scenario is Scenario.MID_STREAM_ERROR
            )
        return web.Response(
            body=encoded, content_type="application/json", headers=self._search_headers()
        )

    def _search_headers(self) -> dict[str, str]:
        return {**self.response_headers, **LITELLM_SECURITY_HEADERS}

    # ---- admin endpoints (master key) -----------------------------------------------------

    async def _handle_customer_new(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        if not self._authorized(request, self.master_key):
            return self._unauthorized()
        body = record.json
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("user_id"), str)
            or not body["user_id"]
        ):
            return self._bad_request("user_id is required")
        user_id: str = body["user_id"]
        budget_id = body.get("budget_id")
        if budget_id is not None and not isinstance(budget_id, str):
            return self._bad_request("budget_id must be a string")
        try:
            await self.customer_table.insert(user_id, budget_id)
        except CustomerExists:
            # LiteLLM's one named refusal: its check of Prisma's unique-constraint message.
            return web.json_response(
                _litellm_error(
                    f"Customer already exists, passed user_id={user_id}. Please pass a new user_id.",
                    "bad_request",
                    400,
                    "user_id",
                ),
                status=400,
            )
        except Exception as exc:  # noqa: BLE001 - LiteLLM's generic handler
            # Every other database error: LiteLLM's generic handler, a 500 with its message.
            return web.json_response(
                _litellm_error(_prisma_style_message(exc), "internal_server_error", 500), status=500
            )
        return web.json_response(await self.customer_table.find(user_id))

    async def _handle_customer_info(self, request: web.Request) -> web.Response:
        await self._record(request)
        if not self._authorized(request, self.master_key):
            return self._unauthorized()
        end_user_id = request.query.get("end_user_id")
        if end_user_id is None:
            return web.json_response(
                {
                    "detail": [
                        {
                            "type": "missing",
                            "loc": ["query", "end_user_id"],
                            "msg": "Field required",
                        }
                    ]
                },
                status=422,
            )
        customer = await self.customer_table.find(end_user_id)
        if customer is None:
            return web.json_response(
                _litellm_error(
                    f"End User Id={end_user_id} does not exist in db", "not_found", 404, "end_user_id"
                ),
                status=404,
            )
        return web.json_response(customer)

    async def _handle_readiness(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        if not self._authorized(request, self.master_key):
            return self._unauthorized()
        try:
            if self.readiness_delay > 0:
                await asyncio.sleep(self.readiness_delay)
        except asyncio.CancelledError:
            record.mark_disconnected()
            raise
        if self.readiness_down:
            return web.json_response(
                _litellm_error(
                    "Service Unhealthy (database unreachable)", "internal_server_error", 500
                ),
                status=500,
            )
        if self.readiness_body is not None:
            return web.json_response(self.readiness_body)
        return web.json_response(
            {
                "status": self.readiness_status,
                "db": self.readiness_db,
                "cache": None,
                "litellm_version": self.litellm_version,
                "success_callbacks": [],
                "last_updated": None,
            }
        )

    async def _handle_model_hub_info(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(
            {
                "docs_title": "LiteLLM API",
                "custom_docs_description": None,
                self.model_hub_version_key: self.litellm_version,
                "useful_links": {},
            }
        )


async def serve_fake_litellm(
    fake: FakeLiteLLM,
    host: str = "127.0.0.1",
    port: int = 4000,
    *,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Serve `fake` on host:port until cancelled. `on_started` receives the base URL."""
    runner = web.AppRunner(fake.make_app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        if on_started is not None:
            sockets = runner.addresses
            bound_port = sockets[0][1] if sockets else port
            on_started(f"http://{host}:{bound_port}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def run_fake_upstream(
    host: str = "127.0.0.1",
    port: int = 4000,
    *,
    ttft: float = 0.0,
    chunks: int = 5,
    interval: float = 0.0,
    on_started: Callable[[str], None] | None = None,
    **knobs: Any,
) -> None:
    """The `fake-upstream` CLI command: a fake LiteLLM until cancelled (keeps 1000 records)."""
    knobs.setdefault("keep_requests", 1000)
    fake = FakeLiteLLM(ttft=ttft, chunks=chunks, interval=interval, **knobs)
    await serve_fake_litellm(fake, host, port, on_started=on_started)
