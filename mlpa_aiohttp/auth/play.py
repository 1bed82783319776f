"""Google Play Integrity → the service's own access token, and that token's use on the
proxy routes (compatibility.md §1.5, §2.6; D11, D15)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import structlog

from ..errors import AuthRejected, BadRequest, Forbidden, RequestInvalid, ServerFault, UpstreamError
from ..models import PlayRequest, ProxyHeaders
from ..observability.metrics import Metrics
from ..settings import AuthSettings, PlaySettings
from ..upstream.google import (
    GoogleAccessTokenProvider,
    GoogleCredentialsUnavailable,
    PlayIntegrityHttpError,
    PlayIntegrityUnavailable,
    decode_integrity_token,
)
from ..validation import Problem, validate_json_body
from ..wire import is_base_identity
from .access_token import AccessTokenInvalid, issue_access_token, verify_access_token
from .dispatch import bearer_token
from .play_integrity import VerdictRejected, check_verdict, is_plausible_integrity_token

log = structlog.get_logger(__name__)

INVALID_ACCESS_TOKEN = "Invalid MLPA access token"
# PLAY_INTEGRITY_ENABLED=false: this deployment serves no Android clients.
PLAY_INTEGRITY_OFF = "Play Integrity is turned off"


def _parse_play_request(raw: bytes, default_package: str) -> tuple[str, str, str]:
    """The body as JSON whatever its content type (compatibility.md §5.1), in the 422 shape on error."""
    problems: list[Problem] = []
    body = validate_json_body(PlayRequest, raw, problems)
    if body is None:
        raise RequestInvalid(problems)
    return body.integrity_token, body.user_id, body.package_name_or(default_package)


class PlayIntegrity:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        google_tokens: GoogleAccessTokenProvider,
        settings: PlaySettings,
        auth: AuthSettings,
        metrics: Metrics,
        debug: bool,
    ) -> None:
        self._session = session
        self._google_tokens = google_tokens
        self._settings = settings
        self._auth = auth
        self._metrics = metrics
        self._debug = debug

    # -- POST /verify/play -----------------------------------------------------------------
    async def exchange(self, raw_body: bytes) -> dict[str, Any]:
        integrity_token, user_id, package_name = _parse_play_request(raw_body, self._settings.package_name)
        if not is_plausible_integrity_token(integrity_token):
            raise BadRequest("Invalid integrity_token")
        if not is_base_identity(user_id):
            # compatibility.md D15 (a ':' would break the `uid:service_type` namespace), and no
            # control characters: the id ends up in PostgreSQL, which refuses a NUL.
            raise BadRequest("Invalid user_id")
        started = time.monotonic()
        result = "error"
        try:
            token = await self._verify(integrity_token, user_id, package_name)
            result = "success"
        finally:
            self._metrics.play_latency.labels(result).observe(time.monotonic() - started)
        self._metrics.play_verifications.inc()
        return {"access_token": token, "token_type": "Bearer", "expires_in": self._auth.access_token_ttl_seconds}

    async def _verify(self, integrity_token: str, user_id: str, package_name: str) -> str:
        if not self._settings.enabled:
            raise Forbidden(PLAY_INTEGRITY_OFF)
        try:
            google_token = await self._google_tokens.get_token()
        except GoogleCredentialsUnavailable:
            log.error("play_google_credentials_unavailable")
            raise ServerFault("Failed to fetch access token") from None
        if package_name not in self._settings.allowed_package_names:
            raise Forbidden("Package name not allowed")
        try:
            verdict = await decode_integrity_token(
                self._session,
                integrity_token=integrity_token,
                package_name=package_name,
                access_token=google_token,
                api_base=self._settings.api_base,
                quota_project=self._settings.quota_project,
                timeout_seconds=self._settings.request_timeout_seconds,
            )
        except PlayIntegrityHttpError as exc:
            log.info("play_google_rejected_token", upstream_status=exc.status)
            message = exc.upstream_message if self._debug else "Upstream service returned an error"
            raise AuthRejected({"error": message}) from None
        except PlayIntegrityUnavailable as exc:
            log.error("play_google_unavailable", error=str(exc))
            raise UpstreamError("Play Integrity validation service unavailable") from None
        try:
            check_verdict(
                verdict,
                user_id=user_id,
                allowed_packages=self._settings.allowed_package_names,
                debug=self._debug,
                now_ms=int(time.time() * 1000),
                max_age_seconds=self._settings.max_age_seconds,
            )
        except VerdictRejected as exc:
            log.info("play_verdict_rejected", reason=exc.reason)
            raise AuthRejected(exc.message) from None
        return issue_access_token(self._auth.access_token_secret, user_id, self._auth.access_token_ttl_seconds, time.time())

    # -- the access token on the proxy routes (DeviceAuthenticator) ----------------------------
    async def base_identity(self, headers: ProxyHeaders, raw_body: bytes) -> str:
        started = time.monotonic()
        try:
            sub = verify_access_token(self._auth.access_token_secret, bearer_token(headers.authorization))
        except AccessTokenInvalid:
            self._metrics.access_token_latency.labels("error").observe(time.monotonic() - started)
            raise AuthRejected(INVALID_ACCESS_TOKEN) from None
        self._metrics.access_token_latency.labels("success").observe(time.monotonic() - started)
        self._metrics.access_token_verifications.inc()
        return sub
