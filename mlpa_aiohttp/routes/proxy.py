"""`POST /v1/chat/completions` and `POST /v1/search`: validate, authenticate, provision,
relay (compatibility.md §1.8, §1.9). Each step short-circuits with a domain error; what a refused chat
request means to the metrics is the error's own (`errors.ApiError`), recorded by
`refusals_recorded`. Once the relay runs, `CompletionOutcome` records instead."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from aiohttp import web

from .. import keys
from ..errors import INVALID_AUTH_REQUEST, ApiError, BadRequest, OverTrafficContract, TooManyStreams
from ..fleet.stream_cap import FleetStreamCap
from ..fleet.traffic_contracts import Admission, TrafficContracts
from ..headers import GEO_COUNTRY, LITELLM_VIRTUAL_KEY, STREAM_KEEPALIVE
from ..models import ChatRequest, ProxyHeaders, check_model_name
from ..observability import log_context
from ..observability.labels import clamp_country
from ..observability.metrics import Metrics
from ..observability.timing import AUTH, DB, TRAFFIC_CONTRACT, UPSTREAM, RequestTimings, span, timed
from ..principal import Principal
from ..relay.json_relay import relay_completion, relay_search
from ..relay.keepalive import FirstByteKeepAlive
from ..relay.outcome import CompletionOutcome, CountAfterUpstream
from ..relay.stream import StreamRelay
from ..settings import TRUTHY, Settings
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


def custom_virtual_key(request: web.Request, settings: Settings) -> str | None:
    """The client's own LiteLLM key (`litellm-virtual-key`, MLPA 1.0.39), when
    ALLOW_CUSTOM_VIRTUAL_KEY allows it and the trimmed value is not blank; else None, the
    service's key. Not checked here: a key LiteLLM does not know is LiteLLM's to refuse."""
    if not settings.upstream.allow_custom_virtual_key:
        return None
    return request.headers.get(LITELLM_VIRTUAL_KEY, "").strip() or None


def _count_country(request: web.Request, service_type: str, model_label: str) -> None:
    """Once the caller is authenticated (compatibility.md §6: chat and search alike)."""
    request.app[keys.METRICS].requests_by_country.labels(
        service_type, model_label, clamp_country(request.headers.get(GEO_COUNTRY))
    ).inc()


@dataclass(frozen=True, slots=True)
class ChatLabels:
    """The labels of a chat request's availability and rejection samples. The purpose is
    the header's, trimmed: the same value the authenticated principal carries. `country`
    is the raw `X-Geo-Country` value, for the by-country availability twin."""

    model: str
    service_type: str
    purpose: str
    country: str | None


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
            metrics.chat_availability(error.availability_reason, country=labels.country, **kwargs)
        raise


async def authorize_chat(request: web.Request, timings: RequestTimings | None) -> tuple[ChatRequest, Principal]:
    """Steps shared by the chat route and the mock chat route (compatibility.md §1.7, §1.8): validate,
    check model and purpose, authenticate, each refusal recorded; the country metric once
    the caller is known."""
    raw_body = await read_body(request)
    rules, metrics = request.app[keys.REQUEST_RULES], request.app[keys.METRICS]
    headers, chat = rules.parse_chat(raw_body, request.headers)
    log_context.bind(model=chat.model)
    labels = ChatLabels(chat.model, str(headers.service_type), headers.purpose.strip(), request.headers.get(GEO_COUNTRY))
    with span(timings, AUTH), refusals_recorded(metrics, labels):
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
    # The client's own LiteLLM key, or None for MLPA_VIRTUAL_KEY.
    virtual_key: str | None = None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    app = request.app
    settings = app[keys.SETTINGS]
    timings = request[keys.REQUEST_TIMINGS]
    completion = await _prepare_completion(request, started, timings)
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
            # A timed stream takes the regular relay, whose loop keeps the stream's tail.
            fast_path=app[keys.RELAY_FAST_PATH] if timings is None else None,
            timings=timings,
            virtual_key=completion.virtual_key,
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
    with span(timings, UPSTREAM):
        return await relay_completion(
            request,
            client=client,
            body=completion.body,
            outcome=completion.outcome,
            debug=settings.server.debug,
            virtual_key=completion.virtual_key,
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
    """Claim one of the caller's open-stream slots or refuse with 429, error 11. No await
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


