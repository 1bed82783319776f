"""Google Play Integrity: the pure checks on a decoded verdict (compatibility.md §2.6, D15).

Fetching the verdict from Google lives in `mlpa_aiohttp.upstream.google`; this module only
judges the JSON Google returned. Messages are the reference's wire strings (the route
sends them as 401 details), checked in the reference's order; freshness comes last.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Collection
from typing import Any

MAX_INTEGRITY_TOKEN_LENGTH = 10_000
DEFAULT_CLOCK_SKEW_SECONDS = 60

MSG_INVALID_TOKEN = "Invalid Play Integrity token"
MSG_INVALID_PACKAGE = "Invalid package name"
MSG_INVALID_REQUEST_HASH = "Invalid request hash"
MSG_APP_NOT_RECOGNIZED = "App not recognized by Play"
MSG_DEVICE_INTEGRITY = "Device integrity check failed"
MSG_STALE_VERDICT = "Stale Play Integrity verdict"

_TOKEN_ALPHABET = re.compile(r"[A-Za-z0-9_.\-]+")
_ACCEPTED_DEVICE_VERDICTS = frozenset({"MEETS_DEVICE_INTEGRITY", "MEETS_BASIC_INTEGRITY", "MEETS_STRONG_INTEGRITY"})
_DIGITS = re.compile(r"[0-9]{1,19}")


class VerdictRejected(ValueError):
    """The verdict fails a check; `message` is the client-facing detail, `reason` a label."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def is_plausible_integrity_token(token: str) -> bool:
    """Shape check before Google is called (compatibility.md §2.6 step 1)."""
    return 0 < len(token) <= MAX_INTEGRITY_TOKEN_LENGTH and _TOKEN_ALPHABET.fullmatch(token) is not None


def request_hash_for(user_id: str) -> str:
    """What the app must put in `requestHash`: lowercase hex SHA-256 of the user id."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


def check_verdict(
    response_json: Any,
    *,
    user_id: str,
    allowed_packages: Collection[str],
    debug: bool,
    now_ms: int,
    max_age_seconds: int,
    clock_skew_seconds: int = DEFAULT_CLOCK_SKEW_SECONDS,
) -> None:
    """Raise `VerdictRejected` unless Google's decoded verdict is acceptable for `user_id`."""
    payload = _object(response_json).get("tokenPayloadExternal") or _object(response_json).get("tokenPayload")
    if not isinstance(payload, dict):
        raise VerdictRejected(MSG_INVALID_TOKEN, "payload_missing")
    request_details = _object(payload.get("requestDetails"))

    package = request_details.get("requestPackageName")
    if not isinstance(package, str) or package not in allowed_packages:
        raise VerdictRejected(MSG_INVALID_PACKAGE, "package_name")

    request_hash = request_details.get("requestHash")
    if not isinstance(request_hash, str) or not hmac.compare_digest(
        request_hash.encode("utf-8"), request_hash_for(user_id).encode("ascii")
    ):
        raise VerdictRejected(MSG_INVALID_REQUEST_HASH, "request_hash")

    accepted_app_verdicts = {"PLAY_RECOGNIZED", "UNRECOGNIZED_VERSION"} if debug else {"PLAY_RECOGNIZED"}
    if _object(payload.get("appIntegrity")).get("appRecognitionVerdict") not in accepted_app_verdicts:
        raise VerdictRejected(MSG_APP_NOT_RECOGNIZED, "app_not_recognized")

    device_verdicts = _object(payload.get("deviceIntegrity")).get("deviceRecognitionVerdict")
    if not isinstance(device_verdicts, list) or not any(
        isinstance(verdict, str) and verdict in _ACCEPTED_DEVICE_VERDICTS for verdict in device_verdicts
    ):
        raise VerdictRejected(MSG_DEVICE_INTEGRITY, "device_integrity")

    # compatibility.md D15: without a freshness bound, one captured token would mint access tokens
    # forever. Google encodes this int64 as a JSON string (proto3 mapping); accept both.
    timestamp_ms = _millis(request_details.get("timestampMillis"))
    if timestamp_ms is None:
        raise VerdictRejected(MSG_STALE_VERDICT, "timestamp_missing")
    if timestamp_ms > now_ms + clock_skew_seconds * 1000:
        raise VerdictRejected(MSG_STALE_VERDICT, "timestamp_in_future")
    if now_ms - timestamp_ms > max_age_seconds * 1000:
        raise VerdictRejected(MSG_STALE_VERDICT, "too_old")


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _millis(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None
