"""Authentication dispatch for the proxy routes (compatibility.md §2.1, D11).

Order: App Attest assertion → MLPA access token (Play Integrity) → dev key + FxA → FxA.
Device methods plug in through the `DeviceAuthenticator` protocol so this module stays
free of their storage and crypto.
"""

from __future__ import annotations

import hmac
import time
from typing import Protocol

import structlog

from ..catalog import BUILTIN_CATALOG
from ..errors import AuthRejected
from ..models import ProxyHeaders
from ..observability.metrics import Metrics
from ..principal import AuthMethod, Principal
from .fxa import FxAVerificationFailed, FxAVerifier

log = structlog.get_logger(__name__)

MISSING_AUTHORIZATION = "Missing authorization header"
INVALID_FXA = "Invalid FxA auth"
DEV_HEADER_REQUIRED = "x-dev-authorization required for dev service types (ai-dev, memories-dev, mochi-dev)"
DEV_HEADER_EMPTY = "Missing authorization header (FxA required when x-dev-authorization is present)"
INVALID_DEV = "Invalid x-dev-authorization"


class DeviceAuthenticator(Protocol):
    """App Attest or Play Integrity: returns the base identity or raises an ApiError."""

    async def base_identity(self, headers: ProxyHeaders, raw_body: bytes) -> str: ...


def bearer_token(authorization: str) -> str:
    """The token of an `Authorization` value: a case-sensitive `Bearer ` prefix removed,
    then the first whitespace-separated word."""
    words = authorization.removeprefix("Bearer ").split()
    return words[0] if words else ""


class Authenticator:
    def __init__(
        self,
        *,
        fxa: FxAVerifier,
        metrics: Metrics,
        dev_token: str,
        app_attest: DeviceAuthenticator | None = None,
        play_integrity: DeviceAuthenticator | None = None,
        dev_types: frozenset[str] = BUILTIN_CATALOG.dev_types,
    ) -> None:
        self._fxa = fxa
        # The catalogue's dev types: the experimentation token on every path (compatibility.md D11).
        self._dev_types = dev_types
        self._metrics = metrics
        self._dev_token = dev_token.encode()
        self.app_attest = app_attest
        self.play_integrity = play_integrity

    @property
    def fxa(self) -> FxAVerifier:
        return self._fxa

    async def authenticate(self, headers: ProxyHeaders, purpose: str, raw_body: bytes) -> Principal:
        if not headers.authorization:
            raise AuthRejected(MISSING_AUTHORIZATION)
        service_type = str(headers.service_type)
        if headers.use_app_attest:
            return await self._device(self.app_attest, AuthMethod.APP_ATTEST, headers, purpose, raw_body)
        if headers.use_play_integrity:
            return await self._device(self.play_integrity, AuthMethod.PLAY_INTEGRITY, headers, purpose, raw_body)
        method = AuthMethod.FXA
        if service_type in self._dev_types:
            self._check_dev_key(headers)
            method = AuthMethod.DEV
        uid = await self._verify_fxa(bearer_token(headers.authorization))
        return Principal(uid, service_type, purpose, method)

    async def fxa_uid(self, authorization: str) -> str:
        """FxA alone, as the FxA path of `authenticate` verifies it (`POST /privacy-filter`):
        the bare uid, no service type, no device or dev-key headers."""
        if not authorization:
            raise AuthRejected(MISSING_AUTHORIZATION)
        return await self._verify_fxa(bearer_token(authorization))

    async def _device(
        self,
        authenticator: DeviceAuthenticator | None,
        method: AuthMethod,
        headers: ProxyHeaders,
        purpose: str,
        raw_body: bytes,
    ) -> Principal:
        if authenticator is None:
            raise AuthRejected(f"{method.value} authentication is not enabled")
        self._check_dev_key(headers)
        uid = await authenticator.base_identity(headers, raw_body)
        return Principal(uid, str(headers.service_type), purpose, method)

    def _check_dev_key(self, headers: ProxyHeaders) -> None:
        """Dev tiers need the experimentation token on every path (compatibility.md D11)."""
        if headers.service_type not in self._dev_types:
            return
        if headers.dev_authorization is None:
            raise AuthRejected(DEV_HEADER_REQUIRED)
        if not headers.dev_authorization:
            raise AuthRejected(DEV_HEADER_EMPTY)
        presented = headers.dev_authorization.encode("utf-8", errors="replace")
        if not self._dev_token or not hmac.compare_digest(presented, self._dev_token):
            raise AuthRejected(INVALID_DEV)

    async def _verify_fxa(self, token: str) -> str:
        started = time.monotonic()
        try:
            identity = await self._fxa.verify(token)
        except FxAVerificationFailed as exc:
            self._metrics.fxa_latency.labels("error", "unknown").observe(time.monotonic() - started)
            log.info("fxa_verification_failed", reason=str(exc))
            raise AuthRejected(INVALID_FXA) from None
        self._metrics.fxa_latency.labels("success", identity.source).observe(time.monotonic() - started)
        self._metrics.fxa_verifications.labels(identity.source).inc()
        return identity.uid
