"""Chat and search request models: parsing, validation and the rules that run before auth.

Validation failures collect every problem (headers and body together) into the
reference's 422 shape; the field allowlist of spec §4.1 drops unknown fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .catalog import PINNED_MODELS, PURPOSES, SEARCH_SERVICE_TYPES, ServiceType
from .errors import BadRequest, InvalidModelName, RequestInvalid, ServiceTypeNotForModel, validation_error
from .wire import JsonSyntaxError, decode_json

MODEL_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9./_-]{0,62}[a-z0-9])?$")

_BOOL_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_BOOL_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_SERVICE_TYPE_CHOICES = ", ".join(f"'{st.value}'" for st in list(ServiceType)[:-1]) + f" or '{list(ServiceType)[-1].value}'"


# -- typed field checks (each returns an error dict or None) ---------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "str": (lambda v: isinstance(v, str), "string_type", "Input should be a valid string"),
    "bool": (lambda v: isinstance(v, bool), "bool_type", "Input should be a valid boolean"),
    "int": (_is_int, "int_type", "Input should be a valid integer"),
    "float": (_is_number, "float_type", "Input should be a valid number"),
    "list": (lambda v: isinstance(v, list), "list_type", "Input should be a valid list"),
    "dict": (lambda v: isinstance(v, dict), "dict_type", "Input should be a valid dictionary"),
    "str|dict": (lambda v: isinstance(v, (str, dict)), "union_type", "Input should be a valid string or dictionary"),
    "str|list[str]": (
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, str) for i in v)),
        "union_type",
        "Input should be a valid string or a list of strings",
    ),
}

# The chat parameter allowlist (spec §4.1): name -> type. Null is accepted for all
# but `model`; unknown fields are dropped.
CHAT_FIELDS: Mapping[str, str] = {
    "model": "str",
    "stream": "bool",
    "messages": "list",
    "temperature": "float",
    "max_completion_tokens": "int",
    "top_p": "float",
    "tools": "list",
    "tool_choice": "str|dict",
    "n": "int",
    "seed": "int",
    "top_logprobs": "int",
    "stream_options": "dict",
    "logit_bias": "dict",
    "response_format": "dict",
    "stop": "str|list[str]",
    "max_tokens": "int",
    "presence_penalty": "float",
    "frequency_penalty": "float",
    "parallel_tool_calls": "bool",
    "logprobs": "bool",
    "text": "bool",
}


def _check_fields(payload: Mapping[str, Any], fields: Mapping[str, str], errors: list[dict[str, Any]]) -> dict[str, Any]:
    accepted: dict[str, Any] = {}
    for name, kind in fields.items():
        if name not in payload or payload[name] is None:
            continue
        value = payload[name]
        check, error_type, message = _FIELD_TYPES[kind]
        if check(value):
            accepted[name] = float(value) if kind == "float" else value
        else:
            errors.append(validation_error(("body", name), message, error_type))
    return accepted


_NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"


def parse_json_object(
    raw: bytes, errors: list[dict[str, Any]], *, not_object_message: str = _NOT_AN_OBJECT
) -> dict[str, Any] | None:
    """The body as a JSON object; a syntax error or a non-object is appended to `errors`
    (422), a body that cannot be held as values raises `BodyUnparseable` (400) at once."""
    try:
        payload = decode_json(raw)
    except JsonSyntaxError as exc:
        errors.append(validation_error(("body", exc.position), "JSON decode error", "json_invalid"))
        return None
    if not isinstance(payload, dict):
        errors.append(
            validation_error(
                ("body",),
                not_object_message,
                "model_attributes_type",
            )
        )
        return None
    return payload


# -- headers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProxyHeaders:
    """The headers the proxy routes understand (spec §1.1)."""

    authorization: str
    service_type: ServiceType
    purpose: str
    dev_authorization: str | None
    use_app_attest: bool
    use_qa_certificates: bool
    use_play_integrity: bool


def parse_bool_header(headers: Mapping[str, str], name: str, errors: list[dict[str, Any]]) -> bool:
    raw = headers.get(name)
    if raw is None:
        return False
    lowered = raw.strip().lower()
    if lowered in _BOOL_TRUE:
        return True
    if lowered in _BOOL_FALSE:
        return False
    errors.append(
        validation_error(("header", name), "Input should be a valid boolean, unable to interpret input", "bool_parsing")
    )
    return False


def parse_proxy_headers(
    headers: Mapping[str, str], errors: list[dict[str, Any]], *, default_service_type: ServiceType | None
) -> ProxyHeaders | None:
    authorization = headers.get("authorization")
    if authorization is None:
        errors.append(validation_error(("header", "authorization"), "Field required", "missing"))
    raw_service_type = headers.get("service-type")
    service_type: ServiceType | None = default_service_type
    if raw_service_type is not None:
        service_type = ServiceType.parse(raw_service_type)
        if service_type is None:
            errors.append(validation_error(("header", "service-type"), f"Input should be {_SERVICE_TYPE_CHOICES}", "enum"))
    elif default_service_type is None:
        errors.append(validation_error(("header", "service-type"), "Field required", "missing"))
    use_app_attest = parse_bool_header(headers, "use-app-attest", errors)
    use_qa = parse_bool_header(headers, "use-qa-certificates", errors)
    use_play = parse_bool_header(headers, "use-play-integrity", errors)
    if authorization is None or service_type is None:
        return None
    return ProxyHeaders(
        authorization=authorization,
        service_type=service_type,
        purpose=headers.get("purpose", ""),
        dev_authorization=headers.get("x-dev-authorization"),
        use_app_attest=use_app_attest,
        use_qa_certificates=use_qa,
        use_play_integrity=use_play,
    )


# -- chat -------------------------------------------------------------------------------


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
    errors: list[dict[str, Any]] = []
    proxy_headers = parse_proxy_headers(headers, errors, default_service_type=None)
    chat = parse_chat_body(raw, errors)
    if errors or proxy_headers is None:
        raise RequestInvalid(errors)
    return proxy_headers, chat


def parse_chat_body(raw: bytes, errors: list[dict[str, Any]]) -> ChatRequest:
    """The body alone; problems are appended to `errors` (the caller raises the 422)."""
    payload = parse_json_object(raw, errors)
    fields: dict[str, Any] = {}
    if payload is not None:
        fields = _check_fields(payload, CHAT_FIELDS, errors)
        if payload.get("model") is None and not any(e["loc"] == ["body", "model"] for e in errors):
            errors.append(validation_error(("body", "model"), "Field required", "missing"))
    return ChatRequest(fields)


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


@dataclass(frozen=True, slots=True)
class SearchRequest:
    query: str
    max_results: int


def parse_search(raw: bytes, headers: Mapping[str, str]) -> tuple[ProxyHeaders, SearchRequest]:
    errors: list[dict[str, Any]] = []
    proxy_headers = parse_proxy_headers(headers, errors, default_service_type=ServiceType.SEARCH)
    payload = parse_json_object(raw, errors)
    query, max_results = None, None
    if payload is not None:
        query = payload.get("query")
        if query is None:
            errors.append(validation_error(("body", "query"), "Field required", "missing"))
        elif not isinstance(query, str):
            errors.append(validation_error(("body", "query"), "Input should be a valid string", "string_type"))
        max_results = payload.get("max_results")
        if max_results is None:
            errors.append(validation_error(("body", "max_results"), "Field required", "missing"))
        elif not _is_int(max_results):
            errors.append(validation_error(("body", "max_results"), "Input should be a valid integer", "int_type"))
        elif max_results < 1:
            errors.append(
                validation_error(("body", "max_results"), "Input should be greater than or equal to 1", "greater_than_equal")
            )
        elif max_results > 10:
            errors.append(
                validation_error(("body", "max_results"), "Input should be less than or equal to 10", "less_than_equal")
            )
    if errors or proxy_headers is None:
        raise RequestInvalid(errors)
    assert isinstance(query, str) and isinstance(max_results, int)
    return proxy_headers, SearchRequest(query, max_results)


def check_search_service_type(service_type: ServiceType) -> None:
    if service_type not in SEARCH_SERVICE_TYPES:
        raise BadRequest(f"service-type header must be one of {[st.value for st in SEARCH_SERVICE_TYPES]}")
