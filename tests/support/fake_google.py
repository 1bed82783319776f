"""A loopback stand-in for Google: OAuth2 token endpoint + Play Integrity decode API.

The token endpoint speaks the real service-account protocol (RFC 7523 JWT bearer grant),
so google-auth's own `service_account.Credentials` obtain tokens from it unmodified:
`write_service_account_file` produces a key file whose `token_uri` points here. The decode
endpoint only accepts bearer tokens this fake issued, and answers with whatever verdict a
test registered for the integrity token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from multidict import CIMultiDict, CIMultiDictProxy

JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    path: str
    headers: CIMultiDictProxy[str]
    body: Any


def make_verdict(
    user_id: str,
    *,
    package: str = "org.mozilla.firefox",
    app_verdict: str = "PLAY_RECOGNIZED",
    device_verdicts: Iterable[str] = ("MEETS_DEVICE_INTEGRITY",),
    timestamp_ms: int | None = None,
    request_hash: str | None = None,
    payload_key: str = "tokenPayloadExternal",
) -> dict[str, Any]:
    """A decodeIntegrityToken response shaped like Google's (int64 as a JSON string)."""
    if timestamp_ms is None:
        timestamp_ms = int(time.time() * 1000)
    return {
        payload_key: {
            "requestDetails": {
                "requestPackageName": package,
                "requestHash": request_hash
                if request_hash is not None
                else hashlib.sha256(user_id.encode("utf-8")).hexdigest(),
                "timestampMillis": str(timestamp_ms),
            },
            "appIntegrity": {
                "appRecognitionVerdict": app_verdict,
                "packageName": package,
                "certificateSha256Digest": ["fake-digest"],
                "versionCode": "1",
            },
            "deviceIntegrity": {"deviceRecognitionVerdict": list(device_verdicts)},
            "accountDetails": {"appLicensingVerdict": "LICENSED"},
        }
    }


def _google_error(status: int, google_status: str, message: str) -> web.Response:
    return web.json_response(
        {"error": {"code": status, "message": message, "status": google_status}}, status=status
    )


@dataclass
class FakeGoogle:
    """State and switches of the fake; `make_app()` serves it, `serve()` runs it on loopback."""

    client_email: str = "mlpa-test@fake-project.iam.gserviceaccount.com"
    project_id: str = "fake-project"
    expires_in: int = 3600
    unknown_token_status: int = 400
    fail_with_500: bool = False
    drop_connection: bool = False
    decode_delay_seconds: float = 0.0
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    token_requests: list[RecordedRequest] = field(default_factory=list)
    decode_requests: list[RecordedRequest] = field(default_factory=list)
    issued_tokens: set[str] = field(default_factory=set)
    base_url: str | None = None
    # The service account's key; None makes a new one (a test suite shares one: making a
    # 2048-bit key takes tens of milliseconds of CPU).
    private_key: rsa.RSAPrivateKey | None = None

    def __post_init__(self) -> None:
        if self.private_key is None:
            self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key_id = secrets.token_hex(20)

    @property
    def token_calls(self) -> int:
        return len(self.token_requests)

    # ---------------------------------------------------------------- service account

    def service_account_info(self, base_url: str | None = None) -> dict[str, str]:
        base = base_url or self.base_url
        if base is None:
            raise RuntimeError("the fake's base URL is unknown: pass base_url or start it with serve()")
        return {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": self.private_key_id,
            "private_key": self.private_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode("ascii"),
            "client_email": self.client_email,
            "client_id": "100000000000000000000",
            "token_uri": f"{base.rstrip('/')}/token",
        }

    def write_service_account_file(self, path: str | Path, base_url: str | None = None) -> Path:
        target = Path(path)
        target.write_text(json.dumps(self.service_account_info(base_url)))
        return target

    # ------------------------------------------------------------------------ server

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/token", self._token)
        app.router.add_post("/v1/{package}:decodeIntegrityToken", self._decode)
        return app

    @asynccontextmanager
    async def serve(self, host: str = "127.0.0.1") -> AsyncIterator[str]:
        """Run on an ephemeral loopback port; yields (and records) the base URL."""
        runner = web.AppRunner(self.make_app())
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        port = runner.addresses[0][1]
        self.base_url = f"http://{host}:{port}"
        try:
            yield self.base_url
        finally:
            await runner.cleanup()

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        self.token_requests.append(RecordedRequest(request.path, CIMultiDictProxy(CIMultiDict(request.headers)), dict(form)))
        if form.get("grant_type") != JWT_BEARER_GRANT:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        assertion = form.get("assertion")
        if not isinstance(assertion, str):
            return web.json_response({"error": "invalid_request", "error_description": "no assertion"}, status=400)
        try:
            claims = jwt.decode(
                assertion,
                self.private_key.public_key(),
                algorithms=["RS256"],
                issuer=self.client_email,
                options={"require": ["iss", "aud", "iat", "exp"], "verify_aud": False},
            )
        except jwt.PyJWTError as exc:
            return web.json_response({"error": "invalid_grant", "error_description": str(exc)}, status=400)
        if not str(claims["aud"]).endswith("/token"):
            return web.json_response({"error": "invalid_grant", "error_description": "bad audience"}, status=400)
        access_token = "ya29.fake-" + secrets.token_urlsafe(24)
        self.issued_tokens.add(access_token)
        return web.json_response({"access_token": access_token, "expires_in": self.expires_in, "token_type": "Bearer"})

    async def _decode(self, request: web.Request) -> web.StreamResponse:
        try:
            body: Any = await request.json()
        except ValueError:
            body = None
        self.decode_requests.append(RecordedRequest(request.path, CIMultiDictProxy(CIMultiDict(request.headers)), body))
        if self.drop_connection:
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError()  # nothing more can be said on a dead connection
        if self.decode_delay_seconds:
            await asyncio.sleep(self.decode_delay_seconds)
        if self.fail_with_500:
            return _google_error(500, "INTERNAL", "Internal error encountered.")
        authorization = request.headers.get("Authorization", "")
        if not authorization.startswith("Bearer ") or authorization[len("Bearer ") :] not in self.issued_tokens:
            return _google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        token = body.get("integrity_token") if isinstance(body, dict) else None
        verdict = self.verdicts.get(token) if isinstance(token, str) else None
        if verdict is None:
            if self.unknown_token_status == 403:
                return _google_error(403, "PERMISSION_DENIED", "The caller does not have permission.")
            return _google_error(400, "INVALID_ARGUMENT", "Integrity token cannot be decoded.")
        return web.json_response(verdict)
