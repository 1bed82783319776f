"""`POST /v1/chat/completions` and `POST /v1/search`: validate, authenticate, provision,
relay (compatibility.md §1.8, §1.9). Each step short-circuits with a domain error; what a refused chat
request means to the metrics is the error's own (`errors.ApiError`), recorded by
`refusals_recorded`. Once the relay runs, `CompletionOutcome` records instead."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from aiohttp import web

from .. import keys
from ..fleet.stream_cap import FleetStreamCap
from ..errors import INVALID_AUTH_REQUEST, ApiError, BadRequest, TooManyStreams
from ..headers import GEO_COUNTRY, STREAM_KEEPALIVE
from ..models import ChatRequest, ProxyHeaders, check_model_name
from ..observability import log_context
from ..observability.labels import clamp_country
from ..observability.metrics import Metrics
from ..principal import Principal
from ..relay.json_relay import relay_completion, relay_search
from ..relay.outcome import CompletionOutcome
from ..relay.keepalive import FirstByteKeepAlive
from ..relay.stream import StreamRelay
from ..settings import TRUTHY
from ..upstream.bodies import UpstreamBody, completion_body, search_body
from .request_body import read_body

log = structlog.get_logger(__name__)

SEARCH_MODEL_LABEL = "exa-search"


def _bind_principal(principal: Principal) -> None:
    log_context.bind(
        user=principal.user_id,
        service_type=principal.service_type,
        purpose=principal.purpose or "-",
        auth_method=principal.method.value,
    )


async def authenticate_caller(request: web.Request, headers: ProxyHeaders, raw_body: bytes) -> Principal:
    """The auth step every authenticated route shares: purpose rules, then the auth chain
    (App Attest, access token, dev key + FxA, FxA); the principal joins the log context."""
    settings, rules = request.app[keys.SETTINGS], request.app[keys.REQUEST_RULES]
    try:
        purpose = rules.resolve_purpose(headers.purpose, headers.service_type, required=settings.server.require_purpose_header)
        principal = await request.app[keys.AUTHENTICATOR].authenticate(headers, purpose, raw_body)
    except BadRequest as error:
        # Which 400 this is depends on the step: here it is a malformed auth request.
        if error.availability_reason is None:
            error.availability_reason = INVALID_AUTH_REQUEST
        raise
    _bind_principal(principal)
    return principal


def _count_country(request: web.Request, service_type: str, model_label: str) -> None:
    """Once the caller is authenticated (compatibility.md §6: chat and search alike)."""
    request.app[keys.METRICS].requests_by_country.labels(
        service_type, model_label, clamp_country(request.headers.get(GEO_COUNTRY))
    ).inc()


@dataclass(frozen=True, slots=True)
class ChatLabels:
    """The labels of a chat request's availability and rejection samples. The purpose is
    the header's, trimmed: the same value the authenticated principal carries."""

    model: str
    service_type: str
    purpose: str


@contextmanager
def refusals_recorded(metrics: Metrics, labels: ChatLabels) -> Iterator[None]:
    """Record a chat request refused inside the block, as its error says (one availability
    sample, and a rejection where the reference counts one); an error that names no reason
    passes unrecorded, and so does cancellation."""
    try:
        yield
    except ApiError as error:
        kwargs = {"model": labels.model, "service_type": labels.service_type, "purpose": labels.purpose}
        if error.rejection_reason is not None:
            metrics.chat_rejection(error.rejection_reason, **kwargs)
        if error.availability_reason is not None:
            metrics.chat_availability(error.availability_reason, **kwargs)
        raise


async def authorize_chat(request: web.Request) -> tuple[ChatRequest, Principal]:
    """Steps shared by the chat route and the mock chat route (compatibility.md §1.7, §1.8): validate,
    check model and purpose, authenticate, each refusal recorded; the country metric once
    the caller is known."""
    raw_body = await read_body(request)
    rules, metrics = request.app[keys.REQUEST_RULES], request.app[keys.METRICS]
    headers, chat = rules.parse_chat(raw_body, request.headers)
    log_context.bind(model=chat.model)
    labels = ChatLabels(chat.model, str(headers.service_type), headers.purpose.strip())
    with refusals_recorded(metrics, labels):
        check_model_name(chat.model)
        rules.check_model_service_type(chat.model, headers.service_type)
        principal = await authenticate_caller(request, headers, raw_body)
    _count_country(request, labels.service_type, metrics.labels.model(chat.model))
    return chat, principal


