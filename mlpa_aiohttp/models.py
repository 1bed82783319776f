"""The request models: every body, header set and query the routes validate.

They are pydantic models because the reference's 422 bodies are pydantic's errors
(FastAPI's defaults); `validation.py` turns those errors into the wire shape. Bodies are
strict (a JSON string is not a boolean or a number), header and query values are text and
parsed as pydantic parses them (`true/1/yes/on...`, `"12"`). Unknown fields are dropped:
for chat that is the parameter allowlist of spec §4.1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from . import headers as header_names
from .catalog import PINNED_MODELS, PURPOSES, SEARCH_SERVICE_TYPES, ServiceType
from .errors import BadRequest, InvalidModelName, RequestInvalid, ServiceTypeNotForModel
from .validation import HEADER, QUERY, Model, Problem, validate, validate_json_body

MODEL_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9./_-]{0,62}[a-z0-9])?$")

_JSON_BODY = ConfigDict(strict=True, extra="ignore", frozen=True)
# Header and query values arrive as text: lax, so pydantic parses "true" or "12".
_TEXT_VALUES = ConfigDict(extra="ignore", frozen=True)


# -- headers --------------------------------------------------------------------------


class ProxyHeaders(BaseModel):
    """The headers the proxy routes understand (spec §1.1); service-type is required.
    Declaration order is the order of the 422 items."""

    model_config = _TEXT_VALUES

    # repr=False: credentials never reach a log line or an error report.
    authorization: str = Field(repr=False)
    service_type: ServiceType = Field(alias=header_names.SERVICE_TYPE)
    use_app_attest: bool = Field(False, alias=header_names.USE_APP_ATTEST)
    use_qa_certificates: bool = Field(False, alias=header_names.USE_QA_CERTIFICATES)
    use_play_integrity: bool = Field(False, alias=header_names.USE_PLAY_INTEGRITY)
    purpose: str = Field("", alias=header_names.PURPOSE)
    dev_authorization: str | None = Field(None, alias=header_names.DEV_AUTHORIZATION, repr=False)


class SearchHeaders(ProxyHeaders):
    """`/v1/search`: service-type defaults to `search`."""

    service_type: ServiceType = Field(ServiceType.SEARCH, alias=header_names.SERVICE_TYPE)


class AttestHeaders(BaseModel):
    """`POST /verify/attest`."""

    model_config = _TEXT_VALUES

    authorization: str = Field(repr=False)
    use_qa_certificates: bool = Field(False, alias=header_names.USE_QA_CERTIFICATES)


class MockNoAuthHeaders(BaseModel):
    """`POST /mock/chat/completions_no_auth`: service-type defaults to `ai`."""

    model_config = _TEXT_VALUES

    authorization: str = Field(repr=False)
    service_type: ServiceType = Field(ServiceType.AI, alias=header_names.SERVICE_TYPE)


_HEADER_NAMES: dict[type[BaseModel], tuple[str, ...]] = {
    model: tuple(info.alias or name for name, info in model.model_fields.items())
    for model in (ProxyHeaders, SearchHeaders, AttestHeaders, MockNoAuthHeaders)
}


def _header_values(model: type[BaseModel], headers: Mapping[str, str]) -> dict[str, str]:
    """The model's headers only (first value of each): the validator never sees the rest."""
    return {name: headers[name] for name in _HEADER_NAMES[model] if name in headers}
_PROXY_HEADER_SETS: dict[ServiceType | None, type[ProxyHeaders]] = {None: ProxyHeaders, ServiceType.SEARCH: SearchHeaders}


def parse_headers(model: type[Model], headers: Mapping[str, str], problems: list[Problem]) -> Model | None:
    return validate(model, _header_values(model, headers), HEADER, problems)


def parse_proxy_headers(
    headers: Mapping[str, str], errors: list[Problem], *, default_service_type: ServiceType | None
) -> ProxyHeaders | None:
    """The proxy header set; `default_service_type` is None (required) or `search`."""
    return parse_headers(_PROXY_HEADER_SETS[default_service_type], headers, errors)


# -- chat -------------------------------------------------------------------------------


class ChatBody(BaseModel):
    """The chat body (spec §4.1). Null is accepted for every field but `model`; fields
    that carry message content stay out of the repr (and so out of logs and reports)."""

    model_config = _JSON_BODY

    # The pattern and defaults below are documentation only (`openapi`): the model-name
    # rule is a 400 checked later (`check_model_name`), and a null `stream` means false.
    model: str = Field(json_schema_extra={"pattern": MODEL_NAME.pattern})
    stream: bool | None = Field(None, json_schema_extra={"default": False})
    messages: list[Any] | None = Field(None, repr=False, json_schema_extra={"items": {"type": "object"}})
    temperature: float | None = None
    max_completion_tokens: int | None = None
    top_p: float | None = None
    tools: list[Any] | None = Field(None, repr=False)
    tool_choice: str | dict[str, Any] | None = Field(None, repr=False)
    n: int | None = None
    seed: int | None = None
    top_logprobs: int | None = None
    stream_options: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = Field(None, repr=False)
    response_format: dict[str, Any] | None = Field(None, repr=False)
    stop: str | list[str] | None = Field(None, repr=False)
    max_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    text: bool | None = None


