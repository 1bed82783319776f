"""`POST /v1/chat/completions` and `POST /v1/search`: validate, authenticate, provision,
relay (spec §1.8, §1.9). Each step short-circuits with a domain error."""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
from aiohttp import web

from .. import keys
from ..errors import (
    ApiError,
    AuthRejected,
    BadRequest,
    InvalidModelName,
    SignupCapExceeded,
    TooManyStreams,
    UserBlocked,
)
from ..models import (
    ChatRequest,
    ProxyHeaders,
    check_model_name,
    check_model_service_type,
    check_search_service_type,
    parse_chat,
    parse_search,
    resolve_purpose,
)
from ..observability.labels import clamp_country, clamp_model
from ..principal import Principal
from ..relay.json_relay import relay_completion, relay_search
from ..relay.outcome import CompletionOutcome
from ..relay.keepalive import FirstByteKeepAlive
from ..relay.stream import StreamRelay
from ..store.base import EndUser
from ..upstream.bodies import UpstreamBody, completion_body, search_body
from .request_body import read_body

log = structlog.get_logger(__name__)


def _bind_principal(principal: Principal) -> None:
    structlog.contextvars.bind_contextvars(
        user=principal.user_id,
        service_type=principal.service_type.value,
        purpose=principal.purpose or "-",
        auth_method=principal.method.value,
    )


async def authenticate_caller(request: web.Request, headers: ProxyHeaders, raw_body: bytes) -> Principal:
    """The authorize step every authenticated route shares: purpose rules, then the auth
    chain (App Attest, access token, dev key + FxA, FxA); the principal joins the log context."""
    settings = request.app[keys.SETTINGS]
    purpose = resolve_purpose(headers.purpose, headers.service_type, required=settings.server.require_purpose_header)
    principal = await request.app[keys.AUTHENTICATOR].authenticate(headers, purpose, raw_body)
    _bind_principal(principal)
    return principal


async def authorize_chat(request: web.Request) -> tuple[ChatRequest, Principal]:
    """Steps shared by the chat route and the mock chat route (spec §1.7, §1.8): validate,
    check model and purpose, authenticate; availability is recorded for each rejection, and
    the country metric once the caller is known."""
    metrics = request.app[keys.METRICS]
    raw_body = await read_body(request)
    headers, chat = parse_chat(raw_body, request.headers)
    service_type = headers.service_type.value
    structlog.contextvars.bind_contextvars(model=chat.model)

    def unavailable(reason: str) -> None:
        metrics.chat_availability(reason, model=chat.model, service_type=service_type, purpose=headers.purpose.strip())

    try:
        check_model_name(chat.model)
    except InvalidModelName:
        unavailable("invalid_model_name")
        raise
    try:
        check_model_service_type(chat.model, headers.service_type)
    except BadRequest:
        unavailable("invalid_service_type_for_model")
        raise
    try:
        principal = await authenticate_caller(request, headers, raw_body)
    except AuthRejected:
        unavailable("auth_rejected")
        raise
    except BadRequest:
        unavailable("invalid_auth_request")
        raise
    metrics.requests_by_country.labels(
        service_type, clamp_model(chat.model), clamp_country(request.headers.get("X-Geo-Country"))
    ).inc()
    return chat, principal


@dataclass(frozen=True, slots=True)
class PreparedCompletion:
    """What the relay needs of an authorised request; the parsed request is not in it."""

    body: UpstreamBody
    stream: bool
    outcome: CompletionOutcome
    # The LiteLLM end user `uid:service_type`: the identity a stream slot is held for.
    user_id: str


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    app = request.app
    settings = app[keys.SETTINGS]
    completion = await _prepare_completion(request, started)
    client = app[keys.LITELLM]
    if completion.stream:
        relay = StreamRelay(
            request,
            client=client,
            body=completion.body,
            outcome=completion.outcome,
            metrics=app[keys.METRICS],
            tracker=app[keys.STREAMS],
            debug=settings.server.debug,
            started=started,
            keepalive=_keepalive_for(request, completion),
            fast_path=settings.stream_limits.relay_fast_path,
        )
        slots = app[keys.STREAM_SLOTS]
        if not slots.enabled:
            return await relay.run()
        _take_stream_slot(request, completion)
        try:
            return await relay.run()
        finally:
            # Every way out: the end of the stream, an upstream error, the client's
            # hang-up (a CancelledError from the connection-lost callback), shutdown.
            slots.give_back(completion.user_id)
    return await relay_completion(
        client=client, body=completion.body, outcome=completion.outcome, debug=settings.server.debug
    )