@dataclass(frozen=True, slots=True)
class PreparedCompletion:
    """What the relay needs of an authorised request; the parsed request is not in it."""

    body: UpstreamBody
    stream: bool
    labels: ChatLabels
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
            fast_path=app[keys.RELAY_FAST_PATH],
        )
        slots = app[keys.STREAM_SLOTS]
        if not slots.enabled:
            return await relay.run()
        fleet_cap = app.get(keys.FLEET_STREAM_CAP)
        if fleet_cap is not None:
            return await _relay_under_fleet_cap(request, relay, completion, fleet_cap)
        with refusals_recorded(app[keys.METRICS], completion.labels):
            _take_stream_slot(request, completion)
        try:
            return await relay.run()
        finally:
            # Every way out: the end of the stream, an upstream error, the client's
            # hang-up (a CancelledError from the connection-lost callback), shutdown.
            slots.give_back(completion.user_id)
    return await relay_completion(
        request, client=client, body=completion.body, outcome=completion.outcome, debug=settings.server.debug
    )


def _keepalive_for(request: web.Request, completion: PreparedCompletion) -> FirstByteKeepAlive | None:
    """The keep-alive tick if this stream gets keep-alive lines: the feature is on and the service
    type is configured for it or the client asked by header."""
    keepalive = request.app.get(keys.STREAM_KEEPALIVE)
    if keepalive is None:
        return None
    service_types = request.app[keys.SETTINGS].stream_limits.keepalive_service_types
    if completion.outcome.service_type in service_types:
        return keepalive
    if request.headers.get(STREAM_KEEPALIVE, "").strip().lower() in TRUTHY:
        return keepalive
    return None


def _take_stream_slot(request: web.Request, completion: PreparedCompletion) -> None:
    """Claim one of the caller's open-stream slots or refuse with 429, error 10. No await
    between the check and the claim (StreamSlots.try_take is synchronous)."""
    slots = request.app[keys.STREAM_SLOTS]
    if slots.try_take(completion.user_id):
        return
    log.warning("concurrent_stream_limit", limit=slots.limit)
    raise TooManyStreams()


async def _relay_under_fleet_cap(
    request: web.Request, relay: StreamRelay, completion: PreparedCompletion, fleet_cap: FleetStreamCap
) -> web.StreamResponse:
    """STREAM_CAP_SCOPE=fleet: a lease taken before the upstream call (one Redis round trip, or
    the per-worker count while Redis is sick), released however the stream ends."""
    with refusals_recorded(request.app[keys.METRICS], completion.labels):
        lease = await fleet_cap.take(completion.user_id)
        if lease is None:
            log.warning("concurrent_stream_limit", limit=fleet_cap.limit, scope="fleet" if fleet_cap.in_force else "worker")
            raise TooManyStreams()
    try:
        return await relay.run()
    finally:
        fleet_cap.give_back(completion.user_id, lease)


async def _prepare_completion(request: web.Request, started: float) -> PreparedCompletion:
    """Validate, authenticate, provision and build the upstream body. The parsed request
    ends with this call, so a stream holds no copy of the conversation but the body, and
    that only until it is sent."""
    settings, metrics = request.app[keys.SETTINGS], request.app[keys.METRICS]
    chat, principal = await authorize_chat(request)
    labels = ChatLabels(chat.model, principal.service_type, principal.purpose)
    with refusals_recorded(metrics, labels):
        await request.app[keys.PROVISIONER].provision(principal.user_id)
    if chat.has_tools:
        metrics.requests_with_tools.labels(metrics.labels.model(chat.model), labels.service_type, labels.purpose).inc()
    return PreparedCompletion(
        body=completion_body(chat, user=principal.user_id, defaults=settings.completion),
        stream=chat.stream,
        labels=labels,
        outcome=CompletionOutcome(
            metrics, model=chat.model, service_type=labels.service_type, purpose=labels.purpose, started=started
        ),
        user_id=principal.user_id,
    )


async def search(request: web.Request) -> web.Response:
    """compatibility.md §1.9: the auth step, then the service-type rule (after auth, unlike chat's model
    rules), then provisioning. Search records no availability; its relay records latency
    and classified rejections."""
    app = request.app
    raw_body = await read_body(request)
    rules = app[keys.REQUEST_RULES]
    headers, query = rules.parse_search(raw_body, request.headers)
    principal = await authenticate_caller(request, headers, raw_body)
    service_type, purpose = principal.service_type, principal.purpose
    _count_country(request, service_type, SEARCH_MODEL_LABEL)
    rules.check_search_service_type(principal.service_type)
    await app[keys.PROVISIONER].provision(principal.user_id)
    return await relay_search(
        client=app[keys.LITELLM],
        body=search_body(query, user=principal.user_id, service_type=service_type, purpose=purpose),
        metrics=app[keys.METRICS],
        service_type=service_type,
        purpose=purpose,
        debug=app[keys.SETTINGS].server.debug,
    )
