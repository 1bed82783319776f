"""The OpenAPI 3.1 document of the service, built from the same catalogue the code uses
(the loaded one's service types and purposes; chat fields, error codes), so the docs
cannot drift from them.

It documents the bodies clients really receive (compatibility.md §1.1, §11.11): `{"detail": ...}` for
most errors, the 422 list shape, the bare `{"error": 3}` 413 of the chat route, and the SSE
frames a stream may end with. `build_document(mock_routes=..., catalog=...)` includes `/mock/*` only
when they are mounted.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs

from .. import __version__
from .. import headers as header_names
from ..catalog import BUILTIN_CATALOG, DEFAULT_CHAT_SERVICE_TYPE, DEFAULT_SEARCH_SERVICE_TYPE, Catalog
from ..errors import (
    CODE_BUDGET_EXCEEDED,
    CODE_GLOBAL_BUDGET_EXCEEDED,
    CODE_INVALID_MODEL_NAME,
    CODE_INVALID_REQUEST,
    CODE_OVER_TRAFFIC_CONTRACT,
    CODE_PAYLOAD_TOO_LARGE,
    CODE_RATE_LIMITED,
    CODE_SIGNUP_CAP,
    CODE_TOO_MANY_STREAMS,
    CODE_UPSTREAM_RATE_LIMITED,
    GENERIC_UPSTREAM_MESSAGE,
    GLOBAL_BUDGET_RETRY_AFTER_SECONDS,
    TOO_MANY_STREAMS_RETRY_AFTER_SECONDS,
)
from ..models import ChatBody, PrivacyFilterRequest, SearchRequest
from ..relay.sse import SHUTDOWN_EVENT
from ..settings import TRUTHY
from ..store.base import MEMORY_STORE_STATE
from ..upstream.classify import BUDGET_EXCEEDED, RATE_LIMITED, UPSTREAM_RATE_LIMITED
from ..validation import VALIDATION_ERROR_SCHEMA
from ..wire import BODY_UNPARSEABLE, MAX_JSON_DEPTH

Schema = dict[str, Any]


def chat_doc_service_types(catalog: Catalog) -> tuple[str, ...]:
    """The docs offer search types only on search and the others only on chat (compatibility.md §1.10);
    at runtime both routes accept every type of the catalogue."""
    return tuple(name for name in catalog.names if name not in catalog.search_types)

ERROR_CODES_TEXT = f"""Error codes (`error`):
* {CODE_BUDGET_EXCEEDED}: budget exceeded (429, `Retry-After: {BUDGET_EXCEEDED.retry_after}`)
* {CODE_RATE_LIMITED}: rate limit (TPM/RPM) of the platform (429, `Retry-After: {RATE_LIMITED.retry_after}`)
* {CODE_PAYLOAD_TOO_LARGE}: request or context too large (413)
* {CODE_SIGNUP_CAP}: maximum number of signed-in users reached (403)
* {CODE_UPSTREAM_RATE_LIMITED}: upstream throttling without rate-limit wording (429, `Retry-After: {UPSTREAM_RATE_LIMITED.retry_after}`); a provider 429 wrapped by LiteLLM is {CODE_RATE_LIMITED}
* {CODE_INVALID_MODEL_NAME}: invalid model name (400)
* {CODE_INVALID_REQUEST}: invalid request body (400)
* {CODE_GLOBAL_BUDGET_EXCEEDED}: the service's own (global) LiteLLM budget is spent (500, `Retry-After: {GLOBAL_BUDGET_RETRY_AFTER_SECONDS}`)
* {CODE_TOO_MANY_STREAMS}: the caller already holds `MAX_CONCURRENT_STREAMS_PER_USER` open streams
  (429, `Retry-After: {TOO_MANY_STREAMS_RETRY_AFTER_SECONDS}`; only when that cap is set; not a code of the reference)
* {CODE_OVER_TRAFFIC_CONTRACT}: the fleet's traffic contract is over its limit for this window (429, `Retry-After`: the
  seconds until the window ends; only with `TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT`; not a code of the reference)"""

BODY_UNPARSEABLE_TEXT = (
    f"JSON values (nested deeper than {MAX_JSON_DEPTH}, not UTF-8, an oversized integer): "
    f'`{{"detail": "{BODY_UNPARSEABLE}"}}`'
)

STREAM_TEXT = f"""`text/event-stream; charset=utf-8`. The status is always 200; LiteLLM's
`data: {...}` chunks are relayed byte for byte and end with `data: [DONE]`. A stream that
fails ends instead with one error frame and no `[DONE]`:
* `data: {{"error": N}}`: a classified upstream error (codes above);
* `data: {{"code": S, "error": "{GENERIC_UPSTREAM_MESSAGE}"}}`: an unclassified
  upstream error with status S (502 for transport errors, mid-stream failures and an empty
  upstream stream);