async def _prepare_completion(
    request: web.Request, started: float, timings: RequestTimings | None
) -> PreparedCompletion:
    """Validate, authenticate, provision and build the upstream body. The parsed request
    ends with this call, so a stream holds no copy of the conversation but the body, and
    that only until it is sent."""
    app = request.app
    settings, metrics = app[keys.SETTINGS], app[keys.METRICS]
    chat, principal = await authorize_chat(request, timings)
    country = request.headers.get(GEO_COUNTRY)
    labels = ChatLabels(chat.model, principal.service_type, principal.purpose, country)
    contracts = app.get(keys.TRAFFIC_CONTRACTS)
    with refusals_recorded(metrics, labels):
        admission: Admission | None = None
        if contracts is None:
            traffic_contracts_off(timings)
        else:
            admission = await admit_by_traffic_contract(request, contracts, principal.service_type, timings)
        await timed(timings, DB, app[keys.PROVISIONER].provision(principal.user_id))
    if chat.has_tools:
        metrics.requests_with_tools.labels(metrics.labels.model(chat.model), labels.service_type, labels.purpose).inc()
    return PreparedCompletion(
        body=completion_body(
            chat,
            user=principal.user_id,
            defaults=settings.completion,
            purpose=principal.purpose,
            country=country,
        ),
        stream=chat.stream,
        labels=labels,
        outcome=CompletionOutcome(
            metrics,
            model=chat.model,
            service_type=labels.service_type,
            purpose=labels.purpose,
            country=country,
            started=started,
            count_after_upstream=_traffic_contract_count(contracts, labels.service_type, admission),
        ),
        user_id=principal.user_id,
        virtual_key=custom_virtual_key(request, settings),
    )


async def search(request: web.Request) -> web.Response:
    """compatibility.md §1.9: the auth step, then the service-type rule (after auth, unlike chat's model
    rules), then provisioning. Search records no availability; its relay records latency
    and classified rejections."""
    app = request.app
    raw_body = await read_body(request)
    rules = app[keys.REQUEST_RULES]
    headers, query = rules.parse_search(raw_body, request.headers)
    timings = request[keys.REQUEST_TIMINGS]
    with span(timings, AUTH):
        principal = await authenticate_caller(request, headers, raw_body)
    service_type, purpose = principal.service_type, principal.purpose
    _count_country(request, service_type, SEARCH_MODEL_LABEL)
    rules.check_search_service_type(principal.service_type)
    contracts = app.get(keys.TRAFFIC_CONTRACTS)
    admission: Admission | None = None
    if contracts is None:
        traffic_contracts_off(timings)
    else:
        admission = await admit_by_traffic_contract(request, contracts, service_type, timings)
    await timed(timings, DB, app[keys.PROVISIONER].provision(principal.user_id))
    with span(timings, UPSTREAM):
        return await relay_search(
            client=app[keys.LITELLM],
            body=search_body(query, user=principal.user_id),
            metrics=app[keys.METRICS],
            service_type=service_type,
            purpose=purpose,
            debug=app[keys.SETTINGS].server.debug,
            virtual_key=custom_virtual_key(request, app[keys.SETTINGS]),
            count_after_upstream=_traffic_contract_count(contracts, service_type, admission),
        )


def traffic_contracts_off(timings: RequestTimings | None) -> None:
    """No traffic-contract check (contracts are off), but its `traffic_contract` span all the
    same, empty: the reference records it whether or not contracts are on."""
    if timings is not None:
        with timings.span(TRAFFIC_CONTRACT):
            pass


async def admit_by_traffic_contract(
    request: web.Request, contracts: TrafficContracts, service_type: str, timings: RequestTimings | None
) -> Admission | None:
    """The traffic-contract check before upstream (compatibility.md §1.8, §1.9), contracts
    being on: the request's modes for its metric sample; raises the 503 (fail-closed) or,
    enforcing, the 429 (error 12). Off, `traffic_contracts_off` stands in for it."""
    try:
        with span(timings, TRAFFIC_CONTRACT):
            admission = await contracts.admit(service_type)
    except OverTrafficContract as refusal:
        request[keys.TRAFFIC_CONTRACT_MODES] = refusal.modes
        raise
    if admission is not None:
        request[keys.TRAFFIC_CONTRACT_MODES] = admission.modes
    return admission


def _traffic_contract_count(
    contracts: TrafficContracts | None, service_type: str, admission: Admission | None
) -> CountAfterUpstream | None:
    """What counts the request once it reached upstream; None when contracts are off."""
    if contracts is None:
        return None
    return functools.partial(contracts.count_after, service_type, admission)
