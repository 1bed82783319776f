"""The request models: every body, header set and query the routes validate.

They are pydantic models because the reference's 422 bodies are pydantic's errors
(FastAPI's defaults); `validation.py` turns those errors into the wire shape. Bodies are
strict (a JSON string is not a boolean or a number), header and query values are text and
parsed as pydantic parses them (`true/1/yes/on...`, `"12"`). Unknown fields are dropped:
for chat that is the parameter allowlist of compatibility.md §4.1.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from . import headers as header_names
from .catalog import BUILTIN_CATALOG, DEFAULT_CHAT_SERVICE_TYPE, DEFAULT_SEARCH_SERVICE_TYPE, MODEL_NAME, Catalog
from .errors import BadRequest, InvalidModelName, RequestInvalid, ServiceTypeNotForModel
from .validation import HEADER, QUERY, Model, Problem, validate, validate_json_body

__all__ = ["MODEL_NAME"]

_JSON_BODY = ConfigDict(strict=True, extra="ignore", frozen=True)
# Header and query values arrive as text: lax, so pydantic parses "true" or "12".
_TEXT_VALUES = ConfigDict(extra="ignore", frozen=True)


# -- headers --------------------------------------------------------------------------


class ProxyHeaders(BaseModel):
    """The headers the proxy routes understand (compatibility.md §1.1); service-type is required.
    Declaration order is the order of the 422 items. `service_type` is an enum of the
    loaded catalogue's names in the models `RequestRules` builds (a 422 `enum` item lists
    them); this base only declares its place."""

    model_config = _TEXT_VALUES

    # repr=False: credentials never reach a log line or an error report.
    authorization: str = Field(repr=False)
    service_type: str = Field(alias=header_names.SERVICE_TYPE)
    use_app_attest: bool = Field(False, alias=header_names.USE_APP_ATTEST)
    use_qa_certificates: bool = Field(False, alias=header_names.USE_QA_CERTIFICATES)
    use_play_integrity: bool = Field(False, alias=header_names.USE_PLAY_INTEGRITY)
    purpose: str = Field("", alias=header_names.PURPOSE)
    dev_authorization: str | None = Field(None, alias=header_names.DEV_AUTHORIZATION, repr=False)


class AttestHeaders(BaseModel):
    """`POST /verify/attest`."""

    model_config = _TEXT_VALUES

    authorization: str = Field(repr=False)
    use_qa_certificates: bool = Field(False, alias=header_names.USE_QA_CERTIFICATES)


class MockNoAuthHeaders(BaseModel):
    """`POST /mock/chat/completions_no_auth`: service-type defaults to `ai`."""

    model_config = _TEXT_VALUES

    authorization: str = Field(repr=False)
    service_type: str = Field(DEFAULT_CHAT_SERVICE_TYPE, alias=header_names.SERVICE_TYPE)


class PrivacyFilterHeaders(BaseModel):
    """`POST /privacy-filter`: FxA only, so no service type or device headers are read."""

    model_config = _TEXT_VALUES

    authorization: str = Field(repr=False)


def _names_of(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(info.alias or name for name, info in model.model_fields.items())


_HEADER_NAMES: dict[type[BaseModel], tuple[str, ...]] = {
    AttestHeaders: _names_of(AttestHeaders),
    PrivacyFilterHeaders: _names_of(PrivacyFilterHeaders),
}


def _header_values(model: type[BaseModel], headers: Mapping[str, str]) -> dict[str, str]:
    """The model's headers only (first value of each): the validator never sees the rest."""
    names = _HEADER_NAMES.get(model) or _names_of(model)
    return {name: headers[name] for name in names if name in headers}


def parse_headers(model: type[Model], headers: Mapping[str, str], problems: list[Problem]) -> Model | None:
    return validate(model, _header_values(model, headers), HEADER, problems)