# The chat parameter allowlist (spec §4.1), in declaration order.
CHAT_FIELDS: tuple[str, ...] = tuple(ChatBody.model_fields)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """An accepted chat request: only allowlisted, non-null fields."""

    # repr=False: message content must never reach a log line or an error report.
    fields: Mapping[str, Any] = field(repr=False)

    @property
    def model(self) -> str:
        return self.fields["model"]

    @property
    def stream(self) -> bool:
        return bool(self.fields.get("stream", False))

    @property
    def has_tools(self) -> bool:
        return bool(self.fields.get("tools"))


def parse_chat(raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, ChatRequest]:
    """Validate headers and body together (one 422 listing every problem)."""
    errors: list[Problem] = []
    proxy_headers = parse_proxy_headers(headers, errors, default_service_type=None)
    chat = parse_chat_body(raw, errors)
    if errors or proxy_headers is None or chat is None:
        raise RequestInvalid(errors)
    return proxy_headers, chat


def parse_chat_body(raw: bytes, errors: list[Problem]) -> ChatRequest | None:
    """The body alone; problems are appended to `errors` (the caller raises the 422)."""
    body = validate_json_body(ChatBody, raw, errors)
    if body is None:
        return None
    # getattr, not model_dump: dumping would copy every message, for nothing.
    return ChatRequest({name: value for name in CHAT_FIELDS if (value := getattr(body, name)) is not None})


def check_model_name(model: str) -> None:
    """The model-name rule, before any auth or I/O (400 {"detail": {"error": 8}})."""
    if not MODEL_NAME.match(model):
        raise InvalidModelName()


def check_model_service_type(model: str, service_type: ServiceType) -> None:
    allowed = PINNED_MODELS.get(model)
    if allowed is not None:
        if service_type not in allowed:
            raise ServiceTypeNotForModel(
                f"Invalid service-type value for model {model}. Should be one of {[st.value for st in allowed]}"
            )
        return
    pinned_models = [m for m, types in PINNED_MODELS.items() if service_type in types]
    if pinned_models:
        raise ServiceTypeNotForModel(
            f"Invalid service-type value {service_type.value} for model {model}. "
            f"Service type {service_type.value} is only valid for models {pinned_models}"
        )


def resolve_purpose(raw: str, service_type: ServiceType, *, required: bool) -> str:
    """The trimmed purpose, validated against the service type's list (spec §2.2)."""
    purpose = raw.strip()
    allowed = PURPOSES[service_type]
    if purpose:
        if purpose not in allowed:
            raise BadRequest(
                f"Invalid header 'purpose' for service-type '{service_type.value}'. Valid values: {', '.join(allowed)}"
            )
        return purpose
    if required and allowed:
        raise BadRequest(
            f"Header 'purpose' is required for service-type '{service_type.value}'. Valid values: {', '.join(allowed)}"
        )
    return ""


# -- search -----------------------------------------------------------------------------


class SearchRequest(BaseModel):
    """The search body: both fields required, `1 <= max_results <= 10`."""

    model_config = _JSON_BODY

    query: str
    max_results: int = Field(ge=1, le=10)


def parse_search(raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, SearchRequest]:
    errors: list[Problem] = []
    proxy_headers = parse_proxy_headers(headers, errors, default_service_type=ServiceType.SEARCH)
    search = validate_json_body(SearchRequest, raw, errors)
    if errors or proxy_headers is None or search is None:
        raise RequestInvalid(errors)
    return proxy_headers, search


def check_search_service_type(service_type: ServiceType) -> None:
    if service_type not in SEARCH_SERVICE_TYPES:
        raise BadRequest(f"service-type header must be one of {[st.value for st in SEARCH_SERVICE_TYPES]}")


# -- /verify -------------------------------------------------------------------------------


class PlayRequest(BaseModel):
    """`POST /verify/play` (spec §1.5). An absent `package_name` is the configured default
    (see `package_name_or`); a null one is refused, as any non-string."""

    model_config = _JSON_BODY

    integrity_token: str = Field(repr=False)
    user_id: str
    package_name: str = ""

    def package_name_or(self, default: str) -> str:
        return self.package_name if "package_name" in self.model_fields_set else default


class ChallengeQuery(BaseModel):
    """`GET /verify/challenge`."""

    model_config = _TEXT_VALUES

    key_id_b64: str


# -- admin ---------------------------------------------------------------------------------

USERS_LIMIT_DEFAULT, USERS_LIMIT_MIN, USERS_LIMIT_MAX = 50, 1, 200


class UsersPage(BaseModel):
    """`GET /user` paging."""

    model_config = _TEXT_VALUES

    limit: int = Field(USERS_LIMIT_DEFAULT, ge=USERS_LIMIT_MIN, le=USERS_LIMIT_MAX)
    offset: int = Field(0, ge=0)


class BudgetUpdate(BaseModel):
    """`POST /user/{user_id}/budget`; the name is checked against the catalogue after."""

    model_config = _JSON_BODY

    service_type: str


def parse_query(model: type[Model], query: Mapping[str, str], problems: list[Problem]) -> Model | None:
    """The model's query parameters only (first value of each)."""
    return validate(model, {name: query[name] for name in model.model_fields if name in query}, QUERY, problems)
