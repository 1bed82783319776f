"""Firefox Accounts OAuth token verification, aiohttp-native (compatibility.md D18).

JWT access tokens are verified locally against the FxA JWKS (cached; refetched once when a
token names an unknown `kid`); other tokens go to FxA's `POST /verify`. Successful results
are cached in-process, keyed by a hash of token and scope. No worker threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt
import structlog
from jwt.algorithms import RSAAlgorithm

from ..settings import FxASettings
from ..wire import is_base_identity, is_credential_text

log = structlog.get_logger(__name__)

_MAX_CACHE_ENTRIES = 50_000
# An unknown `kid` refetches the JWKS, but not more often than this: forged kids must
# not turn every request into a JWKS download.
_MIN_JWKS_REFETCH_SECONDS = 5.0


class FxAVerificationFailed(Exception):
    """The token is not valid for the scope (or FxA could not be asked)."""


class FxASignatureInvalid(FxAVerificationFailed):
    """The JWT is not signed by any key FxA publishes."""


@dataclass(frozen=True, slots=True)
class FxAIdentity:
    uid: str
    source: str  # "cached" | "local" | "remote"


def scope_covers(granted: str, requested: str) -> bool:
    """FxA scopes are hierarchical: `profile` implies `profile:uid`."""
    return requested == granted or requested.startswith(granted + ":")


def _looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


class _TTLCache:
    """A bounded dict of verification results with expiry."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._entries: dict[str, tuple[float, str]] = {}

    def get(self, key: str) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, uid = entry
        if expires <= self._clock():
            del self._entries[key]
            return None
        return uid

    def put(self, key: str, uid: str) -> None:
        if self._ttl <= 0:
            return
        if len(self._entries) >= _MAX_CACHE_ENTRIES:
            now = self._clock()
            self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
            if len(self._entries) >= _MAX_CACHE_ENTRIES:
                self._entries.clear()
        self._entries[key] = (self._clock() + self._ttl, uid)


