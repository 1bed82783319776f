"""Load-testing routes (compatibility.md §1.7, D16), mounted only with `MLPA_MOCK_ROUTES=true`.

They exercise authentication and user provisioning exactly as the chat route does, then
answer with a canned completion after simulated latency. LiteLLM is never called and no
completion metrics are written, so load tests cost nothing upstream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse

from .. import keys
from ..auth.dispatch import bearer_token
from ..auth.fxa import FxASignatureInvalid, FxAVerificationFailed
from ..errors import AuthRejected, RequestInvalid
from ..models import ChatRequest, parse_chat_body
from ..observability import log_context
from ..observability.timing import spans_event
from ..settings import ServerSettings
from ..validation import Problem
from .proxy import authorize_chat

MOCK_COMPLETION: Mapping[str, Any] = {
    "choices": [{"message": {"content": "mock completion response"}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    "model": "mock",
}
MOCK_STREAM_EVENTS: tuple[str, ...] = (
    json.dumps({"choices": [{"delta": {"content": "mock token 1"}}]}),
    json.dumps({"choices": [{"delta": {"content": "mock token 2"}}]}),
    "[DONE]",
)

INVALID_AUTHORIZATION_FORMAT = "Invalid authorization header format"
INVALID_TOKEN_SIGNATURE = "Invalid token signature"


def setup_mock_routes(app: web.Application) -> None:
    """Mount `/mock/*` when the settings ask for it (off by default: compatibility.md D16)."""
    if not app[keys.SETTINGS].server.mock_routes:
        return
    app.router.add_post("/mock/chat/completions", mock_chat_completions)
    app.router.add_post("/mock/chat/completions_no_auth", mock_chat_completions_no_auth)


async def mock_chat_completions(request: web.Request) -> web.StreamResponse:
    """The chat route's validation, auth and provisioning, then a canned reply."""
    chat, principal = await authorize_chat(request, request[keys.REQUEST_TIMINGS])
    await request.app[keys.PROVISIONER].provision(principal.user_id)
    return await _canned_reply(request, chat)


async def mock_chat_completions_no_auth(request: web.Request) -> web.StreamResponse:
    """A plain chat body and an FxA JWT verified locally against the cached JWKS; unlike
    the reference, the user id carries the service type, so provisioning succeeds."""
    problems: list[Problem] = []
    rules = request.app[keys.REQUEST_RULES]
    headers = rules.parse_headers(rules.mock_no_auth_headers, request.headers, problems)
    chat = parse_chat_body(await request.read(), problems)
    if problems or headers is None or chat is None:
        raise RequestInvalid(problems)
    authorization, service_type = headers.authorization, str(headers.service_type)

    # HTTP parsers strip trailing whitespace, so "Bearer " arrives as "Bearer".
    token = bearer_token(authorization)
    if not token or authorization.strip() == "Bearer":
        raise AuthRejected(INVALID_AUTHORIZATION_FORMAT)
    try:
        identity = await request.app[keys.AUTHENTICATOR].fxa.verify_jwt(token)
    except FxASignatureInvalid:
        raise AuthRejected(INVALID_TOKEN_SIGNATURE) from None
    except FxAVerificationFailed as exc:
        raise AuthRejected(f"JWT verification failed: {exc}") from None

    user_id = f"{identity.uid}:{service_type}"
    log_context.bind(user=user_id, service_type=service_type, model=chat.model)
    await request.app[keys.PROVISIONER].provision(user_id)
    return await _canned_reply(request, chat)


async def _canned_reply(request: web.Request, chat: ChatRequest) -> web.StreamResponse:
    server: ServerSettings = request.app[keys.SETTINGS].server
    await asyncio.sleep(server.mock_ttft_ms / 1000)
    if not chat.stream:
        return web.json_response(MOCK_COMPLETION)
    chunk_latency = server.mock_streaming_chunk_latency_ms / 1000
    response = EventSourceResponse(allow_all_methods=True, sep="\n")
    response.charset = "utf-8"
    await response.prepare(request)
    async with response:
        for event in MOCK_STREAM_EVENTS:
            await response.send(event)
            await asyncio.sleep(chunk_latency)
        timings = request[keys.REQUEST_TIMINGS]
        if timings is not None:
            # The canned stream ends in `data: [DONE]`: its spans follow (compatibility.md D48).
            await response.write(spans_event(timings))
    return response