* `{SHUTDOWN_EVENT.decode().strip()}`: the server stopped during the
  stream (graceful shutdown)."""

_SSE_EVENT: Schema = {
    "type": "object",
    "properties": {
        "data": {"type": "string", "description": "A JSON chunk, an error frame or `[DONE]`."},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}

def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema, description: str, **extra: Any) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}, **extra}


def _header(name: str, description: str, schema: Schema | None = None, *, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": "header",
        "required": required,
        "description": description,
        "schema": schema or {"type": "string"},
    }


_BOOL_HEADER = {"type": "boolean", "default": False}
_RETRY_AFTER = {
    str(hdrs.RETRY_AFTER): {
        "description": (
            f"Seconds to wait ({BUDGET_EXCEEDED.retry_after} for code {CODE_BUDGET_EXCEEDED}, "
            f"{RATE_LIMITED.retry_after} for {CODE_RATE_LIMITED}, {UPSTREAM_RATE_LIMITED.retry_after} for "
            f"{CODE_UPSTREAM_RATE_LIMITED}, {GLOBAL_BUDGET_RETRY_AFTER_SECONDS} for {CODE_GLOBAL_BUDGET_EXCEEDED}, "
            f"{TOO_MANY_STREAMS_RETRY_AFTER_SECONDS} for {CODE_TOO_MANY_STREAMS},"
            f" until the traffic contract's window ends for {CODE_OVER_TRAFFIC_CONTRACT})"
        ),
        "schema": {"type": "integer"},
    }
}


def _truthy_text() -> str:
    """The header values that switch an option on, as the settings read them."""
    first, *others = sorted(TRUTHY, key=lambda v: (len(v), v))
    return f"`{first}` (or " + ", ".join(f"`{v}`" for v in others) + ")"


def _proxy_headers(catalog: Catalog, service_types: tuple[str, ...], *, default: str | None) -> list[Schema]:
    service_type: Schema = {"type": "string", "enum": list(service_types)}
    if default is not None:
        service_type["default"] = default
    purposes = "; ".join(f"`{st}`: {', '.join(catalog.purposes(st)) or '(none)'}" for st in catalog.names)
    return [
        _header(
            header_names.SERVICE_TYPE,
            "Which product feature the request is for; selects the LiteLLM end user "
            "(`<uid>:<service-type>`) and its budget tier.",
            service_type,
            required=default is None,
        ),
        _header(
            header_names.PURPOSE,
            "What the request is for, validated per service type (optional unless "
            f"`MLPA_REQUIRE_PURPOSE_HEADER=true`). Allowed values: {purposes}.",
            {"type": "string", "enum": list(catalog.all_purposes)},
        ),
        _header(
            header_names.DEV_AUTHORIZATION,
            "The experimentation token; required with the `*-dev` service types on every auth path.",
        ),
        _header(
            header_names.USE_APP_ATTEST,
            "Authenticate with an App Attest assertion: `Authorization` carries the assertion "
            "JWT (see the `AssertionAuth` schema); the signed data is SHA-256 of the raw body.",
            _BOOL_HEADER,
        ),
        _header(header_names.USE_QA_CERTIFICATES, "Verify App Attest against the QA root (only if the server allows it).", _BOOL_HEADER),
        _header(
            header_names.USE_PLAY_INTEGRITY,
            "Authenticate with an MLPA access token from `POST /verify/play` (`Authorization: Bearer <token>`).",
            _BOOL_HEADER,
        ),
        _header(
            header_names.LITELLM_VIRTUAL_KEY,
            "The caller's own LiteLLM virtual key, sent to LiteLLM instead of the service's (whitespace trimmed; "
            "blank: the service's). Honoured only when the server sets `ALLOW_CUSTOM_VIRTUAL_KEY=true`, "
            "ignored otherwise; not checked by the service (a key LiteLLM does not know is LiteLLM's error).",
        ),
        _header(header_names.GEO_COUNTRY, "ISO 3166-1 alpha-2 country stamped by the edge (metrics only)."),
        _header(header_names.SESSION_ID, "Client session id (logging only)."),
        _debug_timing_header(),
    ]


def _proxy_error_responses(*, bare_413: bool) -> dict[str, Schema]:
    too_large = _ref("ErrorCode") if bare_413 else _ref("DetailErrorCode")
    return {
        "400": _json(
            {"oneOf": [_ref("DetailErrorCode"), _ref("DetailMessage"), _ref("DetailErrorMessage")]},
            "Invalid model name (`{\"detail\": {\"error\": 8}}`), invalid request (code 9), a model / "
            "service-type / purpose mismatch (`{\"detail\": \"...\"}`), a body that cannot be read as "
            + BODY_UNPARSEABLE_TEXT
            + ", or an unclassified upstream 400.",
        ),
        "401": _json(_ref("DetailMessage"), "Authentication failed, e.g. `{\"detail\": \"Invalid FxA auth\"}`."),
        "403": _json(
            _ref("DetailErrorCodeOrMessage"),
            "Signup cap reached (`{\"detail\": {\"error\": 4}}`) or user blocked "
            "(`{\"detail\": {\"error\": \"User is blocked.\"}}`).",
        ),
        "413": _json(
            too_large,
            "Request body larger than `MAX_REQUEST_SIZE_BYTES` (by Content-Length or bytes read), "
            + ("answered with the bare `{\"error\": 3}`" if bare_413 else "answered as `{\"detail\": {\"error\": 3}}`")
            + "; or the context window was exceeded (`{\"detail\": {\"error\": 3}}`).",
        ),
        "422": _json(_ref("HTTPValidationError"), "Invalid headers or body."),
        "429": _json(
            _ref("DetailErrorCode"),
            f"Budget or rate limit (codes 1, 2, 5), or too many open streams (code {CODE_TOO_MANY_STREAMS}, streamed chat"
            f" only), or over the traffic contract (code {CODE_OVER_TRAFFIC_CONTRACT}, enforced contracts only).",
            headers=_RETRY_AFTER,
        ),
        "503": _json(
            _ref("DetailErrorMessage"),
            "Traffic contracts fail closed and Redis failed the check: "
            "`{\"detail\": {\"error\": \"Traffic contract enforcement unavailable.\"}}`.",
        ),
        "500": _json(
            _ref("DetailAny"),
            f"The service's global budget is spent (`{{\"detail\": {{\"error\": {CODE_GLOBAL_BUDGET_EXCEEDED}}}}}`, "
            f"`Retry-After: {GLOBAL_BUDGET_RETRY_AFTER_SECONDS}`), user provisioning failed, or an unexpected error.",
            headers=_RETRY_AFTER,
        ),
        "502": _json(_ref("DetailErrorMessage"), "LiteLLM could not be reached: `{\"detail\": {\"error\": \"Failed to proxy request\"}}`."),
    }


def _admin_key_responses() -> dict[str, Schema]:
    return {
        "401": _json(
            {"type": "object", "properties": {"detail": {"type": "object", "properties": {"error": {"const": "Unauthorized"}}}}},
            "Missing or wrong admin key: `{\"detail\": {\"error\": \"Unauthorized\"}}`.",
        ),
    }


def _user_id_param() -> Schema:
    return {"name": "user_id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "LiteLLM end-user id, `<uid>:<service-type>`."}


def _user_update(description: str, error: str, *, body: Schema | None = None) -> Schema:
    operation: Schema = {
        "tags": ["users"],
        "summary": description,
        "security": [{"MasterKey": []}],
        "parameters": [_user_id_param()],
        "responses": {
            "200": _json({"type": "object"}, "The updated row."),
            "404": _json(_ref("DetailMessage"), "`{\"detail\": \"User not found.\"}`"),
            "500": _json(_ref("DetailErrorMessage"), f"`{{\"detail\": {{\"error\": \"{error}\"}}}}`"),
            **_admin_key_responses(),
        },
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        operation["responses"]["400"] = _json(_ref("DetailMessage"), "A body that cannot be read as " + BODY_UNPARSEABLE_TEXT)
        operation["responses"]["422"] = _json(
            {"oneOf": [_ref("HTTPValidationError"), _ref("DetailErrorMessage")]}, "Invalid body or unknown service type."
        )
    return operation


def _chat_operation(summary: str, description: str, headers: list[Schema], *, bare_413: bool) -> Schema:
    return {
        "tags": ["completions"],
        "summary": summary,
        "description": description + "\n\n" + ERROR_CODES_TEXT,
        "security": [{"ClientAuth": []}],
        "parameters": headers,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ChatCompletionRequest")}}},
        "responses": {
            "200": {
                "description": "A completion (`stream: false`) or an SSE stream (`stream: true`).",
                "content": {
                    "application/json": {"schema": _ref("ChatCompletion")},
                    # Before OpenAPI 3.2 (no `itemSchema`) an event stream's `schema` describes
                    # each event, not the whole body.
                    "text/event-stream": {"schema": {**_SSE_EVENT, "description": STREAM_TEXT}},
                },
            },
            **_proxy_error_responses(bare_413=bare_413),
        },
    }


def _usage_operation(catalog: Catalog) -> Schema:
    headers = [h for h in _proxy_headers(catalog, catalog.names, default=None) if h["name"] != header_names.GEO_COUNTRY]
    errors = _proxy_error_responses(bare_413=False)
    return {
        "tags": ["usage"],
        "summary": "The caller's own spend and budget limits for one service type",
        "description": "Authenticated exactly as `POST /v1/chat/completions` (same headers, auth chain and "
        "service-type rules; an App Attest assertion signs the empty body). Reads the caller's LiteLLM end "
        "user `<uid>:<service-type>` and its budget; no parameter can name another user. A user LiteLLM "
        "does not know yet is 404 (reading creates nobody). Not a route of the reference.",
        "security": [{"ClientAuth": []}],
        "parameters": headers,
        "responses": {
            "200": _json(_ref("Usage"), "Spend, budget and limits; budget fields are null when the user has no budget."),
            "400": _json(_ref("DetailMessage"), "A purpose that does not fit the service type."),
            "401": errors["401"],
            "403": _json(_ref("DetailErrorCodeOrMessage"), "User blocked (`{\"detail\": {\"error\": \"User is blocked.\"}}`)."),
            "404": _json(_ref("DetailMessage"), "`{\"detail\": \"User not found\"}`: no request of this service type yet."),
            "422": _json(_ref("HTTPValidationError"), "Missing or invalid headers."),
            "500": _json(_ref("DetailErrorMessage"), "`{\"detail\": {\"error\": \"Error fetching usage\"}}`: the database failed."),
        },
    }


def _privacy_filter_operation() -> Schema:
    return {
        "tags": ["privacy filter"],
        "summary": "Mask sensitive data (e-mail addresses etc.) in a batch of strings",
        "description": "Proxied to the Privacy Filter service. FxA access tokens only (no App Attest, Play "
        "Integrity or dev key); no budget applies. Off unless `PRIVACY_FILTER_ENABLED` is true: then 503 "
        "before any authentication (a malformed request is still 422).",
        "security": [{"ClientAuth": []}],
        "parameters": [
            _header(str(hdrs.AUTHORIZATION), "`Bearer <FxA access token>`.", required=True),
            _debug_timing_header(),
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("PrivacyFilterRequest")}}},
        "responses": {
            "200": _json(_ref("PrivacyFilterResult"), "The masked items"),
            "400": _json(_ref("DetailMessage"), "A body that cannot be read as " + BODY_UNPARSEABLE_TEXT + "."),
            "401": _json(
                _ref("DetailMessage"),
                "`{\"detail\": \"Missing authorization header\"}` or `{\"detail\": \"Invalid FxA auth\"}`.",
            ),
            "413": _json(_ref("DetailErrorCode"), "Request body larger than `MAX_REQUEST_SIZE_BYTES`."),
            "422": _json(_ref("HTTPValidationError"), "`items` missing or not a list of strings, or no `authorization`."),
            "502": _json(
                _ref("DetailErrorMessage"),
                "The Privacy Filter failed (any status but 2xx, unreachable, too slow, not a JSON object): "
                "`{\"detail\": {\"error\": \"Failed to proxy request to Privacy Filter\"}}`.",
            ),
            "503": _json(
                _ref("DetailErrorMessage"),
                "Disabled: `{\"detail\": {\"error\": \"Privacy Filter is disabled.\"}}`.",
            ),
        },
    }


def _debug_timing_header() -> Schema:
    return _header(
        "debug-timing",
        "`true` (trimmed, any case; nothing else) adds timing spans: a JSON 200 object gains a `spans` "
        "array of `{name, start_ms, duration_ms}` (`total`, `auth`, `traffic_contract`, `db`, `upstream`), "
        "a stream ending in `data: [DONE]` gets one more event `data: {\"spans\": [...]}`.",
    )


def _components(catalog: Catalog) -> Schema:
    return {
        "securitySchemes": {
            "ClientAuth": {
                "type": "http",
                "scheme": "bearer",
                "description": "An FxA OAuth access token (scope `profile:uid`); with `use-app-attest: true` an "
                "App Attest assertion JWT (`AssertionAuth`); with `use-play-integrity: true` an MLPA access token.",
            },
            "AttestationAuth": {
                "type": "http",
                "scheme": "bearer",
                "bearerFormat": "JWT",
                "description": "An unsigned JWT envelope carrying an App Attest attestation (`AttestationAuth` schema).",
            },
            "MasterKey": {
                "type": "apiKey",
                "in": "header",
                "name": header_names.MASTER_KEY[0],
                "description": f"`Bearer <MASTER_KEY>`; also accepted as header `{header_names.MASTER_KEY[1]}`.",
            },
            "UIAccessKey": {
                "type": "apiKey",
                "in": "header",
                "name": header_names.UI_ACCESS_KEY[0],
                "description": f"`Bearer <MLPA_UI_ACCESS_KEY>`; also accepted as header `{header_names.UI_ACCESS_KEY[1]}`.",
            },
        },
        "schemas": {
            "ErrorCode": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "integer",
                        "enum": [
                            1, 2, 3, 4, 5, 8, 9, CODE_GLOBAL_BUDGET_EXCEEDED, CODE_TOO_MANY_STREAMS,
                            CODE_OVER_TRAFFIC_CONTRACT,
                        ],
                    }
                },
                "required": ["error"],
            },
            "DetailErrorCode": {"type": "object", "properties": {"detail": _ref("ErrorCode")}, "required": ["detail"]},
            "DetailMessage": {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]},
            "DetailErrorMessage": {
                "type": "object",
                "properties": {"detail": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}},
                "required": ["detail"],
            },
            "DetailErrorCodeOrMessage": {"oneOf": [_ref("DetailErrorCode"), _ref("DetailErrorMessage")]},
            "DetailAny": {"type": "object", "properties": {"detail": {}}, "required": ["detail"]},
            "Usage": {
                "type": "object",
                "properties": {
                    "service_type": {"type": "string", "enum": list(catalog.names)},
                    "spend": {"type": "number", "description": "USD spent in the current budget period"},
                    "max_budget": {"type": ["number", "null"], "description": "USD allowed per budget period"},
                    "remaining_budget": {"type": ["number", "null"], "description": "max(0, max_budget - spend)"},
                    "budget_duration": {"type": ["string", "null"], "description": "Budget period, e.g. `1d`, `7d`"},
                    "budget_reset_at": {
                        "type": ["string", "null"],
                        "format": "date-time",
                        "description": "When LiteLLM next resets the spend; null until LiteLLM has set it",
                    },
                    "tpm_limit": {"type": ["integer", "null"], "description": "Tokens per minute"},
                    "rpm_limit": {"type": ["integer", "null"], "description": "Requests per minute"},
                },
                "required": [
                    "service_type", "spend", "max_budget", "remaining_budget", "budget_duration",
                    "budget_reset_at", "tpm_limit", "rpm_limit",
                ],
            },
            "ValidationError": VALIDATION_ERROR_SCHEMA,
            "HTTPValidationError": {
                "type": "object",
                "properties": {"detail": {"type": "array", "items": _ref("ValidationError")}},
                "required": ["detail"],
            },
            # The request bodies' schemas come from the models that validate them.
            "ChatCompletionRequest": {
                **ChatBody.model_json_schema(),
                "description": "OpenAI-style chat request; unknown fields are dropped. `max_tokens` sent "
                "upstream is `max_completion_tokens`, else `max_tokens`, else the configured default, "
                "capped at the configured maximum.",
            },
            "ChatCompletion": {"type": "object", "description": "LiteLLM's chat completion JSON, unchanged."},
            "SearchRequest": SearchRequest.model_json_schema(),
            "PrivacyFilterRequest": {
                **PrivacyFilterRequest.model_json_schema(),
                "description": "The strings to mask; other fields are dropped.",
            },
            "PrivacyFilterResult": {
                "type": "object",
                "description": "The Privacy Filter's answer, exactly these keys (defaults when it left one out).",
                "properties": {
                    "results": {
                        "type": "array",
                        "default": [],
                        "description": "One result per item, e.g. `{\"masked_text\": \"email me at [EMAIL]\", "
                        "\"spans\": [{\"category\": \"email\", \"text\": ..., \"start\": 12, \"end\": 28, "
                        "\"score\": 0.99}]}`.",
                    },
                    "model_id": {"type": ["string", "null"], "default": None},
                    "num_items": {"type": "integer", "default": 0},
                },
                "required": ["results", "model_id", "num_items"],
            },
            "AttestationAuth": {
                "type": "object",
                "description": "Payload of the (unsigned) attestation JWT in `Authorization` of `POST /verify/attest`.",
                "properties": {k: {"type": "string"} for k in ("key_id_b64", "challenge_b64", "attestation_obj_b64", "bundle_id")},
                "required": ["key_id_b64", "challenge_b64", "attestation_obj_b64", "bundle_id"],
            },
            "AssertionAuth": {
                "type": "object",
                "description": "Payload of the (unsigned) assertion JWT in `Authorization` with `use-app-attest: true`. "
                "Every assertion needs a fresh challenge from `GET /verify/challenge`.",
                "properties": {k: {"type": "string"} for k in ("key_id_b64", "challenge_b64", "assertion_obj_b64", "bundle_id")},
                "required": ["key_id_b64", "challenge_b64", "assertion_obj_b64", "bundle_id"],
            },
            "Readiness": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["connected", "degraded"]},
                    "mlpa_version": {"type": "string"},
                    "pg_server_dbs": {
                        "type": "object",
                        "properties": {
                            name: {"type": "string", "enum": ["connected", "offline", MEMORY_STORE_STATE]}
                            for name in ("postgres", "app_attest")
                        },
                    },
                    "litellm": {
                        "type": "object",
                        "description": "`version` (LiteLLM's, `N/A` until known), then LiteLLM's own readiness JSON "
                        "(which may carry its own `litellm_version`); `status: unreachable` when LiteLLM did not "
                        "answer 200 with JSON in time.",
                        "properties": {"version": {"type": "string"}, "status": {"type": "string"}},
                    },
                    "privacy_filter": {
                        "type": "object",
                        "description": "`{\"status\": \"disabled\"}` while PRIVACY_FILTER_ENABLED is off (no effect on "
                        "readiness); the Privacy Filter's `version` and `model_id` when its `/readyz` answered 200 with "
                        "JSON (ready only if that says `\"ready\": true`); else `{\"version\": \"N/A\", \"status\": "
                        "\"unreachable\"}`.",
                        "properties": {
                            "status": {"type": "string", "enum": ["disabled", "unreachable"]},
                            "version": {"type": ["string", "null"]},
                            "model_id": {"type": ["string", "null"]},
                        },
                    },
                    "overload": {
                        "type": "object",
                        "description": "Only while OVERLOAD_PROTECTION reports this worker overloaded (ours).",
                        "properties": {
                            # observability/labels.SHED_REASONS (tests/unit/test_overload.py keeps them equal).
                            "reason": {
                                "type": "string",
                                "enum": ["event_loop_lag", "accept_queue", "open_streams", "admissions"],
                            },
                            "event_loop_lag_ms": {"type": "number"},
                            "peak_event_loop_lag_ms": {"type": "number"},
                            "accept_queue": {"type": "integer"},
                            "open_streams": {"type": "integer"},
                            "admissions": {"type": "integer"},
                        },
                    },
                },
                "required": ["status", "mlpa_version", "pg_server_dbs", "litellm", "privacy_filter"],
            },
        },
    }


def _paths(catalog: Catalog, *, mock_routes: bool) -> Schema:
    chat_headers = _proxy_headers(catalog, chat_doc_service_types(catalog), default=None)
    search_headers = _proxy_headers(catalog, catalog.search_types, default=DEFAULT_SEARCH_SERVICE_TYPE)
    text = {"content": {"text/plain": {"schema": {"type": "string"}}}}
    html = {"description": "HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}
    paths: Schema = {
        "/health/liveness": {
            "get": {
                "tags": ["health"],
                "summary": "Liveness probe (no I/O)",
                "responses": {"200": _json({"type": "object", "properties": {"status": {"const": "alive"}}}, "Alive")},
            }
        },
        "/health/readiness": {
            "get": {
                "tags": ["health"],
                "summary": "Readiness probe",
                "description": "Pings the databases, LiteLLM and (when enabled) the Privacy Filter concurrently, "
                "each bounded by `READINESS_CHECK_TIMEOUT_S`; 503 also once graceful shutdown has begun, and while "
                "overload protection (OVERLOAD_PROTECTION) reports the worker overloaded.",
                "responses": {
                    "200": _json(_ref("Readiness"), "Ready (`status: connected`)"),
                    "503": _json(_ref("Readiness"), "Not ready (`status: degraded`)"),
                },
            }
        },
        "/metrics": {
            "get": {
                "tags": ["health"],
                "summary": "Prometheus exposition (aggregated over all workers)",
                "responses": {"200": {"description": "Prometheus text format 1.0.0", **text}},
            }
        },
        "/verify/challenge": {
            "get": {
                "tags": ["app attest"],
                "summary": "Issue (or re-serve) the App Attest challenge of a key id",
                "parameters": [
                    {
                        "name": "key_id_b64",
                        "in": "query",
                        "required": True,
                        "description": "Standard base64 key id (spaces are read as `+`).",
                        "schema": {"type": "string", "maxLength": 128},
                    }
                ],
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"challenge": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}},
                        "The challenge, 64 lowercase hex characters",
                    ),
                    "400": _json(_ref("DetailMessage"), "`Bad Request: missing key_id_b64` / `Bad Request: invalid key_id_b64`"),
                    "422": _json(_ref("HTTPValidationError"), "`key_id_b64` missing"),
                },
            }
        },
        "/verify/attest": {
            "post": {
                "tags": ["app attest"],
                "summary": "Register an App Attest key",
                "security": [{"AttestationAuth": []}],
                "parameters": [_header(header_names.USE_QA_CERTIFICATES, "Verify against the QA root (if allowed).", _BOOL_HEADER)],
                "responses": {
                    "201": _json({"type": "object", "properties": {"status": {"const": "success"}}}, "Key stored"),
                    "400": _json(
                        {"oneOf": [_ref("DetailMessage"), {"type": "object", "properties": {"detail": {"type": "object"}}}]},
                        "Invalid key id, or a field that is not base64 (`{\"detail\": {\"challenge_b64\": \"Invalid Base64\"}}`)",
                    ),
                    "401": _json(_ref("DetailMessage"), "`Invalid App attest` / `Invalid or expired challenge`"),
                    "403": _json(_ref("DetailMessage"), "`Attestation verification failed`"),
                    "422": _json(_ref("HTTPValidationError"), "`Authorization` missing"),
                    "500": _json(_ref("DetailAny"), "The key could not be stored"),
                },
            }
        },
        "/verify/play": {
            "post": {
                "tags": ["play integrity"],
                "summary": "Exchange a Play Integrity token for an MLPA access token",
                "description": "The body is read as JSON whatever the Content-Type.",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "integrity_token": {"type": "string"},
                                    "user_id": {"type": "string", "description": "Must not contain `:`."},
                                    "package_name": {"type": "string", "default": "org.mozilla.firefox"},
                                },
                                "required": ["integrity_token", "user_id"],
                            }
                        }
                    },
                },
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "access_token": {"type": "string"},
                                "token_type": {"const": "Bearer"},
                                "expires_in": {"type": "integer"},
                            },
                        },
                        "MLPA access token (HS256 JWT)",
                    ),
                    "400": _json(
                        _ref("DetailMessage"),
                        "`Invalid integrity_token`, an invalid `user_id` (empty, or with `:` or a control "
                        "character), or a body that cannot be read as " + BODY_UNPARSEABLE_TEXT,
                    ),
                    "401": _json(
                        {"oneOf": [_ref("DetailMessage"), _ref("DetailErrorMessage")]},
                        "Verdict rejected, stale, or Google rejected the token",
                    ),
                    "403": _json(_ref("DetailMessage"), "`Package name not allowed`"),
                    "413": _json(_ref("DetailErrorCode"), "Body too large: `{\"detail\": {\"error\": 3}}`"),
                    "422": _json(_ref("HTTPValidationError"), "Invalid body"),
                    "500": _json(_ref("DetailAny"), "`Failed to fetch access token`"),
                    "502": _json(_ref("DetailErrorMessage"), "`Play Integrity validation service unavailable`"),
                },
            }
        },
        "/user": {
            "get": {
                "tags": ["users"],
                "summary": "List LiteLLM end users",
                "security": [{"MasterKey": []}],
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}},
                    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0}},
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "users": {"type": "array", "items": {"type": "object"}},
                                "total": {"type": "integer"},
                                "limit": {"type": "integer"},
                                "offset": {"type": "integer"},
                            },
                        },
                        "A page of users",
                    ),
                    "422": _json(_ref("HTTPValidationError"), "Invalid paging"),
                    "500": _json(_ref("DetailErrorMessage"), "`Error listing users`"),
                    **_admin_key_responses(),
                },
            }
        },
        "/user/counts-by-service-type": {
            "get": {
                "tags": ["users"],
                "summary": "Users per service type",
                "security": [{"UIAccessKey": []}],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "service_type_counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                                "total_users": {"type": "integer"},
                            },
                        },
                        "Counts",
                    ),
                    "500": _json(_ref("DetailErrorMessage"), "`Error counting users by service type`"),
                    **_admin_key_responses(),
                },
            }
        },
        "/user/signup-cap-status": {
            "get": {
                "tags": ["users"],
                "summary": "Signup-capacity state",
                "security": [{"UIAccessKey": []}],
                "responses": {
                    "200": _json({"type": "object"}, "Capacity state (`capacity_row_missing: true` when unseeded; `managed_identities_counted`: "
                        "`at_each_admission` while the cap is enforced, else `at_start_up`, when the count was "
                        "last reconciled)"),
                    "500": _json(_ref("DetailErrorMessage"), "`Error reading signup cap state`"),
                    **_admin_key_responses(),
                },
            }
        },
        "/user/{user_id}": {
            "get": {
                "tags": ["users"],
                "summary": "LiteLLM's record of one end user",
                "security": [{"MasterKey": []}],
                "parameters": [_user_id_param()],
                "responses": {
                    "200": _json({"type": "object"}, "LiteLLM's `/customer/info` JSON, unchanged"),
                    "404": _json(
                        {"oneOf": [_ref("DetailMessage"), _ref("DetailErrorMessage")]},
                        "`{\"detail\": {\"error\": \"Error fetching user info\"}}`: LiteLLM has no such end user "
                        "(its `/customer/info` answers 404); `{\"detail\": \"User not found\"}`: a blank id.",
                    ),
                    "502": _json(_ref("DetailErrorMessage"), "`Error fetching user info`"),
                    **_admin_key_responses(),
                },
            }
        },
        "/user/{user_id}/budget": {
            "post": _user_update(
                "Move a user to another budget tier",
                "Error updating user budget",
                body={
                    "type": "object",
                    "properties": {"service_type": {"type": "string", "enum": list(catalog.names)}},
                    "required": ["service_type"],
                },
            )
        },
        "/user/{user_id}/block": {"post": _user_update("Block a user", "Error updating user")},
        "/user/{user_id}/unblock": {"post": _user_update("Unblock a user", "Error updating user")},
        "/v1/chat/completions": {
            "post": _chat_operation(
                "Chat completion, proxied to LiteLLM",
                "Validates, authenticates (FxA, App Attest, Play Integrity token, dev key), provisions "
                "the LiteLLM end user and relays the completion. With `stream: true` the answer is an "
                "SSE stream.",
                [
                    *chat_headers,
                    _header(
                        header_names.STREAM_KEEPALIVE,
                        f"{_truthy_text()}: while a streamed answer waits for its first token, "
                        "the server sends an empty line (`\\n`) every `STREAM_KEEPALIVE_SECONDS`. "
                        "Ignored when that is 0 (the default) and for non-streamed completions.",
                    ),
                ],
                bare_413=True,
            )
        },
        "/v1/search": {
            "post": {
                "tags": ["search"],
                "summary": "Web search, proxied to LiteLLM's `exa-search`",
                "description": "Same authentication as chat; the service type must be a search type.\n\n" + ERROR_CODES_TEXT,
                "security": [{"ClientAuth": []}],
                "parameters": search_headers,
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("SearchRequest")}}},
                "responses": {
                    "200": _json({"type": "object"}, "LiteLLM's search JSON, unchanged"),
                    **_proxy_error_responses(bare_413=False),
                },
            }
        },
        "/v1/usage": {"get": _usage_operation(catalog)},
        "/privacy-filter": {"post": _privacy_filter_operation()},
        "/privacy-filter/": {
            "post": {
                "tags": ["privacy filter"],
                "summary": "Redirect to `/privacy-filter` (the reference's trailing-slash form)",
                "responses": {
                    "307": {
                        "description": "Repeat the same POST at `/privacy-filter`.",
                        "headers": {"Location": {"schema": {"type": "string", "const": "/privacy-filter"}}},
                    }
                },
            }
        },
        "/admin": {
            "get": {
                "tags": ["admin"],
                "summary": "Read-only admin dashboard (asks for the UI access key)",
                "responses": {"200": html},
            }
        },
        "/admin/": {
            "get": {
                "tags": ["admin"],
                "summary": "The admin dashboard (same page)",
                "responses": {"200": html},
            }
        },
        "/openapi.json": {
            "get": {
                "tags": ["docs"],
                "summary": "This document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1 document")},
            }
        },
        "/api/docs": {"get": {"tags": ["docs"], "summary": "Swagger UI", "responses": {"200": html}}},
        "/api/docs/static/{filename}": {
            "get": {
                "tags": ["docs"],
                "summary": "Swagger UI assets (packaged, no CDN)",
                "parameters": [{"name": "filename", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "A static file"}, "404": {"description": "No such file"}},
            }
        },
    }
    if mock_routes:
        mock_note = (
            " Load-testing route, mounted only with `MLPA_MOCK_ROUTES=true`: after `MOCK_TTFT_MS` it "
            "answers a canned completion, or with `stream: true` three SSE frames (`mock token 1`, "
            "`mock token 2`, `[DONE]`) `MOCK_STREAMING_CHUNK_LATENCY_MS` apart. LiteLLM is not called."
        )
        mock_chat = _chat_operation(
            "Mock chat completion (full auth and provisioning)",
            "Validation, authentication and user provisioning exactly as `POST /v1/chat/completions`." + mock_note,
            chat_headers,
            bare_413=False,
        )
        mock_no_auth = _chat_operation(
            "Mock chat completion (FxA JWT verified locally)",
            "Only an FxA JWT access token, verified against the cached FxA JWKS; the user is "
            "`<uid>:<service-type>` (default `ai`)." + mock_note,
            [_header(header_names.SERVICE_TYPE, "Defaults to `ai`.", {"type": "string", "enum": list(catalog.names), "default": DEFAULT_CHAT_SERVICE_TYPE})],
            bare_413=False,
        )
        mock_no_auth["responses"]["401"] = _json(
            _ref("DetailMessage"),
            "`Invalid authorization header format`, `Invalid token signature` or `JWT verification failed: ...`",
        )
        paths["/mock/chat/completions"] = {"post": mock_chat}
        paths["/mock/chat/completions_no_auth"] = {"post": mock_no_auth}
    return paths


def build_document(*, mock_routes: bool, catalog: Catalog = BUILTIN_CATALOG) -> Schema:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "MLPA (LLM Proxy Auth)",
            "version": __version__,
            "description": "Authenticating LLM proxy between Firefox clients and LiteLLM.\n\n" + ERROR_CODES_TEXT,
        },
        "paths": _paths(catalog, mock_routes=mock_routes),
        "components": _components(catalog),
    }
