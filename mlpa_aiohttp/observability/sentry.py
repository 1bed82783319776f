"""Sentry error reporting: errors only (no tracing), and nothing private leaves the process.

`init_sentry(dsn, release=..., secrets=secret_values(settings))` is called once by the
entry point. With an empty DSN it does nothing. Otherwise every error event passes through
`PrivacyFilter.before_send`, which

* drops events that are not server faults: 4xx HTTP errors and client disconnects;
* replaces the value of every field named in `redaction.SENSITIVE_FIELDS` (user content,
  credential headers and fields) with "[Filtered]" (compatibility.md D17), wherever such a key
  appears in the event (request data, headers, frame locals, extra, breadcrumbs), and a raw
  body (`redaction.RAW_BODY_FIELDS`) whole unless it is already a structure;
* replaces every occurrence of a configured secret value (MASTER_KEY, ...) in any string
  of the event, so a secret quoted in an exception message or a local variable is hidden.

If scrubbing itself fails, the event is not sent as it was (it could leak) and not dropped
silently: a stub carrying only the exception types is sent and the failure is logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import sentry_sdk
from aiohttp import web
from sentry_sdk.integrations.aiohttp import AioHttpIntegration
from sentry_sdk.integrations.logging import ignore_logger

from ..errors import ApiError
from ..settings import Settings
from .redaction import RAW_BODY_FIELDS, is_raw_body, is_sensitive

FILTERED = "[Filtered]"


# Shorter "secrets" would turn ordinary words into "[Filtered]" all over the event.
MIN_SECRET_LENGTH = 4

# Raised when the client went away: not a fault of this service.
CLIENT_DISCONNECT_ERRORS: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    aiohttp.ClientConnectionResetError,
    ConnectionResetError,
)

_log = logging.getLogger(__name__)


def secret_values(settings: Settings) -> tuple[str, ...]:
    """The configured secrets that must never appear in an event (every `secret(...)` field)."""
    return settings.secret_values()


def init_sentry(
    dsn: str,
    *,
    release: str,
    environment: str | None = None,
    secrets: Iterable[str] = (),
) -> bool:
    """Start the Sentry SDK for error events; return whether it was started.

    `environment=None` lets the SDK read `SENTRY_ENVIRONMENT` (default "production").
    """
    if not dsn.strip():
        return False
    privacy = PrivacyFilter.from_secrets(secrets)
    # Our own failure log must not become a Sentry event of its own.
    ignore_logger(__name__)
    sentry_sdk.init(
        dsn=dsn.strip(),
        release=release,
        environment=environment,
        # send_default_pii stays unset, which means off (no user IPs, cookies, PII headers);
        # sentry-sdk 2.75 deprecates setting it explicitly.
        # Errors only: no transactions, spans or profiles.
        traces_sample_rate=None,
        profiles_sample_rate=None,
        # No sentry-trace/baggage headers on requests to LiteLLM, FxA or Google.
        trace_propagation_targets=[],
        # Release-health sessions would add bookkeeping to every request; metrics cover it.
        auto_session_tracking=False,
        integrations=[AioHttpIntegration(transaction_style="method_and_path_pattern")],
        before_send=privacy.before_send,  # type: ignore[arg-type]  # sentry's Event is a TypedDict of this dict
        before_breadcrumb=privacy.before_breadcrumb,
    )
    return True


@dataclass(frozen=True, slots=True)
class PrivacyFilter:
    """The `before_send` / `before_breadcrumb` hooks, holding the secrets to hide."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def from_secrets(cls, secrets: Iterable[str]) -> PrivacyFilter:
        usable = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
        # Longest first, so a secret that contains another one is replaced whole.
        return cls(tuple(sorted(usable, key=len, reverse=True)))

    def before_send(self, event: dict[str, Any], hint: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            if not is_reportable(hint):
                return None
            return self.scrub_event(event)
        except Exception:  # noqa: BLE001 - scrubbing must never let an unscrubbed event through
            _log.error("Sentry event scrubbing failed; sending a stub without details", exc_info=True)
            return withheld_event(event)

    def before_breadcrumb(self, crumb: dict[str, Any], hint: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            data = crumb.get("data")
            if isinstance(data, dict):
                crumb["data"] = {
                    key: FILTERED if isinstance(key, str) and key.lower() in RAW_BODY_FIELDS else value
                    for key, value in data.items()
                }
            return self._scrub_value(crumb)
        except Exception:  # noqa: BLE001 - as above, for breadcrumbs
            _log.error("Sentry breadcrumb scrubbing failed; breadcrumb dropped", exc_info=True)
            return None

    def scrub_event(self, event: dict[str, Any]) -> dict[str, Any]:
        request = event.get("request")
        if isinstance(request, dict):
            # Client address: personal data, and send_default_pii=False does not remove it here.
            request.pop("env", None)
            if "data" in request:
                request["data"] = _structured_body(request["data"])
        return self._scrub_value(event)

    def _scrub_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._hide_secrets(value)
        if isinstance(value, dict):
            return {key: self._scrub_item(key, item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._scrub_value(item) for item in value]
        return value

    def _scrub_item(self, key: Any, item: Any) -> Any:
        if is_sensitive(key):
            return FILTERED
        if is_raw_body(key, item):
            # A body as text or bytes cannot be scrubbed field by field.
            return FILTERED
        return self._scrub_value(item)

    def _hide_secrets(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, FILTERED)
        return text


def is_reportable(hint: Mapping[str, Any]) -> bool:
    """False for events about client errors (4xx) and client disconnects."""
    exc_info = hint.get("exc_info")
    if not exc_info:
        return True
    exc = exc_info[1]
    if isinstance(exc, CLIENT_DISCONNECT_ERRORS):
        return False
    if isinstance(exc, (web.HTTPException, ApiError)):
        status = exc.status
        return not (isinstance(status, int) and 400 <= status < 500)
    return True


def _structured_body(data: Any) -> Any:
    """The captured body as JSON structure, so fields can be scrubbed one by one.

    A body that is not JSON cannot be scrubbed field by field, so it is withheld whole.
    """
    if isinstance(data, (dict, list)) or data is None:
        return data
    if isinstance(data, str):
        try:
            return json.loads(data)
        except ValueError:
            return FILTERED
    return FILTERED


def withheld_event(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """An event with only fields that cannot carry request data or secrets."""
    try:
        stub: dict[str, Any] = {
            key: event[key]
            for key in ("event_id", "timestamp", "level", "platform", "release", "environment", "sdk")
            if key in event
        }
        stub["message"] = "Event withheld: scrubbing failed (see the service log)"
        exception = event.get("exception")
        values = exception.get("values") if isinstance(exception, dict) else None
        if isinstance(values, list):
            stub["exception"] = {
                "values": [
                    {"type": str(v.get("type")), "value": FILTERED} for v in values if isinstance(v, dict)
                ]
            }
        return stub
    except Exception:  # noqa: BLE001 - the last resort: drop the event
        _log.error("Sentry event dropped: neither scrubbing nor a stub worked", exc_info=True)
        return None
