"""The domain error tree. The steps behind the routes raise these, not aiohttp's HTTP
exceptions; one middleware (`middlewares.error_mapping`) turns them into responses.

An error also says what it means to the chat metrics: `availability_reason` (the
availability sample, compatibility.md §6) and `rejection_reason` (the rejection counter, only for the
refusals the reference counts there). None means the error is not counted. The chat route
records its refusals before the relay in one place (`routes.proxy.refusals_recorded`); once
the relay runs, `relay.outcome.CompletionOutcome` records instead, a classified upstream
error by its `Classification` (whose reasons `UpstreamRejected` carries as well).

    ApiError                      status + the reference's JSON body (+ headers)
    ├── RequestInvalid            422 {"detail": [{"loc", "msg", "type"}]}
    ├── PayloadTooLarge           413 {"error": 3} on chat, {"detail": {"error": 3}} elsewhere
    ├── InvalidModelName          400 {"detail": {"error": 8}}
    ├── BadRequest                400 {"detail": <text or object>}
    │   └── ServiceTypeNotForModel  400: the model is pinned to other service types
    ├── AuthRejected              401 {"detail": <text>}
    ├── Forbidden                 403 {"detail": <text or object>}
    │   ├── SignupCapExceeded     403 {"detail": {"error": 4}}
    │   └── UserBlocked           403 {"detail": {"error": "User is blocked."}}
    ├── NotFound                  404 {"detail": <text>}
    ├── TooManyStreams            429 {"detail": {"error": 11}} + Retry-After (ours, off by default)
    ├── OverTrafficContract       429 {"detail": {"error": 12}} + Retry-After (ours, enforced contracts only)
    ├── TrafficContractUnavailable  503 {"detail": {"error": "Traffic contract enforcement unavailable."}}
    ├── UpstreamRejected          classified LiteLLM error: {"detail": {"error": N}} + Retry-After (4xx;
    │                             500 for 10, the global budget)
    ├── UpstreamError             unclassified / transport: {"detail": {"error": <text>}}
    └── ServerFault               5xx {"detail": <text or object>}: our own dependency failed
        └── ProvisioningFailed    500: the caller's LiteLLM end user could not be read or created
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from aiohttp import hdrs

# Error codes of the wire contract (compatibility.md §4.5).
CODE_BUDGET_EXCEEDED = 1
CODE_RATE_LIMITED = 2
CODE_PAYLOAD_TOO_LARGE = 3
CODE_SIGNUP_CAP = 4
CODE_UPSTREAM_RATE_LIMITED = 5
CODE_INVALID_MODEL_NAME = 8
CODE_INVALID_REQUEST = 9
# The reference's (1.0.39): the budget of the LiteLLM user owning the shared virtual key is
# spent, a service-wide condition (HTTP 500).
CODE_GLOBAL_BUDGET_EXCEEDED = 10
GLOBAL_BUDGET_RETRY_AFTER_SECONDS = 300
# Ours, beyond the reference's catalogue (1-10; 6 and 7 belong to the Fastly edge): the
# caller already holds MAX_CONCURRENT_STREAMS_PER_USER open streams. It was 10 until the
# reference took 10 (compatibility.md D42).
CODE_TOO_MANY_STREAMS = 11
TOO_MANY_STREAMS_RETRY_AFTER_SECONDS = 5
# Ours: enforced traffic contracts (TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT) refused the request.
CODE_OVER_TRAFFIC_CONTRACT = 12

GENERIC_UPSTREAM_MESSAGE = "Upstream service returned an error"


@dataclass(frozen=True, slots=True)
class Classification:
    """What a classified upstream error means to clients and to the metrics (compatibility.md §4.5)."""

    status: int
    code: int
    retry_after: int | None
    rejection_reason: str
    availability_reason: str
    log_prefix: str


# What the auth step's 400s (purpose, malformed credentials) mean to availability (compatibility.md §2.1).
INVALID_AUTH_REQUEST = "invalid_auth_request"


class ApiError(Exception):
    """An error with a definite HTTP status and body, and its meaning to the chat metrics."""

    status: int = 500
    availability_reason: str | None = None
    rejection_reason: str | None = None

    def __init__(
        self,
        detail: Any,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        self.headers: Mapping[str, str] = headers or {}

    def body(self) -> Any:
        return {"detail": self.detail}


class RequestInvalid(ApiError):
    """Malformed body or headers, in the reference's 422 list shape (items: `validation.py`)."""

    status = 422

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)