class RequestRules:
    """The catalogue's rules for requests: the header models whose service-type is an
    enum of its names, and the model, purpose and search checks. One per app (built from
    `Settings.catalog`), never mutated."""

    def __init__(self, catalog: Catalog = BUILTIN_CATALOG) -> None:
        self.catalog = catalog
        names = enum.StrEnum("ServiceType", {name: name for name in catalog.names})  # type: ignore[misc]
        self.proxy_headers: type[ProxyHeaders] = create_model(
            "ProxyHeaders", __base__=ProxyHeaders, service_type=(names, Field(alias=header_names.SERVICE_TYPE))
        )
        # `/v1/search`: service-type defaults to `search`.
        self.search_headers: type[ProxyHeaders] = create_model(
            "SearchHeaders",
            __base__=ProxyHeaders,
            service_type=(names, Field(names(DEFAULT_SEARCH_SERVICE_TYPE), alias=header_names.SERVICE_TYPE)),
        )
        self.mock_no_auth_headers: type[MockNoAuthHeaders] = create_model(
            "MockNoAuthHeaders",
            __base__=MockNoAuthHeaders,
            service_type=(names, Field(names(DEFAULT_CHAT_SERVICE_TYPE), alias=header_names.SERVICE_TYPE)),
        )
        self._header_names: dict[type[BaseModel], tuple[str, ...]] = {
            model: _names_of(model) for model in (self.proxy_headers, self.search_headers, self.mock_no_auth_headers)
        }
        self._pinned = catalog.pinned_models
        self._search_types = catalog.search_types

    def parse_headers(self, model: type[Model], headers: Mapping[str, str], problems: list[Problem]) -> Model | None:
        names = self._header_names[model]
        return validate(model, {name: headers[name] for name in names if name in headers}, HEADER, problems)

    def parse_proxy_headers(
        self, headers: Mapping[str, str], errors: list[Problem], *, search: bool = False
    ) -> ProxyHeaders | None:
        """The proxy header set; service-type is required, or defaults to `search` (`search=True`)."""
        return self.parse_headers(self.search_headers if search else self.proxy_headers, headers, errors)

    def parse_chat(self, raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, ChatRequest]:
        """Validate headers and body together (one 422 listing every problem)."""
        errors: list[Problem] = []
        proxy_headers = self.parse_proxy_headers(headers, errors)
        chat = parse_chat_body(raw, errors)
        if errors or proxy_headers is None or chat is None:
            raise RequestInvalid(errors)
        return proxy_headers, chat

    def parse_search(self, raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, SearchRequest]:
        errors: list[Problem] = []
        proxy_headers = self.parse_proxy_headers(headers, errors, search=True)
        search = validate_json_body(SearchRequest, raw, errors)
        if errors or proxy_headers is None or search is None:
            raise RequestInvalid(errors)
        return proxy_headers, search

    def check_model_service_type(self, model: str, service_type: str) -> None:
        allowed = self._pinned.get(model)
        if allowed is not None:
            if service_type not in allowed:
                raise ServiceTypeNotForModel(
                    f"Invalid service-type value for model {model}. Should be one of {list(allowed)}"
                )
            return
        pinned_models = [m for m, types in self._pinned.items() if service_type in types]
        if pinned_models:
            raise ServiceTypeNotForModel(
                f"Invalid service-type value {service_type} for model {model}. "
                f"Service type {service_type} is only valid for models {pinned_models}"
            )

    def resolve_purpose(self, raw: str, service_type: str, *, required: bool) -> str:
        """The trimmed purpose, validated against the service type's list (compatibility.md §2.2)."""
        purpose = raw.strip()
        allowed = self.catalog.purposes(service_type)
        if purpose:
            if purpose not in allowed:
                raise BadRequest(
                    f"Invalid header 'purpose' for service-type '{service_type}'. Valid values: {', '.join(allowed)}"
                )
            return purpose
        if required and allowed:
            raise BadRequest(
                f"Header 'purpose' is required for service-type '{service_type}'. Valid values: {', '.join(allowed)}"
            )
        return ""

    def check_search_service_type(self, service_type: str) -> None:
        if service_type not in self._search_types:
            raise BadRequest(f"service-type header must be one of {list(self._search_types)}")


# -- chat -------------------------------------------------------------------------------


class ChatBody(BaseModel):
    """The chat body (compatibility.md §4.1). Null is accepted for every field but `model`; fields
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


def parse_chat_body(raw: bytes, errors: list[Problem]) -> ChatRequest | None:
    """The body alone; problems are appended to `errors` (the caller raises the 422)."""
    body = validate_json_body(ChatBody, raw, errors)
    if body is None:
        return None
    # The instance's field values as they are (model_dump would copy every message, and 22
    # getattr calls cost twice this); extra="ignore" keeps anything but the fields out.
    return ChatRequest({name: value for name, value in body.__dict__.items() if value is not None})


def check_model_name(model: str) -> None:
    """The model-name rule, before any auth or I/O (400 {"detail": {"error": 8}})."""
    if not MODEL_NAME.match(model):
        raise InvalidModelName()


# -- search -----------------------------------------------------------------------------


class SearchRequest(BaseModel):
    """The search body: both fields required, `1 <= max_results <= 10`."""

    model_config = _JSON_BODY

    query: str
    max_results: int = Field(ge=1, le=10)


# -- /privacy-filter ------------------------------------------------------------------------


class PrivacyFilterRequest(BaseModel):
    """`POST /privacy-filter` (compatibility.md §1.11): the strings to mask; nothing else is read."""

    model_config = _JSON_BODY

    # repr=False: the items are what the client wants masked, never to be logged.
    items: list[str] = Field(repr=False)


def parse_privacy_filter(raw: bytes, headers: Mapping[str, str]) -> tuple[PrivacyFilterHeaders, PrivacyFilterRequest]:
    """Headers and body together (one 422 listing every problem)."""
    errors: list[Problem] = []
    filter_headers = parse_headers(PrivacyFilterHeaders, headers, errors)
    body = validate_json_body(PrivacyFilterRequest, raw, errors)
    if errors or filter_headers is None or body is None:
        raise RequestInvalid(errors)
    return filter_headers, body


# -- /verify -------------------------------------------------------------------------------


class PlayRequest(BaseModel):
    """`POST /verify/play` (compatibility.md §1.5). An absent `package_name` is the configured default
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


# The built-in catalogue's rules, for tools and tests that parse without an app; the routes
# use their app's `RequestRules` (keys.REQUEST_RULES), built from the loaded catalogue.
BUILTIN_RULES = RequestRules(BUILTIN_CATALOG)


def parse_chat(raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, ChatRequest]:
    return BUILTIN_RULES.parse_chat(raw, headers)


def parse_search(raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, SearchRequest]:
    return BUILTIN_RULES.parse_search(raw, headers)
