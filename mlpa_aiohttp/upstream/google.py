"""Google Play Integrity over HTTP: an OAuth access token and `decodeIntegrityToken`.

google-auth is synchronous (its refresh does blocking HTTP through `requests`), so token
refreshes run in a worker thread; the token is cached until shortly before it expires
and only one refresh runs at a time. The Play Integrity call itself is aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import google.auth
import google.auth.exceptions
import google.auth.transport.requests
from google.auth.credentials import Credentials
from google.oauth2 import service_account

from ..headers import GOOGLE_USER_PROJECT

PLAY_INTEGRITY_SCOPE = "https://www.googleapis.com/auth/playintegrity"
DEFAULT_API_BASE = "https://playintegrity.googleapis.com"
# Refresh this long before Google's stated expiry so a token never expires in flight.
DEFAULT_REFRESH_MARGIN_SECONDS = 300.0
# Credentials that report no expiry are re-asked after this long anyway.
UNKNOWN_EXPIRY_LIFETIME_SECONDS = 300.0


class GoogleCredentialsUnavailable(Exception):
    """No Google access token could be obtained (→ 500 "Failed to fetch access token")."""


class PlayIntegrityHttpError(Exception):
    """Google answered `decodeIntegrityToken` with an HTTP error (→ 401)."""

    def __init__(self, status: int, upstream_message: str) -> None:
        super().__init__(f"Play Integrity API returned HTTP {status}")
        self.status = status
        # Google's own error text; only for MLPA_DEBUG responses and logs.
        self.upstream_message = upstream_message


class PlayIntegrityUnavailable(Exception):
    """Transport failure, timeout or unusable response from Google (→ 502)."""


CredentialSource = Credentials | str | os.PathLike[str] | None


@dataclass(frozen=True, slots=True)
class _CachedToken:
    value: str
    refresh_after: float  # monotonic seconds


class GoogleAccessTokenProvider:
    """Hands out a cached Google OAuth access token for the Play Integrity scope.

    `credentials`: None → Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS,
    gcloud user credentials, GKE workload identity / metadata server); a path → that
    service-account JSON file; a Credentials object → used as is (tests, special setups).
    """

    def __init__(
        self,
        credentials: CredentialSource = None,
        *,
        scopes: Sequence[str] = (PLAY_INTEGRITY_SCOPE,),
        refresh_margin_seconds: float = DEFAULT_REFRESH_MARGIN_SECONDS,
    ) -> None:
        self._source = credentials
        self._scopes = list(scopes)
        self._refresh_margin = refresh_margin_seconds
        self._credentials: Credentials | None = credentials if isinstance(credentials, Credentials) else None
        self._cached: _CachedToken | None = None
        self._refresh_lock = asyncio.Lock()
        self._http: google.auth.transport.requests.Request | None = None

    async def get_token(self) -> str:
        cached = self._cached
        if cached is not None and time.monotonic() < cached.refresh_after:
            return cached.value
        async with self._refresh_lock:
            # Whoever held the lock before us may already have refreshed.
            cached = self._cached
            if cached is not None and time.monotonic() < cached.refresh_after:
                return cached.value
            self._cached = await asyncio.to_thread(self._refresh_blocking)
            return self._cached.value

    def invalidate(self) -> None:
        """Forget the cached token (e.g. after Google rejected it as unauthenticated)."""
        self._cached = None

    def close(self) -> None:
        if self._http is not None:
            self._http.session.close()
            self._http = None

    def _refresh_blocking(self) -> _CachedToken:
        try:
            credentials = self._credentials or self._load_credentials()
            self._credentials = credentials
            if self._http is None:
                self._http = google.auth.transport.requests.Request()
            credentials.refresh(self._http)
        except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as exc:
            raise GoogleCredentialsUnavailable(type(exc).__name__) from exc
        token = credentials.token
        if not isinstance(token, str) or not token:
            raise GoogleCredentialsUnavailable("credentials produced no token")
        return _CachedToken(value=token, refresh_after=time.monotonic() + self._lifetime(credentials.expiry))

    def _load_credentials(self) -> Credentials:
        if self._source is None:
            credentials, _project = google.auth.default(scopes=self._scopes)
            return credentials
        assert not isinstance(self._source, Credentials)
        return service_account.Credentials.from_service_account_file(os.fspath(self._source), scopes=self._scopes)

    def _lifetime(self, expiry: datetime | None) -> float:
        if expiry is None:
            return UNKNOWN_EXPIRY_LIFETIME_SECONDS
        # google-auth keeps expiry as a naive UTC datetime.
        aware = expiry.replace(tzinfo=UTC) if expiry.tzinfo is None else expiry
        remaining = (aware - datetime.now(UTC)).total_seconds()
        return max(0.0, remaining - self._refresh_margin)


def decode_integrity_token_url(api_base: str, package_name: str) -> str:
    return f"{api_base.rstrip('/')}/v1/{quote(package_name, safe='')}:decodeIntegrityToken"


async def decode_integrity_token(
    session: aiohttp.ClientSession,
    *,
    integrity_token: str,
    package_name: str,
    access_token: str,
    api_base: str = DEFAULT_API_BASE,
    quota_project: str | None = None,
    timeout_seconds: float = 30.0,
) -> dict[str, Any]:
    """Ask Google to decode `integrity_token`; return its JSON response (the verdict)."""
    headers: dict[str, str] = {aiohttp.hdrs.AUTHORIZATION: f"Bearer {access_token}"}
    if quota_project:
        headers[GOOGLE_USER_PROJECT] = quota_project
    try:
        async with session.post(
            decode_integrity_token_url(api_base, package_name),
            json={"integrity_token": integrity_token},
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_seconds),
        ) as response:
            if response.status >= 400:
                raise PlayIntegrityHttpError(response.status, _error_message(await response.text()))
            body = await response.json(content_type=None)
    except PlayIntegrityHttpError:
        raise
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise PlayIntegrityUnavailable(type(exc).__name__) from exc
    if not isinstance(body, dict):
        raise PlayIntegrityUnavailable("response is not a JSON object")
    return body


def _error_message(text: str) -> str:
    """Google's `{"error": {"message": ...}}` text when present, else the raw body (bounded)."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        message = parsed["error"].get("message")
        if isinstance(message, str):
            return message[:500]
    return text[:500]