class PayloadTooLarge(ApiError):
    status = 413

    def __init__(self, *, bare: bool) -> None:
        super().__init__({"error": CODE_PAYLOAD_TOO_LARGE})
        self.bare = bare

    def body(self) -> Any:
        return self.detail if self.bare else {"detail": self.detail}


class InvalidModelName(ApiError):
    status = 400
    availability_reason = "invalid_model_name"

    def __init__(self) -> None:
        super().__init__({"error": CODE_INVALID_MODEL_NAME})


class BadRequest(ApiError):
    status = 400


class ServiceTypeNotForModel(BadRequest):
    availability_reason = "invalid_service_type_for_model"


class AuthRejected(ApiError):
    status = 401
    availability_reason = "auth_rejected"


class Forbidden(ApiError):
    status = 403


class SignupCapExceeded(Forbidden):
    availability_reason = rejection_reason = "signup_cap_exceeded"

    def __init__(self) -> None:
        super().__init__({"error": CODE_SIGNUP_CAP})


class UserBlocked(Forbidden):
    availability_reason = "blocked"

    def __init__(self) -> None:
        super().__init__({"error": "User is blocked."})


class NotFound(ApiError):
    status = 404


class TooManyStreams(ApiError):
    """One identity already holds its share of open streams in this worker."""

    status = 429
    availability_reason = rejection_reason = "concurrent_stream_limit"

    def __init__(self) -> None:
        super().__init__(
            {"error": CODE_TOO_MANY_STREAMS},
            headers={hdrs.RETRY_AFTER: str(TOO_MANY_STREAMS_RETRY_AFTER_SECONDS)},
        )


class OverTrafficContract(ApiError):
    """Enforced traffic contracts: the fleet's basket is over its limit for this window."""

    status = 429
    availability_reason = rejection_reason = "traffic_contract_exceeded"

    def __init__(self, retry_after_seconds: int, modes: tuple[str, str]) -> None:
        super().__init__({"error": CODE_OVER_TRAFFIC_CONTRACT}, headers={hdrs.RETRY_AFTER: str(retry_after_seconds)})
        # The request's (RPM, TPM) modes, for its mlpa_requests_total sample.
        self.modes = modes


class TrafficContractUnavailable(ApiError):
    """Redis failed the traffic-contract check and the contracts fail closed (the reference's
    503; like its newest revision, no availability sample)."""

    status = 503

    def __init__(self) -> None:
        super().__init__({"error": "Traffic contract enforcement unavailable."})


class UpstreamRejected(ApiError):
    """LiteLLM refused the request for a reason clients understand (a classified error)."""

    def __init__(self, classification: Classification) -> None:
        headers = {}
        if classification.retry_after is not None:
            headers[hdrs.RETRY_AFTER] = str(classification.retry_after)
        super().__init__({"error": classification.code}, status=classification.status, headers=headers)
        self.classification = classification
        self.availability_reason = classification.availability_reason
        self.rejection_reason = classification.rejection_reason


class UpstreamError(ApiError):
    """LiteLLM failed in a way we do not classify, or could not be reached."""

    def __init__(self, message: str, *, status: int = 502) -> None:
        super().__init__({"error": message}, status=status)


class ServerFault(ApiError):
    status = 500


class ProvisioningFailed(ServerFault):
    availability_reason = "provisioning_failure"