class FxAVerifier:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: FxASettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._settings = settings
        self._clock = clock
        self._verify_url = settings.base_url + "/verify"
        self._jwks_url = settings.base_url + "/jwks"
        self._timeout = aiohttp.ClientTimeout(total=settings.request_timeout_seconds)
        self._cache = _TTLCache(settings.verify_cache_seconds, clock)
        self._keys: dict[str, Any] = {}
        self._keys_fetched_at: float | None = None
        self._jwks_lock = asyncio.Lock()

    @property
    def scopes(self) -> tuple[str, ...]:
        return self._settings.scopes

    async def verify(self, token: str) -> FxAIdentity:
        """Verify for every configured scope at once; the first success wins."""
        scopes = self._settings.scopes
        if len(scopes) == 1:
            return await self.verify_scope(token, scopes[0])
        tasks = [asyncio.ensure_future(self.verify_scope(token, scope)) for scope in scopes]
        try:
            failures = []
            for next_done in asyncio.as_completed(tasks):
                try:
                    return await next_done
                except FxAVerificationFailed as exc:
                    failures.append(exc)
            raise FxAVerificationFailed("; ".join(str(f) for f in failures))
        finally:
            for task in tasks:
                task.cancel()
            # Reap the losers so none is left pending or logs "exception never retrieved".
            await asyncio.gather(*tasks, return_exceptions=True)

    async def verify_scope(self, token: str, scope: str) -> FxAIdentity:
        _require_credential_text(token)
        cache_key = hashlib.sha256(f"{scope}\0{token}".encode()).hexdigest()
        uid = self._cache.get(cache_key)
        if uid is not None:
            return FxAIdentity(uid, "cached")
        if _looks_like_jwt(token):
            identity = await self._verify_locally(token, scope)
        else:
            identity = await self._verify_remotely(token, scope)
        self._cache.put(cache_key, identity.uid)
        return identity

    async def verify_jwt(self, token: str) -> FxAIdentity:
        """Local JWT verification only, against the cached JWKS (no result cache, no
        remote call): the load-test route's check (compatibility.md §1.7, D16)."""
        _require_credential_text(token)
        if not _looks_like_jwt(token):
            raise FxAVerificationFailed("not a JWT access token")
        return await self._verify_locally(token, self._settings.scopes[0])

    # -- local (JWT) ---------------------------------------------------------------------
    async def _verify_locally(self, token: str, scope: str) -> FxAIdentity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise FxAVerificationFailed(f"malformed JWT: {exc}") from None
        if header.get("typ", "").lower() != "at+jwt":
            raise FxAVerificationFailed("JWT is not an access token (typ)")
        kid = header.get("kid")
        key = await self._signing_key(kid)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["RS256"],
                options={"verify_aud": False, "require": ["exp", "sub"]},
            )
        except jwt.InvalidSignatureError:
            raise FxASignatureInvalid("JWT signature does not verify") from None
        except jwt.InvalidTokenError as exc:
            raise FxAVerificationFailed(f"JWT rejected: {type(exc).__name__}") from None
        granted = claims.get("scope", "")
        granted_scopes = granted.split() if isinstance(granted, str) else list(granted or [])
        _require_scope(granted_scopes, scope)
        return FxAIdentity(_require_identifier(str(claims["sub"])), "local")

    async def _signing_key(self, kid: str | None) -> Any:
        age = None if self._keys_fetched_at is None else self._clock() - self._keys_fetched_at
        if age is not None and kid in self._keys and age < self._settings.jwks_cache_seconds:
            return self._keys[kid]
        if age is not None and kid not in self._keys and age < _MIN_JWKS_REFETCH_SECONDS:
            raise FxASignatureInvalid("JWT signed by an unknown key")
        # Unknown kid (a rotation) or stale cache: refetch once, single-flight.
        fetched_before = self._keys_fetched_at
        async with self._jwks_lock:
            if self._keys_fetched_at == fetched_before:
                await self._fetch_jwks()
        if kid not in self._keys:
            raise FxASignatureInvalid("JWT signed by an unknown key")
        return self._keys[kid]

    async def _fetch_jwks(self) -> None:
        try:
            async with self._session.get(self._jwks_url, timeout=self._timeout) as response:
                if response.status != 200:
                    raise FxAVerificationFailed(f"JWKS fetch answered {response.status}")
                document = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("fxa_jwks_unavailable", error=type(exc).__name__)
            raise FxAVerificationFailed("JWKS unavailable") from None
        keys = {}
        for jwk in document.get("keys", []) if isinstance(document, dict) else []:
            if isinstance(jwk, dict) and jwk.get("kty") == "RSA" and "kid" in jwk:
                keys[jwk["kid"]] = RSAAlgorithm.from_jwk(json.dumps(jwk))
        self._keys = keys
        self._keys_fetched_at = self._clock()

    # -- remote (opaque tokens) ------------------------------------------------------------
    async def _verify_remotely(self, token: str, scope: str) -> FxAIdentity:
        try:
            async with self._session.post(self._verify_url, json={"token": token}, timeout=self._timeout) as response:
                payload = await response.json(content_type=None)
                status = response.status
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("fxa_verify_unavailable", error=type(exc).__name__)
            raise FxAVerificationFailed("FxA verify unavailable") from None
        if status != 200 or not isinstance(payload, dict):
            raise FxAVerificationFailed(f"FxA verify answered {status}")
        uid, granted = payload.get("user"), payload.get("scope")
        if not isinstance(uid, str) or not uid or not isinstance(granted, list) or "client_id" not in payload:
            raise FxAVerificationFailed("FxA verify answer incomplete")
        _require_scope([g for g in granted if isinstance(g, str)], scope)
        return FxAIdentity(_require_identifier(uid), "remote")


def _require_credential_text(token: str) -> None:
    # Before any hashing or JWT parsing, which would re-encode the token.
    if not is_credential_text(token):
        raise FxAVerificationFailed("token is not visible ASCII")


def _require_identifier(uid: str) -> str:
    if not is_base_identity(uid):
        raise FxAVerificationFailed("uid is not a valid user id")
    return uid


def _require_scope(granted: list[str], requested: str) -> None:
    if not any(scope_covers(g, requested) for g in granted):
        raise FxAVerificationFailed(f"token lacks scope {requested}")
