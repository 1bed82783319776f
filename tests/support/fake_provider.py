"""A loopback OpenAI-compatible model provider, to stand behind the real LiteLLM proxy.

The real-LiteLLM suite points LiteLLM's deployments at this backend (`api_base` =
`<url>/v1`, model `openai/<behaviour>`); the model name LiteLLM forwards selects how it
answers (see `Behaviour`). Every request is recorded with the moment its client went away,
so a test can observe LiteLLM closing its provider request.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from aiohttp import web

__all__ = ["Behaviour", "FakeProvider", "ProviderRequest", "serve_fake_provider"]

CHAT_PATH = "/v1/chat/completions"
SEARCH_PATH = "/search"  # Exa's search API, for LiteLLM's `exa_ai` search provider
REPLY_WORDS: tuple[str, ...] = ("Hello", " there", "!")
PROMPT_TOKENS = 11
RATE_LIMIT_RETRY_AFTER = "7"


class Behaviour(enum.StrEnum):
    OK = "ok"
    SLOW = "slow"  # answers after `slow_seconds`: past LiteLLM's timeout in the suite's config
    RATE_LIMIT = "ratelimit"  # 429 with Retry-After, like OpenAI's RPM limit
    THROTTLE = "throttle"  # 429 "resource exhausted", no Retry-After
    CONTEXT = "ctx"  # 400 context length exceeded
    BAD_PARAM = "badparam"  # 400 invalid parameter
    SERVER_ERROR = "e500"  # 500
    MID_STREAM = "midstream"  # a stream cut after two content chunks
    TRICKLE = "trickle"  # a long stream, one chunk per `trickle_interval` (disconnects)


@dataclass(eq=False)
class ProviderRequest:
    path: str
    body: Any
    headers: dict[str, str]
    behaviour: Behaviour | None
    started_at: float = field(default_factory=time.monotonic)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected_at: float | None = None

    def mark_disconnected(self) -> None:
        self.disconnected_at = time.monotonic()
        self.disconnected.set()


def _openai_error(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_ERRORS: dict[Behaviour, tuple[int, dict[str, Any], dict[str, str]]] = {
    Behaviour.RATE_LIMIT: (
        429,
        _openai_error(
            "Rate limit reached for gpt-4o in organization org-fake on requests per min (RPM): "
            "Limit 3, Used 3, Requested 1. Please try again in 20s.",
            "requests",
            "rate_limit_exceeded",
        ),
        {"Retry-After": RATE_LIMIT_RETRY_AFTER, "x-ratelimit-remaining-requests": "0"},
    ),
    Behaviour.THROTTLE: (
        429,
        # A throttling gateway's body: no `param` (the captures' provider sent none either).
        {"error": {"message": "Resource exhausted. Please try again later.", "type": "resource_exhausted", "code": "429"}},
        {},
    ),
    Behaviour.CONTEXT: (
        400,
        _openai_error(
            "This model's maximum context length is 8192 tokens. However, your messages resulted "
            "in 9001 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        ),
        {},
    ),
    Behaviour.BAD_PARAM: (
        400,
        _openai_error(
            "Invalid value for 'temperature': expected a number between 0 and 2.",
            "invalid_request_error",
            "invalid_value",
            "temperature",
        ),
        {},
    ),
    Behaviour.SERVER_ERROR: (
        500,
        _openai_error(
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
            None,
        ),
        {},
    ),
}


def _behaviour_of(model: object) -> Behaviour | None:
    # LiteLLM forwards the deployment's model without its `openai/` prefix.
    name = str(model).rsplit("/", 1)[-1]
    try:
        return Behaviour(name)
    except ValueError:
        return None


async def _forever() -> NoReturn:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class FakeProvider:
    """Config and recorded traffic of one fake provider; `make_app()` serves it."""

    def __init__(
        self,
        *,
        slow_seconds: float = 5.0,
        trickle_chunks: int = 200,
        trickle_interval: float = 0.05,
        cut_after: float = 2.0,
    ) -> None:
        self.slow_seconds = slow_seconds
        self.trickle_chunks = trickle_chunks
        self.trickle_interval = trickle_interval
        self.cut_after = cut_after
        self.requests: collections.deque[ProviderRequest] = collections.deque(maxlen=1000)

    def make_app(self) -> web.Application:
        # handler_cancellation: a client that goes away cancels the handler, which records it.
        app = web.Application(handler_args={"handler_cancellation": True})
        app.router.add_post(CHAT_PATH, self._handle_chat)
        app.router.add_post(SEARCH_PATH, self._handle_search)
        return app

    def requests_for(self, behaviour: Behaviour) -> list[ProviderRequest]:
        return [record for record in self.requests if record.behaviour is behaviour]

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(_openai_error("Invalid JSON", "invalid_request_error", None), status=400)
        if not isinstance(body, dict):
            return web.json_response(_openai_error("Expected an object", "invalid_request_error", None), status=400)
        behaviour = _behaviour_of(body.get("model"))
        record = ProviderRequest(
            request.path, body, {k.lower(): v for k, v in request.headers.items()}, behaviour
        )
        self.requests.append(record)
        try:
            return await self._answer(request, body, behaviour)
        except asyncio.CancelledError:
            record.mark_disconnected()
            raise

    async def _handle_search(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        self.requests.append(
            ProviderRequest(request.path, body, {k.lower(): v for k, v in request.headers.items()}, None)
        )
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return web.json_response({"error": "query is required"}, status=400)
        query: str = body["query"]
        count = body.get("numResults", 3)
        count = count if isinstance(count, int) and 0 < count <= 100 else 3
        return web.json_response(
            {
                "requestId": "fake-search",
                "results": [
                    {
                        "title": f"Result {rank} for {query}",
                        "url": f"https://search.fake.test/{rank}",
                        "text": f"A plausible snippet #{rank} about {query}.",
                        "publishedDate": None,
                    }
                    for rank in range(1, count + 1)
                ],
            }
        )

    async def _answer(
        self, request: web.Request, body: dict[str, Any], behaviour: Behaviour | None
    ) -> web.StreamResponse:
        if behaviour is None:
            return web.json_response(
                _openai_error(f"The model `{body.get('model')}` does not exist", "invalid_request_error", "model_not_found"),
                status=404,
            )
        canned = _ERRORS.get(behaviour)
        if canned is not None:
            status, payload, headers = canned
            return web.json_response(payload, status=status, headers=headers)
        if behaviour is Behaviour.SLOW:
            await asyncio.sleep(self.slow_seconds)
        model = str(body.get("model"))
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            return await self._stream(request, model, behaviour, include_usage)
        return web.json_response(_completion(model))

    async def _stream(
        self, request: web.Request, model: str, behaviour: Behaviour, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        async for event in _events(self, model, behaviour, include_usage):
            await response.write(event)
        if behaviour is Behaviour.MID_STREAM:
            await self._cut(request)
        await response.write_eof()
        return response

    async def _cut(self, request: web.Request) -> NoReturn:
        """End the connection inside the chunked body, so the client sees a truncated stream."""
        transport = request.transport
        if transport is not None:
            while transport.get_write_buffer_size() and not transport.is_closing():
                await asyncio.sleep(0.001)
            transport.abort()
        await _forever()


def _chunk(model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
    payload: dict[str, Any] = {
        "id": "chatcmpl-fake123",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": choices,
    }
    if usage is not None:
        payload["usage"] = usage
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
    }


async def _events(
    provider: FakeProvider, model: str, behaviour: Behaviour, include_usage: bool
) -> AsyncIterator[bytes]:
    yield _chunk(model, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    if behaviour is Behaviour.TRICKLE:
        words = [f" w{i}" for i in range(provider.trickle_chunks)]
    else:
        words = list(REPLY_WORDS)
    for position, word in enumerate(words):
        if behaviour is Behaviour.TRICKLE:
            await asyncio.sleep(provider.trickle_interval)

        yield _chunk(model, [{"index": 0, "delta": {"content": word}, "finish_reason": None}])
        if behaviour is Behaviour.MID_STREAM and position == 1:
            # The cut comes late enough for LiteLLM to have sent its 200 and these chunks
            # (its first call to a deployment is slow; a failure within its first read comes
            # back as a plain JSON 500 instead).
            await asyncio.sleep(provider.cut_after)
            return  # the caller cuts the connection here
    yield _chunk(model, [{"index": 0, "delta": {}, "finish_reason": "stop"}])
    if include_usage:
        yield _chunk(model, [], _usage(len(words)))
    yield b"data: [DONE]\n\n"


def _completion(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake123",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(REPLY_WORDS), "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(len(REPLY_WORDS)),
    }


async def serve_fake_provider(provider: FakeProvider, host: str = "127.0.0.1", port: int = 0) -> web.AppRunner:
    """Start `provider` on host:port; the caller cleans the returned runner up."""
    runner = web.AppRunner(provider.make_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