# A client opts its stream into keep-alive comments with this header (on/true/1/yes).
KEEPALIVE_HEADER = "X-MLPA-Keepalive"
_OPT_IN = frozenset({"1", "true", "yes", "on"})


def _keepalive_for(request: web.Request, completion: PreparedCompletion) -> FirstByteKeepAlive | None:
    """The keep-alive tick if this stream gets comments: the feature is on and the service
    type is configured for it or the client asked by header."""
    keepalive = request.app.get(keys.STREAM_KEEPALIVE)
    if keepalive is None:
        return None
    service_types = request.app[keys.SETTINGS].stream_limits.keepalive_service_types
    if completion.outcome.service_type in service_types:
        return keepalive
    if request.headers.get(KEEPALIVE_HEADER, "").strip().lower() in _OPT_IN:
        return keepalive
    return None


def _take_stream_slot(request: web.Request, completion: PreparedCompletion) -> None:
    """Claim one of the caller's open-stream slots or refuse with 429, error 10. No await
    between the check and the claim (StreamSlots.try_take is synchronous)."""
    slots = request.app[keys.STREAM_SLOTS]
    if slots.try_take(completion.user_id):
        return
    outcome = completion.outcome
    labels = {"model": outcome.model, "service_type": outcome.service_type, "purpose": outcome.purpose}
    metrics = request.app[keys.METRICS]
    metrics.chat_rejection("concurrent_stream_limit", **labels)
    metrics.chat_availability("concurrent_stream_limit", **labels)
    log.warning("concurrent_stream_limit", limit=slots.limit)
    raise TooManyStreams()


async def _prepare_completion(request: web.Request, started: float) -> PreparedCompletion:
    """Validate, authenticate, provision and build the upstream body. The parsed request
    ends with this call, so a stream holds no copy of the conversation but the body, and
    that only until it is sent."""
    settings, metrics = request.app[keys.SETTINGS], request.app[keys.METRICS]
    chat, principal = await authorize_chat(request)
    service_type, purpose = principal.service_type.value, principal.purpose

    user = await _provision_for_chat(request, principal, chat.model)
    if user.blocked:
        metrics.chat_availability("blocked", model=chat.model, service_type=service_type, purpose=purpose)
        raise UserBlocked()
    if chat.has_tools:
        metrics.requests_with_tools.labels(clamp_model(chat.model), service_type, purpose).inc()
    return PreparedCompletion(
        body=completion_body(chat, user=principal.user_id, defaults=settings.completion),
        stream=chat.stream,
        outcome=CompletionOutcome(
            metrics, model=chat.model, service_type=service_type, purpose=purpose, started=started
        ),
        user_id=principal.user_id,
    )


async def _provision_for_chat(request: web.Request, principal: Principal, model: str) -> EndUser:
    metrics = request.app[keys.METRICS]
    labels = {"model": model, "service_type": principal.service_type.value, "purpose": principal.purpose}
    try:
        return await request.app[keys.PROVISIONER].get_or_create(principal.user_id)
    except SignupCapExceeded:
        metrics.chat_rejection("signup_cap_exceeded", **labels)
        metrics.chat_availability("signup_cap_exceeded", **labels)
        raise
    except ApiError as error:
        if error.status >= 500:
            metrics.chat_availability("provisioning_failure", **labels)
        raise


async def search(request: web.Request) -> web.Response:
    app = request.app
    settings, metrics = app[keys.SETTINGS], app[keys.METRICS]
    raw_body = await read_body(request)
    headers, query = parse_search(raw_body, request.headers)
    principal = await authenticate_caller(request, headers, raw_body)
    purpose = principal.purpose
    metrics.requests_by_country.labels(
        principal.service_type.value, "exa-search", clamp_country(request.headers.get("X-Geo-Country"))
    ).inc()
    check_search_service_type(principal.service_type)
    user = await app[keys.PROVISIONER].get_or_create(principal.user_id)
    if user.blocked:
        raise UserBlocked()
    body = search_body(query, user=principal.user_id, service_type=principal.service_type.value, purpose=purpose)
    return await relay_search(
        client=app[keys.LITELLM],
        body=body,
        metrics=metrics,
        service_type=principal.service_type.value,
        purpose=purpose,
        debug=settings.server.debug,
    )
